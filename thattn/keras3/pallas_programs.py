"""The programs of thattn's Pallas talking-heads kernel: what one cell of
the grid runs: the forward pass per query tile; the backward pass per
query tile (D, then dQ, dP_l, dP_w and dbias: two programs, as a Triton
program's compile time grows faster than its length) and per key tile
(dK, dV).

The arithmetic of one tile, all heads at once, is in
`thattn.keras3.pallas_tiles`; the algorithm, its cost and the launching in
`thattn.keras3.pallas_kernel`, the entry point; letters as in
`thattn.dims`. Each program loops over tiles only: the heads are the last
axis of its [Bq, Bk, H] arrays, the per-head products with Q, K, V and dO
are unrolled, and the accumulators are [Bq, d] (or [Bk, d]) per head.
"""

from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.keras3 import pallas_tiles as tile_math


def _zeros(rows, size, count):
  return [jnp.zeros((rows, size), jnp.float32)] * count


# ---- forward ---------------------------------------------------------------


def forward_kernel(problem, names, *refs):
  refs, (out_ref, max_ref, inverse_sum_ref) = tile_math.split_refs(names, refs)
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  end = tile_math.causal_key_tile_end(problem, q_tile)

  def statistics(t, carry):  # pass 1: online row maxima and sums of exp
    maxima, sums = carry
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, logits = tile_math.tile_logits(problem, refs, tile)
    new_max = jnp.maximum(maxima, jnp.max(logits, axis=1))
    sums = (sums * jnp.exp(maxima - new_max) +
            jnp.sum(jnp.exp(logits - new_max[:, None, :]), axis=1))
    return new_max, sums

  table = (block_q, problem.mix_heads)
  maxima, sums = lax.fori_loop(
      0, end, statistics, (jnp.full(table, -jnp.inf, jnp.float32),
                           jnp.zeros(table, jnp.float32)))
  stats = (maxima, 1.0 / sums)  # every head, padding ones too, sums >= 1

  def accumulate(t, outputs):  # pass 2: O_j += U_j V_j
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, logits = tile_math.tile_logits(problem, refs, tile)
    mixed = tile_math.tile_mixed(
        problem, refs, tile_math.tile_weights(logits, stats))
    return [out + tile_math.dot(problem, u.astype(refs.value.dtype),
                                refs.value[tile.cols, j, :])
            for j, (out, u) in enumerate(zip(outputs, mixed))]

  outputs = lax.fori_loop(0, end, accumulate,
                          _zeros(block_q, refs.value.shape[-1],
                                 problem.value_heads))
  for j, out in enumerate(outputs):
    out_ref[:, j, :] = out.astype(out_ref.dtype)
  max_ref[...] = stats[0]
  inverse_sum_ref[...] = stats[1]


# ---- backward: per query tile (D; then dQ, dP_l, dP_w, dbias) --------------


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


def _row_outputs(problem, outs):
  """(dQ, dP_l partial, dP_w partial, dbias) output refs; absent: None."""
  rest = list(outs[1:])
  grad_pre_ref = rest.pop(0) if problem.has_pre else None
  grad_post_ref = rest.pop(0) if problem.has_post else None
  grad_bias_ref = rest.pop(0) if problem.bias_batched is not None else None
  return outs[0], grad_pre_ref, grad_post_ref, grad_bias_ref


def _weights_and_grads(problem, refs, tile, stats):
  """(J's tiles or None, W, dU's tiles, dW) of a tile (W and dW
  [Bq, Bk, H]), given the [Bq, H] row statistics."""
  dots, logits = tile_math.tile_logits(problem, refs, tile)
  weights = tile_math.tile_weights(logits, stats)
  grad_mixed = tile_math.tile_grad_mixed(problem, refs, tile)
  return (dots, weights, grad_mixed,
          tile_math.tile_grad_weights(problem, refs, grad_mixed))


def _backward_tile(problem, refs, tile, stats, rowsum):
  """(J's tiles or None, W, dU's tiles, dL) of a tile, given also D
  ([Bq, H])."""
  dots, weights, grad_mixed, grad_weights = _weights_and_grads(
      problem, refs, tile, stats)
  grad_logits = tile_math.tile_grad_logits(weights, grad_weights, rowsum,
                                           tile.allowed)
  return dots, weights, grad_mixed, grad_logits


def row_sums_kernel(problem, names, *refs):
  """D[:, g] = sum_m W_g dW_g of a query tile: [Bq, H]."""
  refs, (rowsum_ref,) = tile_math.split_refs(names, refs)
  q_tile = pl.program_id(1)
  q_start = q_tile * problem.tiles.block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])

  def over_keys(t, rowsum):
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    _, weights, _, grad_weights = _weights_and_grads(problem, refs, tile,
                                                     stats)
    return rowsum + jnp.sum(weights * grad_weights, axis=1)

  rowsum_ref[...] = lax.fori_loop(
      0, tile_math.causal_key_tile_end(problem, q_tile), over_keys,
      jnp.zeros((problem.tiles.block_q, problem.mix_heads), jnp.float32))


