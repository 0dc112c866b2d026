"""Launching the Pallas talking-heads kernel's programs: the BlockSpecs
of each input on a grid of (batch, query or key tiles), the pallas_call
with Triton's options, and the shapes of what programs write: [b, n, H]
row tables, [b, tiles, H, H] partial pair sums, and per-head outputs made
a slice of heads at a time (`pallas_tiles.head_slices`). What the kernel
computes, and in which programs, is in `thattn.kernels.pallas_kernel`;
letters as in `thattn.core.dims`.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.kernels import pallas_tiles


def _block_specs(problem, arrays, along):
  """(names, arrays, BlockSpecs) of a kernel's inputs on the grid
  (batch, tile), where `along` says whether the grid's tiles run over the
  queries ("rows") or the keys ("columns")."""
  block_q, block_k = problem.tiles.block_q, problem.tiles.block_k
  n, m = problem.length_padded, problem.memory_padded
  rows_block = block_q if along == "rows" else n
  cols_block = block_k if along == "columns" else m

  def row_tile(i):
    return i if along == "rows" else 0

  def col_tile(i):
    return i if along == "columns" else 0

  names, inputs, specs = [], [], []
  for name in pallas_tiles.INPUT_ORDER:
    array = arrays.get(name)
    if array is None:
      continue
    if name in ("query", "grad_out"):
      spec = pl.BlockSpec((None, rows_block) + array.shape[2:],
                          lambda b, i: (b, row_tile(i), 0, 0))
    elif name in ("key", "value"):
      spec = pl.BlockSpec((None, cols_block) + array.shape[2:],
                          lambda b, i: (b, col_tile(i), 0, 0))
    elif name in ("pre", "post"):
      spec = pl.BlockSpec(array.shape, lambda b, i: (0, 0))
    elif name == "mask" and problem.mask_kind == "keys":
      spec = pl.BlockSpec((None, cols_block), lambda b, i: (
          b if problem.mask_batched else 0, col_tile(i)))
    elif name == "mask":
      spec = pl.BlockSpec((None, rows_block, cols_block), lambda b, i: (
          b if problem.mask_batched else 0, row_tile(i), col_tile(i)))
    elif name == "bias":
      spec = pl.BlockSpec(
          (None, problem.heads, rows_block, cols_block),
          lambda b, i: (b if problem.bias_batched else 0, 0, row_tile(i),
                        col_tile(i)))
    else:  # row_max, inverse_sum, rowsum: [b, n, H]
      spec = pl.BlockSpec((None, rows_block, problem.mix_heads),
                          lambda b, i: (b, row_tile(i), 0))
    names.append(name)
    inputs.append(array)
    specs.append(spec)
  return tuple(names), inputs, specs


def call(problem, kernel, along, arrays, out_shapes, out_specs, heads=None):
  """Launches `kernel` on the grid (batch, query or key tiles), for the
  heads in `heads` (a [start, stop) range) where the kernel takes them."""
  names, inputs, in_specs = _block_specs(problem, arrays, along)
  tiles = problem.query_tiles if along == "rows" else problem.key_tiles
  params = {}
  # GPUs lower through Triton, named by its options (without them Pallas
  # may pick its Mosaic GPU backend, which this kernel is not written for).
  if not problem.interpret and jax.default_backend() != "tpu":
    from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
    params["compiler_params"] = plgpu.CompilerParams(
        num_warps=problem.tiles.num_warps,
        num_stages=problem.tiles.num_stages)
  name = f"thattn_talking_heads_{kernel.__name__.strip('_')}"
  body = functools.partial(kernel, problem, names)
  if heads is not None:
    body = functools.partial(body, heads=heads)
    if problem.tiles.heads_per_program is not None:
      name += f"_heads_{heads[0]}_{heads[1]}"
  return pl.pallas_call(
      body, grid=(problem.batch, tiles), in_specs=in_specs,
      out_specs=out_specs, out_shape=out_shapes,
      interpret=problem.interpret, name=name, **params)(*inputs)


def row_table(problem):
  """The shape and BlockSpec of a [b, n, H] float32 table of
  per-row values, tiled over the queries."""
  shape = jax.ShapeDtypeStruct(
      (problem.batch, problem.length_padded, problem.mix_heads),
      jnp.float32)
  return shape, pl.BlockSpec((None, problem.tiles.block_q,
                              problem.mix_heads), lambda b, i: (b, i, 0))


def _tile_length(problem, along):
  """Bq for programs per query tile ("rows"), Bk per key tile
  ("columns")."""
  return problem.tiles.block_q if along == "rows" else problem.tiles.block_k


def heads_block(problem, like, heads, along):
  """The shape and BlockSpec of a program's output shaped `like`, [b, n
  or m, heads, d], for the heads in `heads` only, tiled over the queries
  ("rows") or keys ("columns")."""
  block = _tile_length(problem, along)
  shape = (like.shape[0], like.shape[1], heads[1] - heads[0], like.shape[3])
  return (jax.ShapeDtypeStruct(shape, like.dtype),
          pl.BlockSpec((None, block) + shape[2:], lambda b, i: (b, i, 0, 0)))


def over_head_slices(problem, like, along, launch):
  """The [b, length, heads, d] output shaped `like`, from one launch per
  slice of its heads (`pallas_tiles.head_slices`): launch(heads, shape,
  spec) returns the slice's [b, length, stop - start, d] part."""
  parts = [launch(heads, *heads_block(problem, like, heads, along))
           for heads in pallas_tiles.head_slices(
               problem, like.shape[2], _tile_length(problem, along))]
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=2)


def pair_sum_table(problem, tiles):
  """The shape and BlockSpec of [b, tiles, H, H] float32 partial sums of
  dP_l or dP_w, one per program."""
  size = problem.mix_heads
  return (jax.ShapeDtypeStruct((problem.batch, tiles, size, size),
                               jnp.float32),
          pl.BlockSpec((None, None, size, size), lambda b, i: (b, i, 0, 0)))


def sum_pair_sums(partial):
  """dP_l or dP_w from its per-program partial sums: [H, H] as the padded
  P_l and P_w (the padding's gradient is dropped by jnp.pad's)."""
  return partial.sum(axis=(0, 1))
