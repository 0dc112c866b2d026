"""The tiles of thattn's Pallas talking-heads kernel: their sizes, the
static description of a call (`Problem`), and the arithmetic of one
[Bq, Bk] tile that the kernel's programs (`thattn.keras3.pallas_programs`)
share. The algorithm, its cost and the launching are in
`thattn.keras3.pallas_kernel`, the entry point; letters as in `thattn.dims`.
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


def power_of_two(size, smallest=1):
  """The least power of two >= size (and >= smallest)."""
  padded = smallest
  while padded < size:
    padded *= 2
  return padded


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
  key and value head (J and U, and their gradients in the backward pass) and
  a [Bq, d] accumulator of every value head, so more heads get smaller
  tiles. At most 8 warps: with 16, Triton did not compile the h = 24
  forward program in 14 minutes (17 s with 8; benchmarks/RESULTS.md)."""
  if heads <= 4:
    return Tiles(32, 32, num_warps=4)
  if heads <= 16:
    return Tiles(16, 32, num_warps=8)
  return Tiles(16, 16, num_warps=8)


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
  def heads_padded(self):
    """h rounded up to a power of two: the row statistics are [Bq, h]
    arrays in the programs, whose sides Triton wants as powers of two."""
    return power_of_two(self.heads)

  @property
  def skips_causal_tiles(self):
    # Tiles wholly in the future can be skipped only when no other mask can
    # empty a row: a fully masked row must stay uniform over all m keys.
    return self.causal and self.mask_kind == "none"


# ---- the arithmetic of one tile, shared by the programs --------------------
#
# The softmax heads g run in a loop (lax.fori_loop, so a Triton program holds
# the loop once, not h copies of it); the key heads f and the value heads j
# are unrolled, as their tiles live in registers, which cannot be indexed by
# a loop counter. So a program is O(h_k + h + h_v) long, not O(h_k h + h h_v):
# unrolled, the mixes made a program of tens of thousands of operations at
# h = 12, which Triton took minutes to compile (benchmarks/RESULTS.md).
# Per-row statistics of all heads are [Bq, heads_padded] tables, read and
# written one column per head.


def dot(problem, a, b, contract_a=1, contract_b=0):
  """a @ b over the named axes, accumulated in float32 (float32 inputs in
  full float32, not TF32)."""
  precision = lax.Precision.HIGHEST if problem.float32_inputs else None
  return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                         precision=precision,
                         preferred_element_type=jnp.float32)


def _picked(table, index, axis):
  return lax.broadcasted_iota(jnp.int32, table.shape, axis) == index


def column(table, head):
  """table[:, head] for a traced head: a masked sum, since a program's
  registers cannot be indexed by a loop counter."""
  return jnp.sum(jnp.where(_picked(table, head, 1), table, 0.0), axis=1)


def with_column(table, head, values):
  """table with column `head` replaced by `values`."""
  return jnp.where(_picked(table, head, 1), values[:, None], table)


def add_at(table, index, values, axis):
  """table with `values` added at `index` along `axis` (of a 2-D table;
  `values` runs along the other axis)."""
  spread = values[:, None] if axis == 1 else values[None, :]
  return table + jnp.where(_picked(table, index, axis), spread, 0.0)


def pair_sums(tiles, other, size):
  """[size]: entry i is sum(tiles[i] * other) over the tile; zero beyond
  len(tiles) (the padding of a dP block)."""
  index = lax.broadcasted_iota(jnp.int32, (size,), 0)
  sums = jnp.zeros((size,), jnp.float32)
  for i, tile in enumerate(tiles):
    sums = jnp.where(index == i, jnp.sum(tile * other), sums)
  return sums


def _mix_into_head(tiles, projection_ref, head, transposed=False):
  """sum_f P[f, head] tiles[f] (L_g from J), or with `transposed`
  sum_j P[head, j] tiles[j] (dW_g from dU)."""
  total = None
  for other, tile in enumerate(tiles):
    weight = (projection_ref[head, other] if transposed else
              projection_ref[other, head])
    total = tile * weight if total is None else total + tile * weight
  return total


def spread_from_head(accumulators, tile, projection_ref, head,
                     transposed=False):
  """accumulators[j] += P[head, j] tile (U_j from W_g), or with `transposed`
  accumulators[f] += P[f, head] tile (dJ_f from dL_g). Without P (the
  identity), the tile lands in accumulators[head] alone."""
  if projection_ref is None:
    return [jnp.where(head == j, tile, acc)
            for j, acc in enumerate(accumulators)]
  return [acc + tile * (projection_ref[j, head] if transposed else
                        projection_ref[head, j])
          for j, acc in enumerate(accumulators)]


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


def split_refs(names, refs):
  """(_Refs of the inputs, the output refs) from a kernel's ref list."""
  inputs = _Refs(**dict(zip(names, refs[:len(names)])))
  return inputs, refs[len(names):]


