"""The attention core in keras.ops: the same math as `thattn.layers`.

Pure functions on backend tensors (TensorFlow, JAX or PyTorch), with the
equations of `thattn.core.attention_spec`. Score tensors are laid out
`[b, heads, n, m]`; letters follow `thattn.core.dims`.
"""

import math

from keras import ops

from thattn.core import attention_spec


def mix_heads(scores, projection):
  """L[b, h, n, m] = einsum(J[b, h_k, n, m], P_l[h_k, h]) (or U from W, P_w).

  A rank-3 `projection[G, f/G, g/G]` holds the diagonal blocks of grouped
  talking heads (heads mix only within their group, group-major).
  """
  if len(projection.shape) == 2:
    return ops.einsum(attention_spec.HEADS_MIX, scores, projection)
  groups, heads_in, heads_out = projection.shape
  batch, _, length, memory = ops.shape(scores)
  grouped = ops.reshape(scores, (batch, groups, heads_in, length, memory))
  mixed = ops.einsum(attention_spec.GROUPED_HEADS_MIX, grouped, projection)
  return ops.reshape(mixed, (batch, groups * heads_out, length, memory))


def dynamic_mix(name, scores, projection, groups):
  """scores[b, f, n, m] mixed by a dynamic projection R[b, n or m, ...]."""
  if groups == 1:
    return ops.einsum(attention_spec.DYNAMIC_MIXES[name], scores, projection)
  batch, heads, length, memory = ops.shape(scores)
  grouped = ops.reshape(scores, (batch, groups, heads // groups, length,
                                 memory))
  mixed = ops.einsum(attention_spec.GROUPED_DYNAMIC_MIXES[name], grouped,
                     projection)
  return ops.reshape(mixed, (batch, groups * projection.shape[-1], length,
                             memory))


def masked_softmax(logits, mask=None, bias=None):
  """W = softmax(L + bias) over m, in float32; masked logits at -1e9.

  `mask` is boolean, broadcastable to [b, 1, n, m], True = may attend. A
  fully masked row is uniform, never NaN.
  """
  logits = ops.cast(logits, "float32")
  if bias is not None:
    logits = logits + ops.cast(bias, "float32")
  if mask is not None:
    logits = ops.where(mask, logits, attention_spec.MASKED_LOGIT)
  return ops.softmax(logits, axis=-1)


def write_positions(cache, update, start):
  """Writes `update[b, s, ...]` into `cache[b, m, ...]` at [start, start+s).

  A one-hot contraction, as in thattn.layers: exact, and static in shape,
  so `jax.jit` traces it once for every step.
  """
  batch, memory = cache.shape[0], cache.shape[1]
  steps = update.shape[1]
  trailing = tuple(cache.shape[2:])
  flat_cache = ops.reshape(cache, (-1, memory, math.prod(trailing)))
  flat_update = ops.reshape(update, (-1, steps, math.prod(trailing)))
  positions = ops.arange(steps, dtype="int32") + start
  one_hot = ops.one_hot(positions, memory, dtype=cache.dtype)  # [s, m]
  keep = 1 - ops.sum(one_hot, axis=0)
  written = (flat_cache * ops.reshape(keep, (1, -1, 1)) +
             ops.einsum(attention_spec.CACHE_WRITE, flat_update, one_hot))
  return ops.reshape(written, (batch if batch is not None else -1, memory)
                     + trailing)


def relative_position_bucket(relative_position, bidirectional=True,
                             num_buckets=32, max_distance=128):
  """T5's bucket of each relative position (memory - query), as int32.

  The same bucketing as `thattn.layers.relative_position_bucket`: exact
  buckets for small distances, log-spaced ones up to `max_distance`.
  """
  relative_position = ops.cast(relative_position, "int32")
  offset = ops.zeros_like(relative_position)
  distance = -relative_position  # distances are measured backwards
  if bidirectional:
    num_buckets //= 2
    offset = offset + ops.cast(distance < 0, "int32") * num_buckets
    distance = ops.abs(distance)
  else:
    distance = ops.maximum(distance, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  # The small-distance branch is taken separately; guard the log at zero.
  log_ratio = (ops.log(ops.cast(ops.maximum(distance, 1), "float32") /
                       max_exact) / math.log(max_distance / max_exact))
  large = max_exact + ops.cast(log_ratio * (num_buckets - max_exact), "int32")
  large = ops.minimum(large, num_buckets - 1)
  return offset + ops.where(is_small, distance, large)