def rows_kernel(problem, names, *refs):
  refs, outs = tile_math.split_refs(names, refs)
  grad_query_ref, grad_pre_ref, grad_post_ref, grad_bias_ref = _row_outputs(
      problem, outs)
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])
  rowsum = refs.rowsum[...]
  end = tile_math.causal_key_tile_end(problem, q_tile)
  if grad_bias_ref is not None and problem.skips_causal_tiles:
    _zero_skipped_bias_gradient(problem, grad_bias_ref, end)

  def gradients(t, carry):
    grad_queries, grad_pre, grad_post = carry
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)
    dots, weights, grad_mixed, grad_logits = _backward_tile(
        problem, refs, tile, stats, rowsum)
    if grad_bias_ref is not None:
      for g, grad in enumerate(tile_math.unstack_heads(grad_logits,
                                                       problem.heads)):
        grad_bias_ref[g, :, tile.cols] = grad
    if grad_pre is not None:  # dP_l += J^T dL
      grad_pre = [total + part for total, part in zip(
          grad_pre, tile_math.pair_sums_in(problem, dots, grad_logits))]
    if grad_post is not None:  # dP_w += W^T dU
      grad_post = [total + part for total, part in zip(
          grad_post, tile_math.pair_sums_out(problem, weights, grad_mixed))]
    grad_dots = tile_math.tile_grad_dots(problem, refs, grad_logits)
    grad_queries = [dq + tile_math.dot(problem, g.astype(refs.key.dtype),
                                       refs.key[tile.cols, f, :])
                    for f, (dq, g) in enumerate(zip(grad_queries, grad_dots))]
    return grad_queries, grad_pre, grad_post

  # dP_l by blocks of MIX_CHUNK rows, dP_w by blocks of MIX_CHUNK columns.
  size, chunk = problem.mix_heads, tile_math.MIX_CHUNK
  chunks = size // chunk
  projections = (
      None if grad_pre_ref is None else
      [jnp.zeros((chunk, size), jnp.float32)] * chunks,
      None if grad_post_ref is None else
      [jnp.zeros((size, chunk), jnp.float32)] * chunks)
  grad_queries, grad_pre, grad_post = lax.fori_loop(
      0, end, gradients,
      (_zeros(block_q, refs.query.shape[-1], problem.key_heads),)
      + projections)
  for f, dq in enumerate(grad_queries):
    grad_query_ref[:, f, :] = dq.astype(grad_query_ref.dtype)
  for c in range(chunks):
    if grad_pre_ref is not None:
      grad_pre_ref[c * chunk:(c + 1) * chunk, :] = grad_pre[c]
    if grad_post_ref is not None:
      grad_post_ref[:, c * chunk:(c + 1) * chunk] = grad_post[c]


# ---- backward: per key tile (dK, dV) ---------------------------------------


def columns_kernel(problem, names, *refs):
  refs, (grad_key_ref, grad_value_ref) = tile_math.split_refs(names, refs)
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  k_tile = pl.program_id(1)
  k_start = k_tile * block_k

  def accumulate(t, carry):
    grad_keys, grad_values = carry
    q_start = pl.multiple_of(t * block_q, block_q)
    rows = pl.ds(q_start, block_q)
    tile = tile_math.make_tile(problem, refs, rows, slice(None), q_start,
                               k_start)
    stats = (refs.row_max[rows, :], refs.inverse_sum[rows, :])
    _, weights, _, grad_logits = _backward_tile(
        problem, refs, tile, stats, refs.rowsum[rows, :])
    mixed = tile_math.tile_mixed(problem, refs, weights)
    grad_dots = tile_math.tile_grad_dots(problem, refs, grad_logits)
    grad_keys = [dk + tile_math.dot(problem, g.astype(refs.query.dtype),
                                    refs.query[rows, f, :], 0, 0)
                 for f, (dk, g) in enumerate(zip(grad_keys, grad_dots))]
    grad_values = [dv + tile_math.dot(problem, u.astype(refs.grad_out.dtype),
                                      refs.grad_out[rows, j, :], 0, 0)
                   for j, (dv, u) in enumerate(zip(grad_values, mixed))]
    return grad_keys, grad_values

  start = (_zeros(block_k, refs.key.shape[-1], problem.key_heads),
           _zeros(block_k, refs.value.shape[-1], problem.value_heads))
  grad_keys, grad_values = lax.fori_loop(
      tile_math.causal_query_tile_start(problem, k_tile), problem.query_tiles,
      accumulate, start)
  for f, dk in enumerate(grad_keys):
    grad_key_ref[:, f, :] = dk.astype(grad_key_ref.dtype)
  for j, dv in enumerate(grad_values):
    grad_value_ref[:, j, :] = dv.astype(grad_value_ref.dtype)
