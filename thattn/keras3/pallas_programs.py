"""The programs of thattn's Pallas talking-heads kernel: what one cell of
the grid runs: the forward pass per query tile; the backward pass per
query tile (D, then dQ, dP_l, dP_w and dbias: two programs, as a Triton
program's compile time grows faster than its length) and per key tile
(dK, dV).

The arithmetic of one tile is in `thattn.keras3.pallas_tiles`; the
algorithm, its cost and the launching in `thattn.keras3.pallas_kernel`, the
entry point; letters as in `thattn.dims`. The softmax heads g run in a loop
(`over_heads`); the key heads f and the value heads j are unrolled, as
their tiles live in registers.
"""

from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.keras3 import pallas_tiles as tile_math


# ---- forward ---------------------------------------------------------------


def forward_kernel(problem, names, *refs):
  refs, (out_ref, max_ref, inverse_sum_ref) = tile_math.split_refs(names, refs)
  block_q = problem.tiles.block_q
  q_tile = pl.program_id(1)
  q_start = q_tile * block_q
  end = tile_math.causal_key_tile_end(problem, q_tile)

  def statistics(t, carry):
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)

    def head(g, carry):
      maxima, sums = carry
      logits = tile_math.head_logits(problem, refs, tile, g)
      old_max, old_sum = tile_math.column(maxima, g), tile_math.column(sums, g)
      new_max = jnp.maximum(old_max, jnp.max(logits, axis=1))
      new_sum = (old_sum * jnp.exp(old_max - new_max) +
                 jnp.sum(jnp.exp(logits - new_max[:, None]), axis=1))
      return (tile_math.with_column(maxima, g, new_max),
              tile_math.with_column(sums, g, new_sum))

    return tile_math.over_heads(problem, head, carry)

  table = (block_q, problem.heads_padded)
  maxima, sums = lax.fori_loop(
      0, end, statistics, (jnp.full(table, -jnp.inf, jnp.float32),
                           jnp.zeros(table, jnp.float32)))
  # The padding heads' sums stay 0 and their reciprocals inf; no head reads
  # them.
  stats = (maxima, 1.0 / sums)

  def accumulate(t, outputs):
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t)

    def head(g, mixed):
      logits = tile_math.head_logits(problem, refs, tile, g)
      weights = tile_math.head_weights(logits, stats, g)
      return tile_math.spread_from_head(mixed, weights, refs.post, g)

    mixed = tile_math.over_heads(
        problem, head, tile_math.zero_tiles(problem, problem.value_heads))
    return [out + tile_math.dot(problem, u.astype(refs.value.dtype),
                                refs.value[tile.cols, j, :])
            for j, (out, u) in enumerate(zip(outputs, mixed))]

  d_v = refs.value.shape[-1]
  outputs = lax.fori_loop(
      0, end, accumulate,
      [jnp.zeros((block_q, d_v), jnp.float32)] * problem.value_heads)
  for j, out in enumerate(outputs):
    out_ref[:, j, :] = out.astype(out_ref.dtype)
  max_ref[...] = stats[0]
  inverse_sum_ref[...] = stats[1]


# ---- backward: per query tile (D; then dQ, dP_l, dP_w, dbias) --------------


def _zero_skipped_bias_gradient(problem, grad_bias_ref, end):
  """Writes the zero bias gradient of the key tiles a causal query tile
  skips (from `end` on): skipped, they would be left unwritten."""
  block_k = problem.tiles.block_k

  def zero(t, carry):
    cols = pl.ds(pl.multiple_of(t * block_k, block_k), block_k)

    def head(g, carry):
      grad_bias_ref[g, :, cols] = tile_math.zero_tiles(problem, 1)[0]
      return carry

    return tile_math.over_heads(problem, head, carry)

  lax.fori_loop(end, problem.key_tiles, zero, 0)


def _row_outputs(problem, outs):
  """(dQ, dP_l partial, dP_w partial, dbias) output refs; absent: None."""
  rest = list(outs[1:])
  grad_pre_ref = rest.pop(0) if problem.has_pre else None
  grad_post_ref = rest.pop(0) if problem.has_post else None
  grad_bias_ref = rest.pop(0) if problem.bias_batched is not None else None
  return outs[0], grad_pre_ref, grad_post_ref, grad_bias_ref


def _weights_and_grads(problem, refs, stats, tile, g):
  """(W_g, dW_g) of a tile."""
  logits = tile_math.head_logits(problem, refs, tile, g)
  return (tile_math.head_weights(logits, stats, g),
          tile_math.head_grad_weights(problem, refs, tile, g))


def _weights_and_grad_logits(problem, refs, stats, rowsum, tile, g):
  """(W_g, dL_g) of a tile, given the [Bq, heads_padded] table D."""
  weights, grad_weights = _weights_and_grads(problem, refs, stats, tile, g)
  return weights, tile_math.head_grad_logits(
      weights, grad_weights, tile_math.column(rowsum, g), tile.allowed)


