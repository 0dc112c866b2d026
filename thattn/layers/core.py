"""The attention core, from Q, K and V to the context O, and its four paths.

Multi-head and talking-heads attention (`ProjectedAttention.attend`) share
this core (per example; letters as in `thattn.core.dims`):

    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = mix_logits(J)                 # P_l, + dynamic terms
    W[h, n, m]     = softmax(L + B, masked, reduced_dim=m)        # float32
    U[h_v, n, m]   = dropout(mix_weights(W))       # P_w, + dynamic terms
    O[n, h_v, d_v] = einsum(U[h_v, n, m], V[m, h_v, d_v])

Four paths compute it, with equal results to float32 rounding: all
queries at once or query chunk by query chunk (`thattn.layers.chunked`),
each with TensorFlow ops or the fused CPU op from J to U
(`thattn.kernels.talking_heads_softmax`):

| path            | why                                                    |
|-----------------|--------------------------------------------------------|
| chunked, kernel | both of the next two: per chunk, the op takes J to U   |
| chunked, TF ops | scores in memory: O(c * m) per chunk, not O(n * m) per |
|                 | example                                                |
| plain, kernel   | one CPU op from J to U: faster, and L and W are never  |
|                 | stored; with dynamic projections too                   |
| plain, TF ops   | the reference: any feature                             |

`thattn.kernels.dispatch.choose` picks a call's path (its `Choice`), with
the Keras 3 layers' kernels, by the rules its docstring gives.
"""

import tensorflow as tf

from thattn.core import attention_spec
from thattn.kernels import dispatch
from thattn.kernels import talking_heads_softmax
from thattn.layers import attention_ops
from thattn.layers import chunked


def attention_core(choice, query, key, value, *, projections, mask,
                   causal_offset, bias, chunk_size, mix_logits, mix_weights,
                   dropout, dynamic=None):
  """O[b, n, h_v, d_v], and U[b, h_v, n, m] or None, by the given path.

  Args:
    choice: a `thattn.kernels.dispatch.Choice` (CPU_OP or OPS, chunked
      or not).
    query: Q[b, n, h_k, d_k].
    key: K[b, m, h_k, d_k].
    value: V[b, m, h_v, d_v].
    projections: (P_l, P_w), each a variable, or None for the identity.
    mask: boolean, broadcastable to [b, 1, n, m], or None; True means "may
      attend". Without the causal part, which `causal_offset` gives.
    causal_offset: None, or the memory position of the first query.
    bias: B, broadcastable to [b, h, n, m], or None.
    chunk_size: c, for the chunked paths.
    mix_logits: J -> L with every term the layer has; the plain TF-ops
      path calls it.
    mix_weights: W -> U, likewise.
    dropout: U -> dropout(U); the plain paths call it.
    dynamic: {name: R} of the layer's dynamic projections (R_Xl[b, n, h_k,
      h], ...; see `talking_heads_softmax`), for the kernel; the TF-ops path
      gets them through mix_logits and mix_weights.

  Returns:
    (O, U); U is None on the chunked paths, which never hold it whole.
  """
  fused = choice.kernel == dispatch.CPU_OP
  if choice.chunked:
    # The chunked core's custom gradient takes P_l and P_w as inputs and
    # returns their gradients, so it gets tensors: a variable read inside a
    # custom gradient would need its gradient returned separately.
    pre, post = [None if p is None else tf.identity(p) for p in projections]
    context = chunked.attention_core(
        query, key, value, pre_softmax=pre, post_softmax=post, mask=mask,
        causal_offset=causal_offset, bias=bias, chunk_size=chunk_size,
        fused=fused, dynamic=dynamic)
    return context, None
  dot_products = tf.einsum(attention_spec.DOT_PRODUCT, query, key)
  shape = tf.shape(dot_products)
  mask = attention_ops.full_mask(mask, causal_offset, shape[2], shape[3])
  if fused:
    value_weights = talking_heads_softmax.talking_heads_softmax(
        dot_products, *projections, mask, bias, dynamic=dynamic)
  else:
    weights = attention_ops.masked_softmax(mix_logits(dot_products), mask,
                                           bias)
    # The softmax runs in float32; V has the layer's compute dtype.
    value_weights = mix_weights(tf.cast(weights, value.dtype))
  context = tf.einsum(attention_spec.WEIGHTED_VALUES, dropout(value_weights),
                      value)
  return context, value_weights
