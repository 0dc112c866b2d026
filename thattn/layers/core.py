"""The attention core, from Q, K and V to the context O, and its four paths.

Multi-head and talking-heads attention (`ProjectedAttention.attend`) share
this core (per example; letters as in `thattn.core.dims`):

    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = mix_logits(J)                 # P_l, + dynamic terms
    W[h, n, m]     = softmax(L + B, masked, reduced_dim=m)        # float32
    U[h_v, n, m]   = dropout(mix_weights(W))       # P_w, + dynamic terms
    O[n, h_v, d_v] = einsum(U[h_v, n, m], V[m, h_v, d_v])

Four paths compute it, with equal results to float32 rounding.
`choose_path` is the one place that picks the path of a call:

| path            | runs when                 | why                            |
|-----------------|---------------------------|--------------------------------|
| chunked, kernel | the chunked core and the  | both of the next two: per      |
|                 | kernel both apply         | chunk, the kernel takes J to U |
| chunked, TF ops | the chunked core applies, | scores in memory: O(c * m)     |
|                 | the kernel does not       | per chunk, not O(n * m) per    |
|                 | (no dynamic projections)  | example                        |
| plain, kernel   | the kernel applies, the   | one CPU op from J to U:        |
|                 | chunked core does not     | faster, and L and W are        |
|                 |                           | never stored; with dynamic     |
|                 |                           | projections too                |
| plain, TF ops   | neither applies           | the reference: any feature     |

The chunked core (`thattn.layers.chunked`) applies when all of these hold:
- `query_chunk_size` is set;
- the caller does not ask for the scores U, which it never holds whole;
- the layer has no dynamic projections, or the kernel applies: the
  chunked TF-ops core mixes heads with P_l, P_w only, while the kernel
  takes each chunk's R_Xl, R_Xw rows and the example's R_Ml, R_Mw;
- attention dropout cannot run (dropout_rate 0, or training False or
  None): its random mask would have to be regenerated identically when the
  backward pass recomputes a chunk.

The fused kernel (`thattn.kernels.talking_heads_softmax`) applies unless
`fused_kernel=False` (multi-head attention's setting: it has no heads
mixing to fuse) or one of these holds, checked in this order; with
`fused_kernel=True` the first that holds is the reason of a ValueError:
- head groups with dynamic projections: the kernel's dynamic terms are
  dense (head groups alone it mixes group by group);
- `talking_heads_softmax.unsupported_reason`: scores not float32,
  bfloat16 or float16, SavedModel tracing, XLA, DTensor, a visible GPU, or
  the kernel cannot be built.
"""

import dataclasses

import tensorflow as tf

from thattn.kernels import talking_heads_softmax
from thattn.layers import attention_ops
from thattn.layers import chunked


@dataclasses.dataclass(frozen=True)
class Path:
  """How one call computes the core; see the module docstring."""
  chunked: bool  # thattn.layers.chunked, rather than all queries at once
  fused: bool  # the fused kernel from J to U, rather than TensorFlow ops


def choose_path(*, chunk_size, return_scores, dropout_rate, training,
                fused_kernel, dynamic_projections, head_groups, scores_like,
                projections, owner):
  """The `Path` of one call, by the rules of the module docstring.

  Args:
    chunk_size: the layer's query_chunk_size; None never chunks.
    return_scores: whether the caller asks for U.
    dropout_rate: the layer's attention dropout rate.
    training: the call's `training` argument.
    fused_kernel: None (the kernel wherever it applies), True (always; a
      ValueError says why when it cannot) or False (never).
    dynamic_projections: the layer's dynamic projection names, or ().
    head_groups: G, the head groups of grouped talking heads.
    scores_like: a tensor of J's dtype, e.g. Q.
    projections: (P_l, P_w) as the layer holds them, variables or None.
    owner: the layer's name, for the error message.

  Returns:
    A `Path`.
  """
  fuse = _kernel_applies(fused_kernel, dynamic_projections, head_groups,
                         scores_like, projections, owner)
  chunk = _chunked_core_applies(chunk_size, return_scores,
                                bool(dynamic_projections) and not fuse,
                                dropout_rate, training)
  return Path(chunked=chunk, fused=fuse)


def _chunked_core_applies(chunk_size, return_scores, unfused_dynamic,
                          dropout_rate, training):
  if not chunk_size or return_scores or unfused_dynamic:
    return False
  # None is Keras's "not training"; a tensor might be True at run time.
  return dropout_rate == 0 or training is False or training is None


def _kernel_applies(fused_kernel, dynamic_projections, head_groups,
                    scores_like, projections, owner):
  if fused_kernel is False:
    return False
  reason = _kernel_obstacle(dynamic_projections, head_groups, scores_like,
                            projections)
  if reason is not None and fused_kernel:
    raise ValueError(f"{owner}: fused_kernel=True, but {reason}. Pass "
                     f"fused_kernel=None to use TensorFlow ops instead.")
  return reason is None


def _kernel_obstacle(dynamic_projections, head_groups, scores_like,
                     projections):
  """Why the fused kernel cannot compute this call, or None."""
  if dynamic_projections and head_groups != 1:
    return "the kernel has no grouped dynamic projections"
  return talking_heads_softmax.unsupported_reason(scores_like, *projections)


def attention_core(path, query, key, value, *, projections, mask,
                   causal_offset, bias, chunk_size, mix_logits, mix_weights,
                   dropout, dynamic=None):
  """O[b, n, h_v, d_v], and U[b, h_v, n, m] or None, by the given path.

  Args:
    path: a `Path` from `choose_path`.
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
  if path.chunked:
    # The chunked core's custom gradient takes P_l and P_w as inputs and
    # returns their gradients, so it gets tensors: a variable read inside a
    # custom gradient would need its gradient returned separately.
    pre, post = [None if p is None else tf.identity(p) for p in projections]
    context = chunked.attention_core(
        query, key, value, pre_softmax=pre, post_softmax=post, mask=mask,
        causal_offset=causal_offset, bias=bias, chunk_size=chunk_size,
        fused=path.fused, dynamic=dynamic)
    return context, None
  dot_products = tf.einsum(attention_ops.DOT_PRODUCT, query, key)
  shape = tf.shape(dot_products)
  mask = attention_ops.full_mask(mask, causal_offset, shape[2], shape[3])
  if path.fused:
    value_weights = talking_heads_softmax.talking_heads_softmax(
        dot_products, *projections, mask, bias, dynamic=dynamic)
  else:
    weights = attention_ops.masked_softmax(mix_logits(dot_products), mask,
                                           bias)
    # The softmax runs in float32; V has the layer's compute dtype.
    value_weights = mix_weights(tf.cast(weights, value.dtype))
  context = tf.einsum(attention_ops.WEIGHTED_VALUES, dropout(value_weights),
                      value)
  return context, value_weights