@dataclasses.dataclass
class _Tile:
  """What one [Bq, Bk] tile shares across its heads.

  `rows` and `cols` index the tile's queries and keys in the kernel's
  blocks (one of them is the whole block); `dots` is J[f] of every key head
  where P_l mixes them (else None: L_g is J_g, computed per head);
  `grad_mixed` is dU[j] = dO_j V_j^T of every value head in the backward
  pass where P_w mixes them (else None); `allowed` is the caller's mask,
  causal included (or None); `real` marks keys that are not tile padding
  (or None).
  """
  rows: object
  cols: object
  dots: object
  grad_mixed: object
  allowed: object
  real: object


def make_tile(problem, refs, rows, cols, q_start, k_start, backward=False):
  """The `_Tile` of the queries from `q_start` and keys from `k_start`
  (at `rows` and `cols` in the blocks); `backward` adds dU."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  dots = grad_mixed = None
  # The query tiles are loaded again for every key tile (from cache): held
  # across the loop they would take h_k Bq d_k registers.
  if refs.pre is not None:
    dots = [dot(problem, refs.query[rows, f, :], refs.key[cols, f, :], 1, 1)
            for f in range(problem.key_heads)]
  if backward and refs.post is not None:
    grad_mixed = [dot(problem, refs.grad_out[rows, j, :],
                      refs.value[cols, j, :], 1, 1)
                  for j in range(problem.value_heads)]
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
  real = None
  if problem.memory_padded != problem.memory:
    real = k_pos < problem.memory
  return _Tile(rows, cols, dots, grad_mixed, allowed, real)


def head_logits(problem, refs, tile, head):
  """L[head] of the tile, masked: the caller's masked keys at the keras.ops
  path's logit, the tile's padding keys at the padding logit."""
  if tile.dots is None:
    logits = dot(problem, refs.query[tile.rows, head, :],
                 refs.key[tile.cols, head, :], 1, 1)
  else:
    logits = _mix_into_head(tile.dots, refs.pre, head)
  if refs.bias is not None:
    logits = logits + refs.bias[head, tile.rows, tile.cols].astype(
        jnp.float32)
  if tile.allowed is not None:
    logits = jnp.where(tile.allowed, logits, _MASKED_LOGIT)
  if tile.real is not None:
    logits = jnp.where(tile.real, logits, _PADDING_LOGIT)
  return logits


def head_weights(logits, stats, head):
  """W[head] = exp(L - max) / sum, from `stats`: the [Bq, heads_padded]
  row maxima and reciprocal row sums, kept apart rather than as one
  log-sum-exp (in float32, -1e9 + log(m) is -1e9, which would lose the m
  of a fully masked row)."""
  maxima, inverse_sums = stats
  return (jnp.exp(logits - column(maxima, head)[:, None]) *
          column(inverse_sums, head)[:, None])


def head_grad_weights(problem, refs, tile, head):
  """dW[head] = sum_j P_w[head, j] dU_j (or dU_head = dO_head V_head^T)."""
  if tile.grad_mixed is None:
    return dot(problem, refs.grad_out[tile.rows, head, :],
               refs.value[tile.cols, head, :], 1, 1)
  return _mix_into_head(tile.grad_mixed, refs.post, head, transposed=True)


def head_grad_logits(weights, grad_weights, rowsum, allowed):
  """dL = W (dW - D), zero where the caller masked (L is a constant there,
  so nothing flows to J or the bias)."""
  grad = weights * (grad_weights - rowsum[:, None])
  return grad if allowed is None else jnp.where(allowed, grad, 0.0)


def causal_key_tile_end(problem, q_tile):
  """One past the last key tile a query tile can see."""
  if not problem.skips_causal_tiles:
    return problem.key_tiles
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  last_key = (q_tile + 1) * block_q - 1 + problem.causal_offset
  return jnp.minimum(lax.div(last_key, block_k) + 1, problem.key_tiles)


def causal_query_tile_start(problem, k_tile):
  """The first query tile that can see a key tile."""
  if not problem.skips_causal_tiles:
    return 0
  first_query = k_tile * problem.tiles.block_k - problem.causal_offset
  return jnp.maximum(lax.div(jnp.maximum(first_query, 0),
                             problem.tiles.block_q), 0)


def row_kernel_tile(problem, refs, q_start, t, backward=False):
  """Key tile `t` of the query tile at `q_start`, in the programs per query
  tile (whose query block is the tile's rows)."""
  block_k = problem.tiles.block_k
  k_start = pl.multiple_of(t * block_k, block_k)
  return make_tile(problem, refs, slice(None), pl.ds(k_start, block_k),
                   q_start, k_start, backward)


def over_heads(problem, body, carry):
  """lax.fori_loop of body(head, carry) over the softmax heads."""
  return lax.fori_loop(0, problem.heads, body, carry)


def zero_tiles(problem, count):
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  return [jnp.zeros((block_q, block_k), jnp.float32)] * count
