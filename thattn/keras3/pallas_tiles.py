"""The tiles of thattn's Pallas talking-heads kernel: what one program does.

The three kernel bodies (forward; backward per query tile; backward per key
tile) and the arithmetic of one [Bq, Bk] tile they share. The algorithm,
its cost and the launching are in `thattn.keras3.pallas_kernel`, the entry
point; letters as in `thattn.dims`.
"""

import dataclasses

from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn import attention_spec

# Keys the caller masked get the keras.ops path's logit (a fully masked row
# is uniform over them); keys that are only padding to the tile get a far
# lower one, so they never receive weight.
_MASKED_LOGIT = attention_spec.MASKED_LOGIT
_PADDING_LOGIT = -1e30
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two, at least 16 on a GPU) and Triton's launch
  options (ignored elsewhere)."""
  block_q: int = 32
  block_k: int = 32
  num_warps: int = 4
  num_stages: int = 1

  def __post_init__(self):
    for name in ("block_q", "block_k", "num_warps"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"Tiles: {name}={value!r}, expected a power of two.")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"Tiles: num_stages={self.num_stages!r}, expected a "
                       "positive integer.")


def default_tiles(heads):
  """Tiles for a GPU's registers: a program holds a [Bq, Bk] tile of every
  head (J, L, W, U) and a [Bq, d] accumulator of every value head, so more
  heads get thinner tiles and more warps to spread them over."""
  if heads <= 4:
    return Tiles(32, 32, num_warps=4)
  if heads <= 16:
    return Tiles(16, 32, num_warps=8)
  return Tiles(16, 32, num_warps=16) if heads <= 32 else Tiles(
      16, 16, num_warps=16)


@dataclasses.dataclass(frozen=True)
class Problem:
  """Everything static about one call: shapes, padding, options."""
  batch: int
  key_heads: int
  heads: int
  value_heads: int
  length: int          # n, the real query length
  memory: int          # m, the real key length
  length_padded: int   # n rounded up to block_q
  memory_padded: int   # m rounded up to block_k
  has_pre: bool
  has_post: bool
  mask_kind: str       # "none", "keys" ([b, m]) or "full" ([b, n, m])
  mask_batched: bool   # the mask has the batch's size (else 1)
  bias_batched: object  # None: no bias; else whether it has the batch's size
  causal: bool
  causal_offset: int
  tiles: Tiles
  interpret: bool
  float32_inputs: bool

  @property
  def query_tiles(self):
    return self.length_padded // self.tiles.block_q

  @property
  def key_tiles(self):
    return self.memory_padded // self.tiles.block_k

  @property
  def skips_causal_tiles(self):
    # Tiles wholly in the future can be skipped only when no other mask can
    # empty a row: a fully masked row must stay uniform over all m keys.
    return self.causal and self.mask_kind == "none"


# ---- the arithmetic of one tile, shared by the three kernels ---------------


def _dot(problem, a, b, contract_a=1, contract_b=0):
  """a @ b over the named axes, accumulated in float32 (float32 inputs in
  full float32, not TF32)."""
  precision = lax.Precision.HIGHEST if problem.float32_inputs else None
  return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                         precision=precision,
                         preferred_element_type=jnp.float32)


def _mix(tiles, projection_ref, heads_out, transposed=False):
  """out[g] = sum_f P[f, g] * tiles[f]: the heads mix of whole tiles, or
  the tiles themselves without a projection. `transposed`: out[f] =
  sum_g P[f, g] * tiles[g], the mix's gradient."""
  if projection_ref is None:
    return list(tiles)

  def weight(into, source):
    return (projection_ref[into, source] if transposed else
            projection_ref[source, into])

  mixed = []
  for into in range(heads_out):
    acc = tiles[0] * weight(into, 0)
    for source in range(1, len(tiles)):
      acc = acc + tiles[source] * weight(into, source)
    mixed.append(acc)
  return mixed


@dataclasses.dataclass
class _Refs:
  """A kernel's input refs by name (absent ones None)."""
  query: object = None
  key: object = None
  value: object = None
  pre: object = None
  post: object = None
  mask: object = None
  bias: object = None
  row_max: object = None
  inverse_sum: object = None
  grad_out: object = None
  rowsum: object = None


INPUT_ORDER = ("query", "key", "value", "pre", "post", "mask", "bias",
               "row_max", "inverse_sum", "grad_out", "rowsum")


