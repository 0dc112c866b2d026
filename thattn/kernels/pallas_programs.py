"""The programs of thattn's Pallas talking-heads kernel: what one cell of
the grid runs: the forward pass per query tile (or its statistics, then
a program per slice of the value heads); the backward pass per query
tile (D and dP_w; dP_l; then dQ and dbias) and per key tile (dK; then
dV): one set of accumulators or one pair sum per program, so that
Triton's registers hold it (why: `thattn.kernels.pallas_kernel`).

The arithmetic of one tile, all heads at once, is in
`thattn.kernels.pallas_tiles`; the algorithm and its cost in
`thattn.kernels.pallas_kernel`, the entry point, the launching in
`thattn.kernels.pallas_launch`; letters as in `thattn.core.dims`. Each program
loops over tiles only: the heads are the last axis of its [Bq, Bk, H]
arrays, the per-head products with Q, K, V and dO are unrolled, and the
accumulators are [Bq, d] (or [Bk, d]) per head.
"""

from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.kernels import pallas_tiles as tile_math


def _zeros(rows, size, count):
  return [jnp.zeros((rows, size), jnp.float32)] * count


# ---- forward ---------------------------------------------------------------


def _row_statistics(problem, refs, q_start, end):
  """The forward's first pass over the key tiles before `end`: online row
  maxima and sums of exp of every head, as (maxima, 1 / sums), [Bq, H]."""
  def statistics(t, carry):
    maxima, sums = carry
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, logits = tile_math.tile_logits(problem, refs, tile)
    new_max = jnp.maximum(maxima, jnp.max(logits, axis=1))
    sums = (sums * jnp.exp(maxima - new_max) +
            jnp.sum(jnp.exp(logits - new_max[:, None, :]), axis=1))
    return new_max, sums

  table = (problem.tiles.block_q, problem.mix_heads)
  maxima, sums = lax.fori_loop(
      0, end, statistics, (jnp.full(table, -jnp.inf, jnp.float32),
                           jnp.zeros(table, jnp.float32)))
  return maxima, 1.0 / sums  # every head, padding ones too, sums >= 1


def statistics_kernel(problem, names, *refs):
  """The row statistics of a query tile alone, for forward programs that
  each make a slice of the value heads (`forward_kernel`)."""
  refs, (max_ref, inverse_sum_ref) = tile_math.split_refs(names, refs)
  q_tile = pl.program_id(1)
  max_ref[...], inverse_sum_ref[...] = _row_statistics(
      problem, refs, q_tile * problem.tiles.block_q,
      tile_math.causal_key_tile_end(problem, q_tile))


def forward_kernel(problem, names, *refs, heads):
  """O of a query tile's value heads in `heads`, a [start, stop) range: a
  first pass over the key tiles for the row statistics (or, given them as
  inputs, none), then O_j += U_j V_j."""
  refs, outs = tile_math.split_refs(names, refs)
  out_ref = outs[0]
  q_tile = pl.program_id(1)
  q_start = q_tile * problem.tiles.block_q
  end = tile_math.causal_key_tile_end(problem, q_tile)
  if refs.row_max is None:
    stats = _row_statistics(problem, refs, q_start, end)
    outs[1][...], outs[2][...] = stats
  else:
    stats = (refs.row_max[...], refs.inverse_sum[...])
  first = heads[0]

  def accumulate(t, outputs):  # pass 2: O_j += U_j V_j
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, logits = tile_math.tile_logits(problem, refs, tile)
    mixed = tile_math.tile_mixed(
        problem, refs, tile_math.tile_weights(logits, stats), heads)
    return [out + tile_math.dot(problem, u.astype(refs.value.dtype),
                                refs.value[tile.cols, first + j, :])
            for j, (out, u) in enumerate(zip(outputs, mixed))]

  outputs = lax.fori_loop(0, end, accumulate,
                          _zeros(problem.tiles.block_q, refs.value.shape[-1],
                                 heads[1] - first))
  for j, out in enumerate(outputs):
    out_ref[:, j, :] = out.astype(out_ref.dtype)


# ---- backward: per query tile (D, dP_w, dP_l; then dQ and dbias) ----------


