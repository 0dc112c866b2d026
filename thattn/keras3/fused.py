"""thattn's fused CPU kernels under the Keras 3 layers (TensorFlow and JAX).

The Keras 3 talking-heads layer computes J -> L -> W -> U with one fused
kernel that keeps neither L nor W, where one applies:
- TensorFlow backend: `thattn.kernels.talking_heads_softmax`, the same op,
  with the same rules, as `thattn.layers` (float32 / bfloat16 / float16 on
  CPU, not under XLA, not grouped heads together with dynamic projections);
- JAX backend: `thattn.keras3.jax_kernel`, the same computation as XLA FFI
  custom calls on CPU, for dense P_l and P_w, an optional mask, float32 (no
  bias, no dynamic projections, no head groups).
Elsewhere (PyTorch; JAX on GPU; the cases above excluded) the core stays in
`keras.ops`. Each kernel is imported only here and only on its backend, so
the layers never need TensorFlow elsewhere.
"""

import keras


def obstacle(layer, dots, bias=None, dynamic=None):
  """Why no kernel can compute this call of `layer`, or None."""
  if keras.backend.backend() == "jax":
    from thattn.keras3 import jax_kernel  # pylint: disable=g-import-not-at-top
    return jax_kernel.unsupported_reason(dots, *_projections(layer), bias,
                                         dynamic)
  if keras.backend.backend() != "tensorflow":
    return (f"the fused kernels run on the TensorFlow and JAX backends and "
            f"the Keras backend is {keras.backend.backend()}")
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
  reason = obstacle(layer, dots, bias, dynamic)
  if reason is not None:
    if layer.fused_kernel:
      raise ValueError(f"{layer.name}: fused_kernel=True, but {reason}. "
                       "Pass fused_kernel=None to use keras.ops instead.")
    return None
  if keras.backend.backend() == "jax":
    from thattn.keras3 import jax_kernel  # pylint: disable=g-import-not-at-top
    return jax_kernel.talking_heads_softmax(dots, *_projections(layer), mask)
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.talking_heads_softmax(
      dots, *_projections(layer), mask=mask, bias=bias,
      dynamic=dynamic or None)