def _split_refs(names, refs):
  """(_Refs of the inputs, the output refs) from a kernel's ref list."""
  inputs = _Refs(**dict(zip(names, refs[:len(names)])))
  return inputs, refs[len(names):]


def _tile_logits(problem, refs, query_tiles, key_tiles, q_start, k_start,
                 rows, cols):
  """(J tiles, L tiles, allowed) of one [Bq, Bk] tile.

  `rows` and `cols` index the tile in the mask and bias blocks; `allowed`
  is the caller's mask (causal included) as booleans, or None; keys beyond
  m are set to the padding logit here.
  """
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  dots = [_dot(problem, q, k, 1, 1) for q, k in zip(query_tiles, key_tiles)]
  logits = _mix(dots, refs.pre, problem.heads)
  if refs.bias is not None:
    logits = [logit + refs.bias[h, rows, cols].astype(jnp.float32)
              for h, logit in enumerate(logits)]
  q_pos = q_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
  k_pos = k_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
  allowed = None
  if problem.causal:
    allowed = k_pos <= q_pos + problem.causal_offset
  if problem.mask_kind != "none":
    if problem.mask_kind == "keys":
      user = refs.mask[cols][None, :] != 0
    else:
      user = refs.mask[rows, cols] != 0
    allowed = user if allowed is None else jnp.logical_and(allowed, user)
  if allowed is not None:
    logits = [jnp.where(allowed, logit, _MASKED_LOGIT) for logit in logits]
  if problem.memory_padded != problem.memory:
    real = k_pos < problem.memory
    logits = [jnp.where(real, logit, _PADDING_LOGIT) for logit in logits]
  return dots, logits, allowed


def _weights(logits, stats):
  """W[h] = exp(L[h] - max[h]) / sum[h] for each softmax head.

  `stats` is (row maxima, reciprocal row sums), kept apart rather than as
  one log-sum-exp: in float32, -1e9 + log(m) is -1e9, which would lose the
  m of a fully masked row.
  """
  maxima, inverse_sums = stats
  return [jnp.exp(logit - top[:, None]) * inverse[:, None]
          for logit, top, inverse in zip(logits, maxima, inverse_sums)]


def _grad_logits(weights, grad_weights, rowsum, allowed):
  """dL[h] = W (dW - D), zero where the caller masked (L is a constant
  there, so nothing flows to J or the bias)."""
  grads = [w * (dw - d[:, None])
           for w, dw, d in zip(weights, grad_weights, rowsum)]
  if allowed is not None:
    grads = [jnp.where(allowed, g, 0.0) for g in grads]
  return grads


def _causal_key_tile_end(problem, q_tile):
  """One past the last key tile a query tile can see."""
  if not problem.skips_causal_tiles:
    return problem.key_tiles
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  last_key = (q_tile + 1) * block_q - 1 + problem.causal_offset
  return jnp.minimum(lax.div(last_key, block_k) + 1, problem.key_tiles)


def _causal_query_tile_start(problem, k_tile):
  """The first query tile that can see a key tile."""
  if not problem.skips_causal_tiles:
    return 0
  first_query = k_tile * problem.tiles.block_k - problem.causal_offset
  return jnp.maximum(lax.div(jnp.maximum(first_query, 0),
                             problem.tiles.block_q), 0)


def _key_tile_of_row_tile(problem, refs, q_start, t):
  """(cols, K tiles, J, L, allowed) of key tile `t` for the query tile at
  `q_start` (the rows kernels' view: the query block is the ref's rows).

  The query tiles are loaded again for every key tile (from cache): held
  across the loop they would take h_k Bq d_k registers.
  """
  block_k = problem.tiles.block_k
  k_start = pl.multiple_of(t * block_k, block_k)
  cols = pl.ds(k_start, block_k)
  queries = [refs.query[:, i, :] for i in range(problem.key_heads)]
  keys = [refs.key[cols, i, :] for i in range(problem.key_heads)]
  dots, logits, allowed = _tile_logits(problem, refs, queries, keys, q_start,
                                       k_start, slice(None), cols)
  return cols, keys, dots, logits, allowed


# ---- forward ---------------------------------------------------------------