def _zero_skipped_bias_gradient(problem, grad_bias_ref, end):
  """Writes the zero bias gradient of the key tiles a causal query tile
  skips (from `end` on): skipped, they would be left unwritten."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k

  def zero(t, carry):
    cols = pl.ds(pl.multiple_of(t * block_k, block_k), block_k)
    for g in range(problem.heads):
      grad_bias_ref[g, :, cols] = jnp.zeros((block_q, block_k), jnp.float32)
    return carry

  lax.fori_loop(end, problem.key_tiles, zero, 0)


def _weights_and_grads(problem, refs, tile, stats, keep):
  """(J's head chunks or None, W, dU's head chunks or None, dW) of a tile
  (W and dW [Bq, Bk, H]), given the [Bq, H] row statistics.

  `keep` names the head chunks a pair sum will take, "dots" (J) or
  "grad_mixed" (dU): they are made last, so that they are held across as
  little as possible (made first, they spill registers: RESULTS.md)."""
  if keep == "dots":
    grad_mixed, grad_weights = tile_math.tile_grad_mixed(problem, refs, tile)
  dots, logits = tile_math.tile_logits(problem, refs, tile)
  weights = tile_math.tile_weights(logits, stats)
  if keep != "dots":
    grad_mixed, grad_weights = tile_math.tile_grad_mixed(problem, refs, tile)
  return dots, weights, grad_mixed, grad_weights


def _backward_tile(problem, refs, tile, stats, rowsum):
  """(J's head chunks or None, dL) of a tile, given also D ([Bq, H])."""
  dots, weights, _, grad_weights = _weights_and_grads(problem, refs, tile,
                                                      stats, keep="dots")
  return dots, tile_math.tile_grad_logits(weights, grad_weights, rowsum,
                                          tile.allowed)


def _pair_sum_chunks(problem, transposed):
  """Zero partial sums of dP_l (blocks of MIX_CHUNK rows) or, with
  `transposed`, of dP_w (blocks of MIX_CHUNK columns)."""
  size, chunk = problem.mix_heads, tile_math.MIX_CHUNK
  shape = (size, chunk) if transposed else (chunk, size)
  return [jnp.zeros(shape, jnp.float32)] * (size // chunk)


def _write_pair_sums(ref, blocks, transposed):
  """Writes `_pair_sum_chunks`-shaped blocks into the [H, H] output."""
  chunk = tile_math.MIX_CHUNK
  for c, block in enumerate(blocks):
    if transposed:
      ref[:, c * chunk:(c + 1) * chunk] = block
    else:
      ref[c * chunk:(c + 1) * chunk, :] = block


def row_sums_kernel(problem, names, *refs):
  """The backward's row statistics of a query tile, in one pass over its
  key tiles: D[:, g] = sum_m W_g dW_g, [Bq, H], and P_w's gradient dP_w =
  sum_pairs W^T dU (it needs no D). dP_l, whose dL needs D, is the next
  program's (`logits_pair_sums_kernel`).

  A pair sum is a matrix product that contracts the tile's Bq Bk pairs;
  its operands are held whole on every warp, so the pass makes dU's head
  chunks last, and nothing else accumulates here (with dQ or dK beside
  it, the program spills: benchmarks/RESULTS.md). With slices of heads
  (`Tiles.heads_per_program`, the default above 16 heads) it makes dU's
  chunks again for the pair sum rather than hold them from dW's mix
  (held, they spilled 8 bytes at h = 24)."""
  refs, outs = tile_math.split_refs(names, refs)
  rowsum_ref = outs[0]
  grad_post_ref = outs[1] if problem.has_post else None
  q_tile = pl.program_id(1)
  q_start = q_tile * problem.tiles.block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])
  remake = problem.tiles.heads_per_program is not None

  def statistics(t, carry):
    rowsum, grad_post = carry
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, weights, grad_mixed, grad_weights = _weights_and_grads(
        problem, refs, tile, stats, keep="grad_mixed")
    if grad_post is not None:  # dP_w += W^T dU
      if remake:
        grad_mixed = tile_math.tile_grad_mixed_chunks(problem, refs, tile)
      grad_post = _add(grad_post, tile_math.pair_sums_out(
          problem, weights, grad_mixed))
    return rowsum + jnp.sum(weights * grad_weights, axis=1), grad_post

  rowsum, grad_post = lax.fori_loop(
      0, tile_math.causal_key_tile_end(problem, q_tile), statistics,
      (jnp.zeros((problem.tiles.block_q, problem.mix_heads), jnp.float32),
       _pair_sum_chunks(problem, True) if problem.has_post else None))
  rowsum_ref[...] = rowsum
  if grad_post_ref is not None:
    _write_pair_sums(grad_post_ref, grad_post, True)


def logits_pair_sums_kernel(problem, names, *refs):
  """P_l's gradient's partial sum over a query tile, dP_l = sum_pairs J^T
  dL, in one pass over its key tiles, given D (`row_sums_kernel`). Apart
  from that program: together, the two passes spilled 80 bytes at h = 24
  where each alone spills none."""
  refs, (grad_pre_ref,) = tile_math.split_refs(names, refs)
  q_tile = pl.program_id(1)
  q_start = q_tile * problem.tiles.block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])
  rowsum = refs.rowsum[...]

  def logits_pair_sums(t, grad_pre):  # dP_l += J^T dL
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    dots, grad_logits = _backward_tile(problem, refs, tile, stats, rowsum)
    return _add(grad_pre, tile_math.pair_sums_in(problem, dots,
                                                 grad_logits))

  _write_pair_sums(grad_pre_ref, lax.fori_loop(
      0, tile_math.causal_key_tile_end(problem, q_tile), logits_pair_sums,
      _pair_sum_chunks(problem, False)), False)