def row_sums_kernel(problem, names, *refs):
  """D[:, g] = sum_m W_g dW_g of a query tile: [Bq, heads_padded]."""
  refs, (rowsum_ref,) = tile_math.split_refs(names, refs)
  q_tile = pl.program_id(1)
  q_start = q_tile * problem.tiles.block_q
  stats = (refs.row_max[...], refs.inverse_sum[...])

  def over_keys(t, rowsum):
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t, backward=True)

    def head(g, rowsum):
      weights, grad_weights = _weights_and_grads(problem, refs, stats, tile, g)
      row_sum = jnp.sum(weights * grad_weights, axis=1)
      return tile_math.add_at(rowsum, g, row_sum, axis=1)

    return tile_math.over_heads(problem, head, rowsum)

  rowsum_ref[...] = lax.fori_loop(
      0, tile_math.causal_key_tile_end(problem, q_tile), over_keys,
      jnp.zeros((problem.tiles.block_q, problem.heads_padded), jnp.float32))


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
    tile = tile_math.row_kernel_tile(problem, refs, q_start, t, backward=True)

    def head(g, carry):
      grad_dots, grad_pre, grad_post = carry
      weights, grad_logits = _weights_and_grad_logits(
          problem, refs, stats, rowsum, tile, g)
      if grad_bias_ref is not None:
        grad_bias_ref[g, :, tile.cols] = grad_logits
      if grad_pre is not None:  # dP_l[:, g] += J^T dL_g
        grad_pre = tile_math.add_at(grad_pre, g, tile_math.pair_sums(
            tile.dots, grad_logits, grad_pre.shape[0]), axis=1)
      if grad_post is not None:  # dP_w[g, :] += W_g^T dU
        grad_post = tile_math.add_at(grad_post, g, tile_math.pair_sums(
            tile.grad_mixed, weights, grad_post.shape[1]), axis=0)
      grad_dots = tile_math.spread_from_head(grad_dots, grad_logits, refs.pre,
                                             g, transposed=True)
      return grad_dots, grad_pre, grad_post

    grad_dots, grad_pre, grad_post = tile_math.over_heads(
        problem, head,
        (tile_math.zero_tiles(problem, problem.key_heads), grad_pre, grad_post))
    grad_queries = [dq + tile_math.dot(problem, g.astype(refs.key.dtype),
                                       refs.key[tile.cols, f, :])
                    for f, (dq, g) in enumerate(zip(grad_queries, grad_dots))]
    return grad_queries, grad_pre, grad_post

  d_k = refs.query.shape[-1]
  projections = tuple(
      None if ref is None else jnp.zeros(ref.shape, jnp.float32)
      for ref in (grad_pre_ref, grad_post_ref))
  grad_queries, grad_pre, grad_post = lax.fori_loop(
      0, end, gradients,
      ([jnp.zeros((block_q, d_k), jnp.float32)] * problem.key_heads,)
      + projections)
  for f, dq in enumerate(grad_queries):
    grad_query_ref[:, f, :] = dq.astype(grad_query_ref.dtype)
  for ref, total in ((grad_pre_ref, grad_pre), (grad_post_ref, grad_post)):
    if ref is not None:
      ref[...] = total


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
                               k_start, backward=True)
    stats = (refs.row_max[rows, :], refs.inverse_sum[rows, :])
    rowsum = refs.rowsum[rows, :]

    def head(g, carry):
      mixed, grad_dots = carry
      weights, grad_logits = _weights_and_grad_logits(
          problem, refs, stats, rowsum, tile, g)
      return (tile_math.spread_from_head(mixed, weights, refs.post, g),
              tile_math.spread_from_head(grad_dots, grad_logits, refs.pre, g,
                                         transposed=True))

    mixed, grad_dots = tile_math.over_heads(
        problem, head, (tile_math.zero_tiles(problem, problem.value_heads),
                        tile_math.zero_tiles(problem, problem.key_heads)))
    grad_keys = [dk + tile_math.dot(problem, g.astype(refs.query.dtype),
                                    refs.query[rows, f, :], 0, 0)
                 for f, (dk, g) in enumerate(zip(grad_keys, grad_dots))]
    grad_values = [dv + tile_math.dot(problem, u.astype(refs.grad_out.dtype),
                                      refs.grad_out[rows, j, :], 0, 0)
                   for j, (dv, u) in enumerate(zip(grad_values, mixed))]
    return grad_keys, grad_values

  d_k, d_v = refs.key.shape[-1], refs.value.shape[-1]
  start = ([jnp.zeros((block_k, d_k), jnp.float32)] * problem.key_heads,
           [jnp.zeros((block_k, d_v), jnp.float32)] * problem.value_heads)
  grad_keys, grad_values = lax.fori_loop(
      tile_math.causal_query_tile_start(problem, k_tile), problem.query_tiles,
      accumulate, start)
  for f, dk in enumerate(grad_keys):
    grad_key_ref[:, f, :] = dk.astype(grad_key_ref.dtype)
  for j, dv in enumerate(grad_values):
    grad_value_ref[:, j, :] = dv.astype(grad_value_ref.dtype)
