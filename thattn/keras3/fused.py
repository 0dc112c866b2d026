"""thattn's own kernels under the Keras 3 layers, run where
`thattn.kernels.dispatch` chose them (which says where each applies).

- `value_weights`: U from J by one fused softmax that keeps neither L nor
  W: on TensorFlow `thattn.kernels.talking_heads_softmax`, the op
  `thattn.layers` runs too (dispatch.CPU_OP); on JAX the same computation
  as XLA FFI custom calls on CPU, `thattn.kernels.jax_kernel`
  (dispatch.XLA_FFI).
- `pallas_context`: the whole core O = attend(Q, K, V) tile by tile
  (FlashAttention's memory), `thattn.kernels.pallas_kernel` (dispatch.
  PALLAS), on a GPU or TPU, or in interpret mode on any platform.

Each kernel is imported only here and only on its backend, so the layers
never need TensorFlow elsewhere.
"""

import keras

from thattn.kernels import dispatch


def projections(layer):
  """(P_l, P_w) of a talking-heads layer as the kernels take them: the
  variables' values, None for the identity."""
  return tuple(None if variable is None else variable.value for variable in
               (layer._pre_softmax_projection,  # pylint: disable=protected-access
                layer._post_softmax_projection))  # pylint: disable=protected-access


def value_weights(kernel, dots, static_projections, mask, bias, dynamic):
  """U[b, h_v, n, m] from J[b, h_k, n, m] by `kernel` (dispatch.XLA_FFI
  or CPU_OP), `static_projections` being (P_l, P_w) and `mask` the whole
  one (boolean [b or 1, 1, n or 1, m], or None)."""
  if kernel == dispatch.XLA_FFI:
    from thattn.kernels import jax_kernel  # pylint: disable=g-import-not-at-top
    return jax_kernel.talking_heads_softmax(dots, *static_projections, mask)
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.talking_heads_softmax(
      dots, *static_projections, mask=mask, bias=bias,
      dynamic=dynamic or None)


def pallas_context(query_state, memory_state, static_projections, mask,
                   bias, causal_offset):
  """O[b, n, h_v, d_v] from the Pallas kernel (dispatch.PALLAS).

  `mask` is the layer's non-causal mask ([b or 1, 1, n or 1, m] boolean, or
  None); causal masking is `causal_offset` (None: none, else a static
  int).
  """
  from thattn.kernels import pallas_kernel  # pylint: disable=g-import-not-at-top
  query, key = query_state["query"], memory_state["key"]
  if mask is not None:
    length, memory = query.shape[1], key.shape[1]
    if mask.shape[2] == 1 and mask.shape[3] == memory:
      mask = mask[:, 0, 0, :]  # a key mask [b or 1, m]: no [n, m] tile
    else:
      mask = keras.ops.broadcast_to(mask[:, 0],
                                    (mask.shape[0], length, memory))
  return pallas_kernel.talking_heads_attention(
      query, key, memory_state["value"], *static_projections, mask=mask,
      bias=bias, causal=causal_offset is not None,
      causal_offset=causal_offset or 0,
      interpret=dispatch.pallas_mode() == "interpret")