def _add(totals, parts):
  return [total + part for total, part in zip(totals, parts)]


def rows_kernel(problem, names, *refs, heads):
  """dQ of a query tile's key heads in `heads`, a [start, stop) range, and
  (in the program of the first heads, given a bias) the bias gradient's
  rows."""
  refs, outs = tile_math.split_refs(names, refs)
  grad_query_ref = outs[0]
  grad_bias_ref = outs[1] if len(outs) > 1 else None
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])
  rowsum = refs.rowsum[...]
  end = tile_math.causal_key_tile_end(problem, q_tile)
  if grad_bias_ref is not None and problem.skips_causal_tiles:
    _zero_skipped_bias_gradient(problem, grad_bias_ref, end)

  def gradients(t, grad_queries):
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, grad_logits = _backward_tile(problem, refs, tile, stats, rowsum)
    if grad_bias_ref is not None:
      for g, grad in enumerate(tile_math.unstack_heads(grad_logits,
                                                       problem.heads)):
        grad_bias_ref[g, :, tile.cols] = grad
    # Every dJ tile before the dQ products: made a chunk at a time as they
    # are used (as in the other programs), this program spilled more at
    # h = 24 (288 bytes against 180; benchmarks/RESULTS.md).
    grad_dots = list(tile_math.tile_grad_dots(problem, refs, grad_logits,
                                              heads))
    return [dq + tile_math.dot(problem, g.astype(refs.key.dtype),
                               refs.key[tile.cols, heads[0] + f, :])
            for f, (dq, g) in enumerate(zip(grad_queries, grad_dots))]

  grad_queries = lax.fori_loop(
      0, end, gradients,
      _zeros(block_q, refs.query.shape[-1], heads[1] - heads[0]))
  for f, dq in enumerate(grad_queries):
    grad_query_ref[:, f, :] = dq.astype(grad_query_ref.dtype)


# ---- backward: per key tile (dK; dV) --------------------------------------


def _over_query_tiles(problem, refs, body, start):
  """Loops `body(tile, stats, carry) -> carry` over the query tiles that
  can see this program's key tile, from `start`; `stats` are the tile's
  [Bq, H] row maxima and reciprocal sums."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  k_tile = pl.program_id(1)

  def step(t, carry):
    q_start = pl.multiple_of(t * block_q, block_q)
    rows = pl.ds(q_start, block_q)
    tile = tile_math.make_tile(problem, refs, rows, slice(None), q_start,
                               k_tile * block_k)
    stats = (refs.row_max[rows, :], refs.inverse_sum[rows, :])
    return body(tile, stats, carry)

  return lax.fori_loop(tile_math.causal_query_tile_start(problem, k_tile),
                       problem.query_tiles, step, start)


def _column_sums(problem, refs, out_ref, heads, head_tiles, operand_ref):
  """out[:, f - start, :] = sum over the query tiles of T_f^T X_f, for the
  heads f in `heads` = [start, stop), the [Bq, Bk] tiles T_f of
  head_tiles(tile, stats) and X = operand_ref's [Bq, heads, d] rows: the
  gradient of this program's key tile."""
  first = heads[0]

  def accumulate(tile, stats, sums):
    return [total + tile_math.dot(problem, t.astype(operand_ref.dtype),
                                  operand_ref[tile.rows, first + f, :], 0, 0)
            for f, (total, t) in enumerate(zip(sums,
                                               head_tiles(tile, stats)))]

  sums = _over_query_tiles(
      problem, refs, accumulate,
      _zeros(problem.tiles.block_k, out_ref.shape[-1], heads[1] - first))
  for f, total in enumerate(sums):
    out_ref[:, f, :] = total.astype(out_ref.dtype)


def key_columns_kernel(problem, names, *refs, heads):
  """dK of a key tile's key heads in `heads`: sum over the query tiles of
  dJ^T Q."""
  refs, (grad_key_ref,) = tile_math.split_refs(names, refs)

  def grad_dots(tile, stats):
    _, grad_logits = _backward_tile(problem, refs, tile, stats,
                                    refs.rowsum[tile.rows, :])
    return tile_math.tile_grad_dots(problem, refs, grad_logits, heads)

  _column_sums(problem, refs, grad_key_ref, heads, grad_dots, refs.query)


def value_columns_kernel(problem, names, *refs, heads):
  """dV of a key tile's value heads in `heads`: sum over the query tiles
  of U^T dO (U needs only W, so no dU, dW or dL)."""
  refs, (grad_value_ref,) = tile_math.split_refs(names, refs)

  def mixed(tile, stats):
    _, logits = tile_math.tile_logits(problem, refs, tile)
    return tile_math.tile_mixed(problem, refs,
                                tile_math.tile_weights(logits, stats), heads)

  _column_sums(problem, refs, grad_value_ref, heads, mixed, refs.grad_out)
