"""Pure tensor functions shared by the attention layers.

Layers own weights; the math that does not need weights lives here, so it can
be tested and reused without a layer. Letters follow `thattn.core.dims`; score
tensors are laid out `[b, heads, n, m]`.
"""

import tensorflow as tf

from thattn.core import attention_spec

QUERY_DYNAMIC_LOGITS_MIX = attention_spec.DYNAMIC_MIXES["x2l"]
MEMORY_DYNAMIC_LOGITS_MIX = attention_spec.DYNAMIC_MIXES["m2l"]
QUERY_DYNAMIC_WEIGHTS_MIX = attention_spec.DYNAMIC_MIXES["x2w"]
MEMORY_DYNAMIC_WEIGHTS_MIX = attention_spec.DYNAMIC_MIXES["m2w"]
GROUPED_QUERY_DYNAMIC_LOGITS_MIX = attention_spec.GROUPED_DYNAMIC_MIXES["x2l"]
GROUPED_MEMORY_DYNAMIC_LOGITS_MIX = attention_spec.GROUPED_DYNAMIC_MIXES["m2l"]
GROUPED_QUERY_DYNAMIC_WEIGHTS_MIX = attention_spec.GROUPED_DYNAMIC_MIXES["x2w"]
GROUPED_MEMORY_DYNAMIC_WEIGHTS_MIX = (
    attention_spec.GROUPED_DYNAMIC_MIXES["m2w"])


def mix_heads(scores, projection):
  """Projects a score tensor across its heads dimension.

  Computes `out[b, g, n, m] = einsum(scores[b, f, n, m], projection[f, g])`,
  which is the paper's `L = einsum(J, P_l)` (f=h_k, g=h) and
  `U = einsum(W, P_w)` (f=h, g=h_v).

  Written as one broadcast matmul of `projection^T[g, f]` against
  `scores[b, f, n*m]` instead of an einsum: the einsum lowers to transposes
  of the large `[b, f, n, m]` tensor, which dominate the step time on CPU
  (see benchmarks/RESULTS.md: the einsum form spends its time in transposes).

  A rank-3 `projection[G, f/G, g/G]` holds the G diagonal blocks of a
  block-diagonal `[f, g]` projection (grouped talking heads): heads mix only
  within their group, group-major (block k maps input heads
  [k*f/G, (k+1)*f/G) to output heads [k*g/G, (k+1)*g/G)). That is a batched
  matmul of `[G, g/G, f/G]` against `scores[b, G, f/G, n*m]`, costing 1/G of
  the dense one and never forming the zero blocks.

  Args:
    scores: `[b, f, n, m]` tensor.
    projection: `[f, g]` tensor, or `[G, f/G, g/G]` blocks; same dtype.

  Returns:
    `[b, g, n, m]` tensor.
  """
  shape = tf.shape(scores)
  batch, length, memory = shape[0], shape[2], shape[3]
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = _static_shape(projection)
    flat = tf.reshape(scores, [batch, groups, heads_in, length * memory])
    mixed = tf.linalg.matmul(projection, flat, transpose_a=True)
    return tf.reshape(mixed, [batch, groups * heads_out, length, memory])
  flat = tf.reshape(scores, [batch, shape[1], length * memory])
  mixed = tf.linalg.matmul(projection, flat, transpose_a=True)
  return tf.reshape(mixed, [batch, tf.shape(projection)[1], length, memory])


def dynamic_mix(name, scores, projection, groups):
  """scores[b, f, n, m] mixed by the dynamic projection `name`'s
  R[b, n or m, ...] (`DYNAMIC_MIXES`; G = `groups` > 1: its group-major
  blocks, `GROUPED_DYNAMIC_MIXES`)."""
  if groups == 1:
    return tf.einsum(attention_spec.DYNAMIC_MIXES[name], scores, projection)
  # [b, f, n, m] -> [b, G, f/G, n, m]: the heads are group-major.
  shape = tf.shape(scores)
  grouped = tf.reshape(scores, [shape[0], groups, scores.shape[1] // groups,
                                shape[2], shape[3]])
  mixed = tf.einsum(attention_spec.GROUPED_DYNAMIC_MIXES[name], grouped,
                    projection)
  return tf.reshape(mixed, [shape[0], groups * projection.shape[-1],
                            shape[2], shape[3]])


def _static_shape(tensor):
  """The shape as Python ints where known, else scalar tensors."""
  dynamic = tf.shape(tensor)
  return [dynamic[i] if size is None else size
          for i, size in enumerate(tensor.shape.as_list())]


def masked_softmax(logits, mask=None, bias=None):
  """Softmax over memory positions, in float32, with a boolean mask.

  Args:
    logits: `L[b, h, n, m]` in any float dtype.
    mask: optional boolean tensor broadcastable to `[b, 1, n, m]`; True means
      "may attend".
    bias: optional tensor broadcastable to `[b, h, n, m]`, added before the
      mask (e.g. T5's relative position bias).

  Returns:
    `W[b, h, n, m]` in float32. Rows whose positions are all masked are
    uniform, never NaN.
  """
  logits = tf.cast(logits, tf.float32)
  if bias is not None:
    logits += tf.cast(bias, tf.float32)
  if mask is not None:
    logits = tf.where(mask, logits, attention_spec.MASKED_LOGIT)
  return tf.nn.softmax(logits, axis=-1)


def causal_mask(query_length, memory_length, query_offset=0):
  """Boolean `[n, m]` mask: query i may attend memory j when j <= i + offset.

  `query_offset` is the position of the first query within the memory, as in
  incremental decoding where query step t sits at memory position t.
  """
  # tf.expand_dims rather than [:, tf.newaxis] throughout thattn: DTensor in
  # TF 2.21 cannot lay out the strided slice that tf.newaxis becomes.
  query_positions = tf.expand_dims(tf.range(query_length) + query_offset, 1)
  memory_positions = tf.expand_dims(tf.range(memory_length), 0)
  return memory_positions <= query_positions


def window_mask(query_length, memory_length, query_offset, window):
  """Boolean [1, 1, n, m]: query i may attend memory j when abs(i + offset
  - j) < window (Keras 3's `sliding_window`: with the causal mask, the
  last `window` keys, the query's own included); None without a window."""
  if window is None:
    return None
  query_positions = tf.expand_dims(tf.range(query_length) + query_offset, 1)
  memory_positions = tf.expand_dims(tf.range(memory_length), 0)
  band = tf.abs(query_positions - memory_positions) < window
  return tf.reshape(band, [1, 1, query_length, memory_length])


def full_mask(mask, causal_offset, query_length, memory_length):
  """`mask` AND the causal mask: boolean [b or 1, 1, n or 1, m], or None.

  `mask` is None or broadcastable to [b, 1, n, m]; `causal_offset` is None
  (no causal mask) or the memory position of the first query.
  """
  if causal_offset is None:
    return mask
  causal = tf.reshape(causal_mask(query_length, memory_length, causal_offset),
                      [1, 1, query_length, memory_length])
  return combine_masks(mask, causal)


def combine_masks(*masks):
  """Logical AND of the masks that are not None; None if all are None."""
  return attention_spec.combine_masks(tf.logical_and, masks)
