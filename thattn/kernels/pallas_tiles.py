"""The tiles of thattn's Pallas talking-heads kernel: their sizes, the
static description of a call (`Problem`), and the arithmetic of one
[Bq, Bk] tile that the kernel's programs (`thattn.kernels.pallas_programs`)
share. The algorithm and its cost are in `thattn.kernels.pallas_kernel`,
the entry point, the launching in `thattn.kernels.pallas_launch`; letters
as in `thattn.core.dims`.
"""

import dataclasses

from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.core import attention_spec

# Keys the caller masked get the keras.ops path's logit (a fully masked row
# is uniform over them); keys that are only padding to the tile get a far
# lower one, so they never receive weight.
_PADDING_LOGIT = -1e30
# Heads per matrix product of a head mix: the least contraction a GPU's
# tensor cores take in TF32 (the mixes' operands are float32). A program
# holds one chunk's per-head tiles at a time (`head_chunks`), so the chunk
# is kept at that least: at h = 24, 16-head chunks spilled more registers
# in every program (benchmarks/RESULTS.md).
MIX_CHUNK = 8
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# The least contraction of a 16-bit matrix product on a GPU's tensor cores.
HALF_CONTRACTION = 16


def power_of_two(size, smallest=1):
  """The least power of two >= size (and >= smallest)."""
  padded = smallest
  while padded < size:
    padded *= 2
  return padded


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Tile sizes (powers of two; on a GPU at least 16 query rows and 8
  keys), Triton's launch options (ignored elsewhere), and
  `heads_per_program`: None, or the most heads (a multiple of MIX_CHUNK)
  whose [Bq, d] accumulators one program per query tile holds. With it,
  the forward's O and the backward's dQ, dK and dV are made by one program
  per slice of heads (`head_slices`), each recomputing its tiles' J, L and
  W of every head: more multiply-adds, fewer registers."""
  block_q: int = 32
  block_k: int = 32
  num_warps: int = 4
  num_stages: int = 1
  heads_per_program: object = None

  def __post_init__(self):
    for name in ("block_q", "block_k", "num_warps"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"Tiles: {name}={value!r}, expected a power of two.")
    if not isinstance(self.num_stages, int) or self.num_stages < 1:
      raise ValueError(f"Tiles: num_stages={self.num_stages!r}, expected a "
                       "positive integer.")
    slice_size = self.heads_per_program
    if slice_size is not None and (
        not isinstance(slice_size, int) or isinstance(slice_size, bool) or
        slice_size < 1 or slice_size % MIX_CHUNK):
      raise ValueError(f"Tiles: heads_per_program={slice_size!r}, expected "
                       f"None or a positive multiple of {MIX_CHUNK}.")


def mix_size(heads):
  """The side of the head mixes' matrix products: the most heads of any
  kind, rounded up to a power of two and to at least 16 (the least
  contraction a GPU's tensor cores take in a Triton `dot`). Padding heads
  are zero."""
  return power_of_two(heads, 16)


def default_tiles(heads):
  """Tiles for a GPU's registers: 16 query rows by 8 keys, with 8 warps;
  above 16 heads, slices of 16 heads per program.

  A program holds an accumulator of every key or value head, [Bq, d] each
  (Bq x width in all), a few [Bq, Bk, H] float32 arrays of all heads (L,
  W, dW, dL), and while a pair sum runs, its operands, [H, Bq Bk] and
  [Bq Bk, 8], whole on every warp; so it wants the fewest pairs a tile can
  have. 16 rows are the least a matrix product takes, 8 keys the least
  its other side takes (in TF32: a product of 16-bit operands contracting
  the 8 keys is made in float32, `dot`). Compiled for sm_90 (benchmarks/pallas_compile.py),
  16 x 8 with 8 warps spilled least at h = 24 of the tiles tried with
  this design (16 x 16, 32 x 8; 16 x 8 on 4 or 16 warps, where a thread
  has only 128 registers), and none at h = 12; the second design's
  larger tiles (16 x 32, 32 x 16, 16 x 64) and 2 or 4 warps spilled more
  too.

  The accumulators are the floor: a [16, d] float32 accumulator takes 4
  registers of every thread whatever d <= 64 is (a tensor core's output
  tile is 16 x 8, and 8 warps share one accumulator only down to 8
  columns each), so 24 heads' take 96 of a thread's 255. With 16 heads
  per program the forward and rows programs at h = 24 spill nothing
  (RESULTS.md, "Slices of 16 heads")."""
  return Tiles(16, 8, num_warps=8,
               heads_per_program=16 if heads > 16 else None)


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
  def mix_heads(self):
    """H: every head axis in a program, padded (`mix_size`). The row
    statistics are [Bq, H] tables, P_l and P_w arrive as [H, H]."""
    return mix_size(max(self.key_heads, self.heads, self.value_heads))

  @property
  def skips_causal_tiles(self):
    # Tiles wholly in the future can be skipped only when no other mask can
    # empty a row: a fully masked row must stay uniform over all m keys.
    return self.causal and self.mask_kind == "none"


# ---- the arithmetic of one tile, shared by the programs --------------------
#
# A program holds every head of its [Bq, Bk] tile at once, as one
# [Bq, Bk, H] float32 array (heads last, padded to H with zeros), so that
# the head mixes are matrix products on the tensor cores: the tile seen as
# [Bq Bk, 8] (a chunk of 8 heads) times 8 rows or columns of P_l, P_w.
# The products with the queries, keys and values, which differ per head,
# are 2-D matrix products per head (unrolled: O(h) of them, as in
# multi-head FlashAttention), gathered into 8-head stacks by a tree of
# joins (`stack_heads`) and taken apart by splits (`unstack_heads`).
# Nothing in a program loops over the heads, and nothing grows faster than
# the heads. (The first design looped over the softmax heads and did the
# mixes as elementwise multiply-adds, h_k h + h h_v of them per tile, on
# the vector units: benchmarks/RESULTS.md.)


def dot(problem, a, b, contract_a=1, contract_b=0):
  """a @ b over the named axes, accumulated in float32. With float32
  inputs in full float32; otherwise the float32 operands (the head mixes)
  go through the GPU's TF32 tensor cores, more precise than the
  keras.ops path's mixes in the compute dtype.

  A contraction shorter than 16 (the default tiles' 8 keys, in O += U V
  and dQ += dJ K) is made in float32: a 16-bit tensor-core product takes
  at least 16, and Triton's lowering of a shorter one returned twice the
  product on an H200 (benchmarks/RESULTS.md, "On an H200 after the
  fixes"), where TF32's takes 8."""
  if a.shape[contract_a] < HALF_CONTRACTION and (
      a.dtype != jnp.float32 or b.dtype != jnp.float32):
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  precision = lax.Precision.HIGHEST if problem.float32_inputs else None
  return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                         precision=precision,
                         preferred_element_type=jnp.float32)


def stack_heads(tiles, size):
  """[Bq, Bk, size] with tiles[i] at [:, :, i] and zeros beyond them.

  Pallas's Triton backend stacks only two arrays, along a new last axis
  (Triton's join), so the heads go in as a tree: the even heads' stack
  and the odd heads' stack, joined, are the heads in order."""
  tiles = list(tiles)
  tiles += [jnp.zeros_like(tiles[0])] * (size - len(tiles))
  return _interleave(tiles)


def _interleave(tiles):
  if len(tiles) == 1:
    return tiles[0][..., None]
  pairs = jnp.stack([_interleave(tiles[0::2]), _interleave(tiles[1::2])],
                    axis=-1)  # [..., size / 2, 2]: head 2 i + parity
  return pairs.reshape(pairs.shape[:-2] + (len(tiles),))


def unstack_heads(stacked, count):
  """The first `count` [Bq, Bk] tiles of a [Bq, Bk, H] stack."""
  parts = jnp.split(stacked, stacked.shape[-1], axis=-1)
  return [part.reshape(part.shape[:-1]) for part in parts[:count]]


def _chunks(count, first=0):
  """The head chunks a mix's matrix products take: [start, stop) ranges of
  at most MIX_CHUNK heads covering heads `first` (a multiple of MIX_CHUNK)
  to `count`."""
  return [(start, min(start + MIX_CHUNK, count))
          for start in range(first, count, MIX_CHUNK)]


def head_slices(problem, count, block):
  """The [start, stop) ranges of the `count` heads whose accumulators
  ([block, d] float32 each) one program holds: all of them, or with
  `Tiles.heads_per_program`, slices of that many for a program per query
  tile (block = Bq) and of that many times Bq / block for one per key
  tile, whose accumulators have `block` rows (a multiple of MIX_CHUNK, at
  least MIX_CHUNK)."""
  per_program = problem.tiles.heads_per_program
  if per_program is None:
    return [(0, count)]
  per_program = max(per_program * problem.tiles.block_q // block //
                    MIX_CHUNK * MIX_CHUNK, MIX_CHUNK)
  return [(start, min(start + per_program, count))
          for start in range(0, count, per_program)]


def head_chunks(product, count):
  """The [Bq Bk, MIX_CHUNK] stacks of `count` per-head [Bq, Bk] tiles,
  one per chunk of MIX_CHUNK heads (zero columns past `count`): the
  operands of a mix or a pair sum. `product(f)` makes head f's tile; a
  chunk's products are made just before they are stacked, so a program
  holds the per-head tiles of one chunk at a time."""
  stacks = []
  for start, stop in _chunks(count):
    tiles = [product(f) for f in range(start, stop)]
    block_q, block_k = tiles[0].shape
    stacks.append(stack_heads(tiles, MIX_CHUNK).reshape(
        block_q * block_k, MIX_CHUNK))
  return stacks


def mix_in(problem, stacks, projection_ref, transposed=False):
  """[Bq, Bk, H]: column g is sum_f tiles[f] P[f, g] (or with `transposed`,
  sum_f tiles[f] P[g, f]), from the tiles' `head_chunks`: L from J, dW
  from dU.

  One matrix product per chunk of MIX_CHUNK input heads, [Bq Bk,
  MIX_CHUNK] times the chunk's rows of P, summed."""
  total = None
  for c, rows in enumerate(stacks):
    start = c * MIX_CHUNK
    if transposed:
      part = dot(problem, rows, projection_ref[:, start:start + MIX_CHUNK],
                 1, 1)
    else:
      part = dot(problem, rows, projection_ref[start:start + MIX_CHUNK, :])
    total = part if total is None else total + part
  return total.reshape(problem.tiles.block_q, -1, total.shape[-1])


def mix_out(problem, stacked, projection_ref, heads, transposed=False):
  """The [Bq, Bk] tiles sum_g stacked[..., g] P[g, j] (or with
  `transposed`, P[j, g]) of the output heads j in `heads`, a [start, stop)
  range, in order: U from W, dJ from dL; one matrix product per chunk of
  MIX_CHUNK output heads.

  A generator: a chunk's product is made when its first tile is asked
  for, so a program that uses each tile as it comes holds one chunk's
  tiles at a time."""
  block_q, block_k, _ = stacked.shape
  pairs = _as_pairs(stacked)
  for start, stop in _chunks(heads[1], heads[0]):
    if transposed:
      part = dot(problem, pairs,
                 projection_ref[start:start + MIX_CHUNK, :], 1, 1)
    else:
      part = dot(problem, pairs, projection_ref[:, start:start + MIX_CHUNK])
    yield from unstack_heads(part.reshape(block_q, block_k, MIX_CHUNK),
                             stop - start)


def pair_sums_in(problem, stacks, stacked):
  """dP_l's partial sums over the tile's (query, key) pairs, from J's
  `head_chunks` and dL: for each chunk of MIX_CHUNK rows f of the [H, H]
  matrix, the [MIX_CHUNK, H] block sum_pairs J[..., f] dL[..., g] (zero
  past the stacks), made as its transpose: a GPU's matrix product takes
  at least 16 rows, and H >= 16 > MIX_CHUNK."""
  pairs = _as_pairs(stacked)
  size = pairs.shape[1]
  return [dot(problem, pairs, stacks[c], 0, 0).T if c < len(stacks) else
          jnp.zeros((MIX_CHUNK, size), jnp.float32)
          for c in range(size // MIX_CHUNK)]


def pair_sums_out(problem, stacked, stacks):
  """dP_w's partial sums, from W and dU's `head_chunks`: for each chunk of
  MIX_CHUNK columns j, the [H, MIX_CHUNK] block sum_pairs W[..., g]
  dU[..., j] (zero past the stacks)."""
  pairs = _as_pairs(stacked)
  size = pairs.shape[1]
  return [dot(problem, pairs, stacks[c], 0, 0) if c < len(stacks) else
          jnp.zeros((size, MIX_CHUNK), jnp.float32)
          for c in range(size // MIX_CHUNK)]


def _as_pairs(stacked):
  """[Bq, Bk, H] as [Bq Bk, H]."""
  block_q, block_k, size = stacked.shape
  return stacked.reshape(block_q * block_k, size)


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
  """Where one [Bq, Bk] tile is and which of its pairs count.

  `rows` and `cols` index the tile's queries and keys in the kernel's
  blocks (one of them is the whole block); `allowed` is the caller's mask,
  causal included, [Bq, Bk, 1] (or None); `real` marks keys that are not
  tile padding, [Bq, Bk, 1] (or None).
  """
  rows: object
  cols: object
  allowed: object
  real: object


def make_tile(problem, refs, rows, cols, q_start, k_start):
  """The `_Tile` of the queries from `q_start` and keys from `k_start`
  (at `rows` and `cols` in the blocks)."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
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
  return _Tile(rows, cols, None if allowed is None else allowed[..., None],
               None if real is None else real[..., None])


def tile_logits(problem, refs, tile):
  """(J, L) of the tile: J the `head_chunks` of the [Bq, Bk] tiles
  Q_f K_f^T of the key heads (None without P_l, where L is J), L = J P_l +
  bias of every head, [Bq, Bk, H], masked: the caller's masked keys at the
  keras.ops path's logit, the tile's padding keys at the padding logit."""
  def dot_of(f):
    return dot(problem, refs.query[tile.rows, f, :],
               refs.key[tile.cols, f, :], 1, 1)

  dots = None
  if refs.pre is None:
    logits = stack_heads([dot_of(f) for f in range(problem.key_heads)],
                         problem.mix_heads)
  else:
    dots = head_chunks(dot_of, problem.key_heads)
    logits = mix_in(problem, dots, refs.pre)
  if refs.bias is not None:
    logits = logits + stack_heads(
        [refs.bias[g, tile.rows, tile.cols].astype(jnp.float32)
         for g in range(problem.heads)], problem.mix_heads)
  if tile.allowed is not None:
    logits = jnp.where(tile.allowed, logits, attention_spec.MASKED_LOGIT)
  if tile.real is not None:
    logits = jnp.where(tile.real, logits, _PADDING_LOGIT)
  return dots, logits


def tile_weights(logits, stats):
  """W = exp(L - max) / sum, [Bq, Bk, H], from `stats`: the [Bq, H] row
  maxima and reciprocal row sums, kept apart rather than as one
  log-sum-exp (in float32, -1e9 + log(m) is -1e9, which would lose the m
  of a fully masked row)."""
  maxima, inverse_sums = stats
  return jnp.exp(logits - maxima[:, None, :]) * inverse_sums[:, None, :]


def tile_mixed(problem, refs, weights, heads):
  """U = W P_w: the [Bq, Bk] tiles of the value heads in `heads`, a
  [start, stop) range, in order (W's own without P_w; with it, made a
  chunk at a time as they are used: `mix_out`)."""
  if refs.post is None:
    return unstack_heads(weights, heads[1])[heads[0]:]
  return mix_out(problem, weights, refs.post, heads)


def tile_grad_mixed(problem, refs, tile):
  """dU and dW = dU P_w^T of the tile: dU as the `head_chunks` of the
  [Bq, Bk] tiles dO_j V_j^T of the value heads (None without P_w, where
  dW is dU), dW [Bq, Bk, H]."""
  if refs.post is None:
    return None, stack_heads([_grad_mixed_of(problem, refs, tile, j)
                              for j in range(problem.value_heads)],
                             problem.mix_heads)
  grad_mixed = tile_grad_mixed_chunks(problem, refs, tile)
  return grad_mixed, mix_in(problem, grad_mixed, refs.post, transposed=True)


def tile_grad_mixed_chunks(problem, refs, tile):
  """dU's `head_chunks`: the [Bq, Bk] tiles dO_j V_j^T of the value
  heads, 8 to a stack."""
  return head_chunks(lambda j: _grad_mixed_of(problem, refs, tile, j),
                     problem.value_heads)


def _grad_mixed_of(problem, refs, tile, j):
  """dU_j = dO_j V_j^T, [Bq, Bk]."""
  return dot(problem, refs.grad_out[tile.rows, j, :],
             refs.value[tile.cols, j, :], 1, 1)


def tile_grad_logits(weights, grad_weights, rowsum, allowed):
  """dL = W (dW - D), zero where the caller masked (L is a constant there,
  so nothing flows to J or the bias); D is the [Bq, H] table."""
  grad = weights * (grad_weights - rowsum[:, None, :])
  return grad if allowed is None else jnp.where(allowed, grad, 0.0)


def tile_grad_dots(problem, refs, grad_logits, heads):
  """dJ = dL P_l^T: the [Bq, Bk] tiles of the key heads in `heads`, a
  [start, stop) range, in order (dL's own without P_l; with it, made a
  chunk at a time as they are used: `mix_out`)."""
  if refs.pre is None:
    return unstack_heads(grad_logits, heads[1])[heads[0]:]
  return mix_out(problem, grad_logits, refs.pre, heads, transposed=True)


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


def row_kernel_tile(problem, refs, q_start, t):
  """Key tile `t` of the query tile at `q_start`, in the programs per query
  tile (whose query block is the tile's rows)."""
  block_k = problem.tiles.block_k
  k_start = pl.multiple_of(t * block_k, block_k)
  return make_tile(problem, refs, slice(None), pl.ds(k_start, block_k),
                   q_start, k_start)
