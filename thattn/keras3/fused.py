"""thattn's fused CPU kernel under the Keras 3 layers, TensorFlow backend.

On the TensorFlow backend the Keras 3 talking-heads layer computes
J -> L -> W -> U with `thattn.kernels.talking_heads_softmax`, one fused op
that keeps neither L nor W (the same op, with the same rules, as
`thattn.layers`): float32 / bfloat16 / float16 on CPU, not under XLA, not
grouped heads together with dynamic projections. On JAX and PyTorch the
core stays in `keras.ops` (XLA and torch fuse what they can). The kernel is
imported only here and only on the TensorFlow backend, so the layers never
need TensorFlow elsewhere.
"""

import keras


def obstacle(layer, dots):
  """Why the kernel cannot compute this call of `layer`, or None."""
  if keras.backend.backend() != "tensorflow":
    return (f"the fused kernel is a TensorFlow op and the Keras backend is "
            f"{keras.backend.backend()}")
  if layer.dynamic_projections and layer.num_head_groups != 1:
    return "the kernel has no grouped dynamic projections"
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.unsupported_reason(dots,
                                                  *_projections(layer))


def _projections(layer):
  return tuple(None if variable is None else variable.value for variable in
               (layer._pre_softmax_projection,  # pylint: disable=protected-access
                layer._post_softmax_projection))  # pylint: disable=protected-access


def value_weights(layer, dots, mask, bias, dynamic):
  """U[b, h_v, n, m] through the kernel, or None to use keras.ops.

  `layer.fused_kernel` decides as in thattn.layers: None uses the kernel
  wherever it applies, False never, True always (a ValueError says why it
  cannot).
  """
  if layer.fused_kernel is False:
    return None
  reason = obstacle(layer, dots)
  if reason is not None:
    if layer.fused_kernel:
      raise ValueError(f"{layer.name}: fused_kernel=True, but {reason}. "
                       "Pass fused_kernel=None to use keras.ops instead.")
    return None
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.talking_heads_softmax(
      dots, *_projections(layer), mask=mask, bias=bias,
      dynamic=dynamic or None)
