"""thattn's fused CPU kernels under the Keras 3 layers (TensorFlow and JAX).

The Keras 3 talking-heads layer computes J -> L -> W -> U with one fused
kernel that keeps neither L nor W, where one applies:
- TensorFlow backend: `thattn.kernels.talking_heads_softmax`, the same op,
  with the same rules, as `thattn.layers` (float32 / bfloat16 / float16 on
  CPU, not under XLA, not grouped heads together with dynamic projections);
- JAX backend: `thattn.kernels.jax_kernel`, the same computation as XLA FFI
  custom calls on CPU, for dense P_l and P_w, an optional mask, float32 (no
  bias, no dynamic projections, no head groups).
- JAX on a GPU or TPU (by default where `thattn.kernels.kernel_choice`'s
  measurements found it faster than keras.ops, or keras.ops would not
  fit), or anywhere with THATTN_PALLAS=interpret:
  `thattn.kernels.pallas_kernel`, the Pallas kernel, which goes further and
  computes the whole core O = attend(Q, K, V) tile by tile (FlashAttention's
  memory), for dense P_l and/or P_w, masks, causal masking and a position
  bias, in float32, bfloat16 and float16 (`pallas_obstacle` names the rest).
Elsewhere (PyTorch; the cases above excluded) the core stays in
`keras.ops`. Each kernel is imported only here and only on its backend, so
the layers never need TensorFlow elsewhere.
"""

import os

import keras


def obstacle(layer, dots, bias=None, dynamic=None):
  """Why no kernel can compute this call of `layer`, or None."""
  if keras.backend.backend() == "jax":
    from thattn.kernels import jax_kernel  # pylint: disable=g-import-not-at-top
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
  if reason is None and mask is not None and mask.shape[1] != 1:
    reason = ("the kernels take one mask for all heads, and this "
              f"attention_mask is per head (shape {tuple(mask.shape)})")
  if reason is not None:
    if layer.fused_kernel:
      switch = getattr(layer, "kernel_switch", "fused_kernel")
      raise ValueError(f"{layer.name}: {switch}=True, but {reason}. "
                       f"Pass {switch}=None to use keras.ops instead.")
    return None
  if keras.backend.backend() == "jax":
    from thattn.kernels import jax_kernel  # pylint: disable=g-import-not-at-top
    return jax_kernel.talking_heads_softmax(dots, *_projections(layer), mask)
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.talking_heads_softmax(
      dots, *_projections(layer), mask=mask, bias=bias,
      dynamic=dynamic or None)


# ---- the Pallas kernel (JAX on accelerators; interpret mode on CPU) --------

PALLAS_VARIABLE = "THATTN_PALLAS"
_PALLAS_SETTINGS = ("", "interpret", "off")


def pallas_mode():
  """How the Pallas kernel would run here: "gpu", "tpu", "interpret", or
  None where it does not (not JAX; JAX on CPU without THATTN_PALLAS=
  interpret; THATTN_PALLAS=off)."""
  setting = os.environ.get(PALLAS_VARIABLE, "")
  if setting not in _PALLAS_SETTINGS:
    raise ValueError(
        f"{PALLAS_VARIABLE}={setting!r}: expected unset, 'interpret' (run "
        "the Pallas kernel in interpret mode, on any platform) or 'off' "
        "(never run it).")
  if keras.backend.backend() != "jax" or setting == "off":
    return None
  if setting == "interpret":
    return "interpret"
  import jax  # pylint: disable=g-import-not-at-top
  platform = jax.default_backend()
  return platform if platform in ("gpu", "tpu") else None


def pallas_obstacle(layer, query_state, memory_state, mask, bias,
                    causal_offset, training, need_scores):
  """Why the Pallas kernel cannot compute this call of `layer`, or None."""
  if layer.dynamic_projections:
    return "the Pallas kernel has no dynamic projections"
  if layer.num_head_groups != 1:
    return "the Pallas kernel has no head groups"
  if need_scores:
    return ("return_attention_scores asks for the [b, h_v, n, m] weights, "
            "which the Pallas kernel never forms")
  if layer.dropout and training:
    return "the Pallas kernel has no attention dropout (training with "\
           f"dropout={layer.dropout})"
  if causal_offset is not None and not isinstance(causal_offset, int):
    return ("the Pallas kernel needs a static causal offset, and decoding "
            "steps pass a traced one")
  if keras.distribution.distribution() is not None:
    return ("a keras.distribution is active: P_l and P_w mix every head, so "
            "the kernel cannot run per shard of split heads, and on whole "
            "arrays it would gather them; keras.ops lets XLA partition the "
            "computation")
  dtype = keras.backend.standardize_dtype(query_state["query"].dtype)
  if dtype not in ("float32", "bfloat16", "float16"):
    return f"the Pallas kernel computes float32, bfloat16 or float16, not "\
           f"{dtype}"
  if mask is not None and (len(mask.shape) != 4 or mask.shape[1] != 1):
    return ("the Pallas kernel takes one mask for all heads, got a mask of "
            f"shape {tuple(mask.shape)}")
  if bias is not None and len(bias.shape) != 4:
    return (f"the Pallas kernel takes a position bias [b or 1, h, n, m], got "
            f"shape {tuple(bias.shape)}")
  return None


def pallas_context(layer, query_state, memory_state, mask, bias,
                   causal_offset, training, need_scores):
  """O[b, n, h_v, d_v] from the Pallas kernel, or None to use keras.ops.

  `mask` is the layer's non-causal mask ([b or 1, 1, n or 1, m] boolean, or
  None); causal masking is `causal_offset` (None: none). `layer.
  fused_kernel`: None uses the kernel where it applies and
  `thattn.kernels.kernel_choice` finds it the faster path (or keras.ops
  would not fit); under THATTN_PALLAS=interpret wherever it applies; False
  never; True always (ValueError naming why not).
  """
  mode = pallas_mode()
  if mode is None or layer.fused_kernel is False:
    return None
  reason = pallas_obstacle(layer, query_state, memory_state, mask, bias,
                           causal_offset, training, need_scores)
  if reason is not None:
    # Interpret mode refuses as an accelerator would, so CI sees the
    # refusals a GPU user gets.
    if layer.fused_kernel:
      switch = getattr(layer, "kernel_switch", "fused_kernel")
      raise ValueError(f"{layer.name}: {switch}=True, but {reason}. "
                       f"Pass {switch}=None to use keras.ops instead.")
    return None
  if layer.fused_kernel is None and mode != "interpret":
    from thattn.kernels import kernel_choice  # pylint: disable=g-import-not-at-top
    query, key = query_state["query"], memory_state["key"]
    if not kernel_choice.use_kernel_by_default(
        query.shape[0], layer.num_heads, query.shape[1], key.shape[1]):
      return None  # keras.ops measured faster here, and it fits
  from thattn.kernels import pallas_kernel  # pylint: disable=g-import-not-at-top
  if mask is not None:
    length = query_state["query"].shape[1]
    memory = memory_state["key"].shape[1]
    if mask.shape[2] == 1 and mask.shape[3] == memory:
      mask = mask[:, 0, 0, :]  # a key mask [b or 1, m]: no [n, m] tile
    else:
      mask = keras.ops.broadcast_to(mask[:, 0],
                                    (mask.shape[0], length, memory))
  return pallas_kernel.talking_heads_attention(
      query_state["query"], memory_state["key"], memory_state["value"],
      *_projections(layer), mask=mask, bias=bias,
      causal=causal_offset is not None, causal_offset=causal_offset or 0,
      interpret=mode == "interpret")