def forward_kernel(problem, names, *refs):
  refs, (out_ref, max_ref, inverse_sum_ref) = _split_refs(names, refs)
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  end = _causal_key_tile_end(problem, q_tile)

  def tile_logits(t):
    cols, _, _, logits, _ = _key_tile_of_row_tile(problem, refs, q_start, t)
    return cols, logits

  def statistics(t, carry):
    maxima, sums = carry
    _, logits = tile_logits(t)
    new_maxima, new_sums = [], []
    for logit, old_max, old_sum in zip(logits, maxima, sums):
      new_max = jnp.maximum(old_max, jnp.max(logit, axis=1))
      new_sums.append(old_sum * jnp.exp(old_max - new_max) +
                      jnp.sum(jnp.exp(logit - new_max[:, None]), axis=1))
      new_maxima.append(new_max)
    return new_maxima, new_sums

  start = ([jnp.full((block_q,), -jnp.inf, jnp.float32)] * problem.heads,
           [jnp.zeros((block_q,), jnp.float32)] * problem.heads)
  maxima, sums = lax.fori_loop(0, end, statistics, start)
  stats = (maxima, [1.0 / s for s in sums])

  def accumulate(t, outputs):
    cols, logits = tile_logits(t)
    mixed = _mix(_weights(logits, stats), refs.post, problem.value_heads)
    return [out + _dot(problem, u.astype(refs.value.dtype),
                       refs.value[cols, j, :])
            for j, (out, u) in enumerate(zip(outputs, mixed))]

  d_v = refs.value.shape[-1]
  outputs = lax.fori_loop(
      0, end, accumulate,
      [jnp.zeros((block_q, d_v), jnp.float32)] * problem.value_heads)
  for j, out in enumerate(outputs):
    out_ref[:, j, :] = out.astype(out_ref.dtype)
  for h in range(problem.heads):
    max_ref[h, :] = stats[0][h]
    inverse_sum_ref[h, :] = stats[1][h]


# ---- backward: per query tile (dQ, D, dP_l, dP_w, dbias) -------------------


def _add_pair_sums(ref, lefts, rights):
  """ref[f, g] += sum(lefts[f] * rights[g]) over the tile, for a dP block.

  The sums go straight into this query tile's output block: as loop-carried
  scalars they would take h_k h + h h_v registers.
  """
  if ref is None:
    return
  for f, left in enumerate(lefts):
    for g, right in enumerate(rights):
      ref[f, g] = ref[f, g] + jnp.sum(left * right)


def _zero_skipped_bias_gradient(problem, grad_bias_ref, end):
  """Writes the zero bias gradient of the key tiles a causal query tile
  skips (from `end` on): skipped, they would be left unwritten."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k

  def zero(t, carry):
    cols = pl.ds(pl.multiple_of(t * block_k, block_k), block_k)
    for h in range(problem.heads):
      grad_bias_ref[h, :, cols] = jnp.zeros((block_q, block_k), jnp.float32)
    return carry

  lax.fori_loop(end, problem.key_tiles, zero, None)


def _row_outputs(problem, outs):
  """(dQ, D, dP_l partial, dP_w partial, dbias) output refs; absent: None."""
  rest = list(outs[2:])
  grad_pre_ref = rest.pop(0) if problem.has_pre else None
  grad_post_ref = rest.pop(0) if problem.has_post else None
  grad_bias_ref = rest.pop(0) if problem.bias_batched is not None else None
  return outs[0], outs[1], grad_pre_ref, grad_post_ref, grad_bias_ref


def rows_kernel(problem, names, *refs):
  refs, outs = _split_refs(names, refs)
  (grad_query_ref, rowsum_ref, grad_pre_ref, grad_post_ref,
   grad_bias_ref) = _row_outputs(problem, outs)
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  stats = ([refs.row_max[h, :] for h in range(problem.heads)],
           [refs.inverse_sum[h, :] for h in range(problem.heads)])
  end = _causal_key_tile_end(problem, q_tile)

  def recompute(t):
    cols, keys, dots, logits, allowed = _key_tile_of_row_tile(
        problem, refs, q_start, t)
    weights = _weights(logits, stats)
    grad_mixed = [_dot(problem, refs.grad_out[:, j, :],
                       refs.value[cols, j, :], 1, 1)
                  for j in range(problem.value_heads)]
    grad_weights = _mix(grad_mixed, refs.post, problem.heads, transposed=True)
    return cols, keys, dots, weights, grad_mixed, grad_weights, allowed

  def row_sums(t, sums):
    _, _, _, weights, _, grad_weights, _ = recompute(t)
    return [s + jnp.sum(w * dw, axis=1)
            for s, w, dw in zip(sums, weights, grad_weights)]

  rowsum = lax.fori_loop(0, end, row_sums,
                         [jnp.zeros((block_q,), jnp.float32)] * problem.heads)
  for h, row in enumerate(rowsum):
    rowsum_ref[h, :] = row
  for ref in (grad_pre_ref, grad_post_ref):
    if ref is not None:
      ref[...] = jnp.zeros(ref.shape, jnp.float32)
  if grad_bias_ref is not None and problem.skips_causal_tiles:
    _zero_skipped_bias_gradient(problem, grad_bias_ref, end)

  def gradients(t, grad_queries):
    cols, keys, dots, weights, grad_mixed, grad_weights, allowed = (
        recompute(t))
    grad_logits = _grad_logits(weights, grad_weights, rowsum, allowed)
    if grad_bias_ref is not None:
      for h, g in enumerate(grad_logits):
        grad_bias_ref[h, :, cols] = g
    _add_pair_sums(grad_pre_ref, dots, grad_logits)  # dP_l += J^T dL
    _add_pair_sums(grad_post_ref, weights, grad_mixed)  # dP_w += W^T dU
    grad_dots = _mix(grad_logits, refs.pre, problem.key_heads, transposed=True)
    return [dq + _dot(problem, g.astype(k.dtype), k)
            for dq, g, k in zip(grad_queries, grad_dots, keys)]

  d_k = refs.query.shape[-1]
  grad_queries = lax.fori_loop(
      0, end, gradients,
      [jnp.zeros((block_q, d_k), jnp.float32)] * problem.key_heads)
  for i, dq in enumerate(grad_queries):
    grad_query_ref[:, i, :] = dq.astype(grad_query_ref.dtype)


# ---- backward: per key tile (dK, dV) ---------------------------------------


def columns_kernel(problem, names, *refs):
  refs, (grad_key_ref, grad_value_ref) = _split_refs(names, refs)
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  k_tile = pl.program_id(1)
  k_start = k_tile * block_k
  cols = slice(None)

  def accumulate(t, carry):
    grad_keys, grad_values = carry
    q_start = pl.multiple_of(t * block_q, block_q)
    rows = pl.ds(q_start, block_q)
    queries = [refs.query[rows, i, :] for i in range(problem.key_heads)]
    grad_outs = [refs.grad_out[rows, j, :]
                 for j in range(problem.value_heads)]
    stats = ([refs.row_max[h, rows] for h in range(problem.heads)],
             [refs.inverse_sum[h, rows] for h in range(problem.heads)])
    rowsum = [refs.rowsum[h, rows] for h in range(problem.heads)]
    keys = [refs.key[:, i, :] for i in range(problem.key_heads)]
    values = [refs.value[:, j, :] for j in range(problem.value_heads)]
    _, logits, allowed = _tile_logits(problem, refs, queries, keys, q_start,
                                      k_start, rows, cols)
    weights = _weights(logits, stats)
    mixed = _mix(weights, refs.post, problem.value_heads)
    grad_mixed = [_dot(problem, g, v, 1, 1)
                  for g, v in zip(grad_outs, values)]
    grad_weights = _mix(grad_mixed, refs.post, problem.heads, transposed=True)
    grad_logits = _grad_logits(weights, grad_weights, rowsum, allowed)
    grad_dots = _mix(grad_logits, refs.pre, problem.key_heads, transposed=True)
    grad_keys = [dk + _dot(problem, g.astype(q.dtype), q, 0, 0)
                 for dk, g, q in zip(grad_keys, grad_dots, queries)]
    grad_values = [dv + _dot(problem, u.astype(g.dtype), g, 0, 0)
                   for dv, u, g in zip(grad_values, mixed, grad_outs)]
    return grad_keys, grad_values

  d_k, d_v = refs.key.shape[-1], refs.value.shape[-1]
  start = ([jnp.zeros((block_k, d_k), jnp.float32)] * problem.key_heads,
           [jnp.zeros((block_k, d_v), jnp.float32)] * problem.value_heads)
  grad_keys, grad_values = lax.fori_loop(
      _causal_query_tile_start(problem, k_tile), problem.query_tiles,
      accumulate, start)
  for i, dk in enumerate(grad_keys):
    grad_key_ref[:, i, :] = dk.astype(grad_key_ref.dtype)
  for j, dv in enumerate(grad_values):
    grad_value_ref[:, j, :] = dv.astype(grad_value_ref.dtype)
