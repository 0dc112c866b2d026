"""Talking heads at FlashAttention's memory: a Pallas kernel for JAX.

Computes talking-heads attention's core from the per-head queries, keys
and values, tile by tile over the keys, without ever holding the logits L,
the weights W or the mixed weights U beyond one [block_q, block_k] tile per
head (letters as in `thattn.core.dims`; per example b):

    J[h_k, n, m] = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]   = einsum(J, P_l[h_k, h]) + bias[h, n, m]; masked: -1e9
    W[h, n, m]   = softmax(L, reduced_dim=m)                 # float32
    U[h_v, n, m] = einsum(W, P_w[h, h_v])
    O[n, h_v, d_v] = einsum(U, V[m, h_v, d_v])

Every tile holds all heads of its query rows, since P_l and P_w mix across
heads. P_l or P_w may be absent (weights-only / logits-only: the
identity).

How a program holds a tile: the per-head products with Q, K, V and dO are
2-D matrix products per head, [Bq, d] x [d, Bk] and [Bq, Bk] x [Bk, d],
as in multi-head FlashAttention. Everything between them is one float32
array of all heads, [Bq, Bk, H] with H = max(h_k, h, h_v) padded to a
power of two >= 16 (the padding heads are zero and stay out of every
result). The head mixes are then matrix products on the tensor cores: the
tile seen as [Bq Bk, H] times P_l, P_w or a transpose, in chunks of 8
heads (the least contraction a tensor core takes in TF32), and the
softmax statistics are reductions over the key axis of that array. The
per-head tiles go in and out of it by a tree of joins and splits, the only
way Pallas's Triton backend stacks arrays, one chunk at a time. So a
program holds O(h) products and no loop over heads: its length grows
linearly in the heads (benchmarks/pallas_compile.py counts it).

Algorithm (Bq, Bk: the tile sizes; per batch element and query tile):

  forward   pass 1 over key tiles: J, L; per softmax head the running row
              maximum and sum of exp (online softmax) -> max[h, n], sum[h, n]
            pass 2 over key tiles: J, L, W = exp(L - max) / sum, U, O += U V
  backward  per query tile ("row sums"), over key tiles: J, L, W,
              dU = dO V^T, dW = dU P_w^T; D[h, n] = sum_m W dW,
              dP_w += W^T dU
            per query tile ("logits pair sums", with P_l): dU, dW, J, L,
              W, dL = W (dW - D) (zero where masked); dP_l += J^T dL
            per query tile ("rows"): dU, dW, J, L, W, dL, dJ = dL P_l^T;
              dQ += dJ K (and dbias = dL)
            per key tile ("key columns"), over query tiles: the same;
              dK += dJ^T Q
            per key tile ("value columns"), over query tiles: J, L, W,
              U; dV += U^T dO
            (`pallas_programs`)

Why the backward takes five programs and passes where FlashAttention
takes one or two: registers. A program keeps an accumulator per key or
value head ([Bq, d] float32 each: dQ, dK or dV), and a pair sum (dP_l or
dP_w, a matrix product that contracts the tile's Bq Bk pairs) holds both
its operands whole on every warp while it runs. Either beside the other,
or two accumulator sets together, spill registers at h = 12
(benchmarks/RESULTS.md, "The Pallas kernel's third design"), and so do
the two pair sums' passes in one program at h = 24; so each program has
one accumulator set or one pair sum, and a pair sum's operands are made
last in its pass (dU for dP_w, J for dP_l), so they are held across as
little as possible. Recomputing a tile costs multiply-adds; spilling
costs memory traffic in every iteration.

Slices of heads (`Tiles.heads_per_program`; by default 16 above 16
heads). A [16, d] float32 accumulator takes 4 registers of every thread
for any d <= 64 (a tensor core's output tile is 16 x 8), so at h = 24
the accumulators alone take 96 of a thread's 255, and at h = 48, 192.
With slices, the forward's O and the backward's dQ are made by one
program per slice of 16 heads (dK and dV per slice of 32: their
accumulators have Bk = 8 rows), each recomputing the tiles of every head
that its slice's outputs mix; the forward's first pass becomes a
statistics program of its own, and the row sums make dU's chunks again
for dP_w rather than hold them from dW's mix.

Why two forward passes: multi-head FlashAttention rescales its running
output per head when the row maximum moves; here every output head mixes
all softmax heads, each with its own maximum, so the output could only be
rescaled by keeping [h, h_v, d_v] per query row. One cheap pass for the
row statistics instead, as the backward pass needs them anyway. Why D
needs a pass: FlashAttention gets D = rowsum(dO * O) for free, but with
P_w the row sum is sum_m W_h dW_h, which O does not determine.

Cost per (query, key) pair, with a = h_k d_k, e = h_v d_v, and the
padded head mixes c_l = 8 ceil(h_k / 8) H and c_w = 8 ceil(h_v / 8) H
(256 at 8 < h <= 16): multiply-adds on the tensor cores in the input
dtype (mm) and in TF32 (mix, pair sums included; float32 inputs: full
float32), exp, and passes over the keys and values (K/V):

  |                 | mm                          | mix         | exp | K/V |
  |-----------------|-----------------------------|-------------|-----|-----|
  | MHA flash fwd   | a + e                       | -           | h   | 1   |
  | TH fwd          | 2a + e                      | 2c_l + c_w  | 2h  | 2   |
  | MHA flash bwd   | 3a + 2e (dQ by atomics),    | -           | h   | 1   |
  |                 | 4a + 3e (a dQ kernel apart) |             | 2h  | 2   |
  | TH bwd          | 7a + 5e                     | 8c_l + 6c_w | 5h  | 5   |
  | TH fwd, h = 24  | 3a + e                      | 3c_l + c_w  | 3h  | 3   |
  | TH bwd, h = 24  | 8a + 7e                     | 9c_l + 7c_w | 6h  | 6   |

(The last two rows: two slices of 16 heads for O and dQ, one of 32 for
dK and dV, dU made again for dP_w. Without P_l the logits-pair-sums
program is not run: 6a + 4e. The backward's column programs pass over Q
and dO, per key tile.) At h = 12, d = 64: a = e = 768 and c_l = c_w =
256, so the forward's mixes are a third of its multiply-adds, at TF32's
rate (half bfloat16's on an H100): about 2.5x flash's forward in
tensor-core time, and the backward about 4x flash's (3a + 2e), before the
exps and the loads. At h = 24, d = 32: a = e = 768 and c_l = c_w = 768
(three chunks of 8 heads, H = 32), so the mixes outweigh the per-head
products, and the slices add a third to the forward's work and a fifth
to the backward's, the price of spilling nothing.

Memory traffic: Q, K, V, dO, O and the [n, H] statistics, read once per
pass (K and V once per query tile, as FlashAttention); nothing of size
[h, n, m] unless a dense `bias` is given (then the bias and its gradient
are, since the caller made it). Extra memory: the row maxima, reciprocal
row sums and D, [b, n, H] float32 each, and the [b, n/Bq, H, H] partial
sums of dP_l and dP_w (the statistics are kept apart, not as one
log-sum-exp: in float32, -1e9 + log(m) is -1e9, which would lose the m of
a fully masked row).

What a program keeps in registers: its accumulators (Bq x width float32
in all, or a slice's: O, dQ, dK or dV), a few [Bq, Bk, H] float32 arrays
(L, W, dW, dL), one chunk's per-head tiles, and the chunk stacks that
feed the mixes. That is more than FlashAttention's program keeps for one
head, so the tiles have the fewest pairs a matrix product allows (16
query rows by 8 keys, `pallas_tiles.default_tiles`). Compiled for an
H100 by Triton at width 768, no program spills at h = 4, 12, 16 or 24;
at h = 8 (whose head size pads from 96 to 128) the forward and rows
programs spill 272 bytes in all (benchmarks/RESULTS.md, "Slices of 16
heads").

Inputs: `query[b, n, h_k, d_k]`, `key[b, m, h_k, d_k]`,
`value[b, m, h_v, d_v]` in float32, bfloat16 or float16 (matrix products
accumulate in float32; the softmax is float32, and the mixes take float32
operands, through a GPU's TF32 tensor cores unless the inputs are
float32); `pre`
P_l[h_k, h] and `post` P_w[h, h_v] (float32) or None; `mask`: None, a
[b or 1, m] key mask or a [b or 1, n, m] mask (True: may attend);
`causal` with a static `causal_offset` (query i sees keys <= i + offset);
`bias[b or 1, h, n, m]` added to L. Masked logits are -1e9, as in the
keras.ops path, so a fully masked row is uniform over the m keys.

Runs where `jax.experimental.pallas` lowers: a GPU (through Triton), or
anywhere with `interpret=True` (CPU tests; `THATTN_PALLAS=interpret`).
Not tried on a TPU (the joins and splits are Triton's operations).
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from thattn.kernels import pallas_launch as launch
from thattn.kernels import pallas_programs
from thattn.kernels import pallas_tiles


def _forward(problem, query, key, value, pre, post, mask, bias):
  """(O, row maxima, reciprocal row sums): one program per query tile, or
  with slices of the value heads, a statistics program and then one per
  slice (each would otherwise repeat the statistics' pass)."""
  row_stats, row_stats_spec = launch.row_table(problem)
  arrays = dict(query=query, key=key, value=value, pre=pre, post=post,
                mask=mask, bias=bias)
  # O is [b, n, h_v, d_v]: the queries' length, the values' heads.
  like = jax.ShapeDtypeStruct((problem.batch, problem.length_padded) +
                              value.shape[2:], value.dtype)
  slices = pallas_tiles.head_slices(problem, problem.value_heads,
                                    problem.tiles.block_q)
  if len(slices) == 1:
    out_shape, out_spec = launch.heads_block(problem, like, slices[0],
                                             "rows")
    return launch.call(problem, pallas_programs.forward_kernel, "rows",
                       arrays, (out_shape, row_stats, row_stats),
                       (out_spec, row_stats_spec, row_stats_spec),
                       heads=slices[0])
  row_max, inverse_sum = launch.call(
      problem, pallas_programs.statistics_kernel, "rows",
      dict(arrays, value=None, post=None), (row_stats, row_stats),
      (row_stats_spec, row_stats_spec))
  arrays.update(row_max=row_max, inverse_sum=inverse_sum)
  out = launch.over_head_slices(
      problem, like, "rows",
      lambda heads, shape, spec: launch.call(
          problem, pallas_programs.forward_kernel, "rows", arrays, (shape,),
          (spec,), heads=heads)[0])
  return out, row_max, inverse_sum


def _row_sums(problem, arrays):
  """(D [b, n, H], dP_w or None) from the row-sums program."""
  table, table_spec = launch.row_table(problem)
  out_shapes, out_specs = [table], [table_spec]
  if problem.has_post:
    shape, spec = launch.pair_sum_table(problem, problem.query_tiles)
    out_shapes.append(shape)
    out_specs.append(spec)
  outputs = launch.call(problem, pallas_programs.row_sums_kernel, "rows",
                        arrays, tuple(out_shapes), tuple(out_specs))
  grad_post = launch.sum_pair_sums(outputs[1]) if problem.has_post else None
  return outputs[0], grad_post


def _logits_pair_sums(problem, arrays):
  """dP_l, from a program per query tile (given D)."""
  shape, spec = launch.pair_sum_table(problem, problem.query_tiles)
  return launch.sum_pair_sums(launch.call(
      problem, pallas_programs.logits_pair_sums_kernel, "rows", arrays,
      shape, spec))


def _row_gradients(problem, arrays):
  """(dQ, dbias or None) from the rows programs, one per slice of the key
  heads; the first also writes dbias."""
  query, bias = arrays["query"], arrays["bias"]
  n, m, block_q = problem.length_padded, problem.memory_padded, \
      problem.tiles.block_q
  grad_bias = []

  def launch_slice(heads, shape, spec):
    out_shapes, out_specs = [shape], [spec]
    if bias is not None and heads[0] == 0:
      out_shapes.append(jax.ShapeDtypeStruct(
          (problem.batch, problem.heads, n, m), jnp.float32))
      out_specs.append(pl.BlockSpec((None, problem.heads, block_q, m),
                                    lambda b, i: (b, 0, i, 0)))
    outputs = launch.call(problem, pallas_programs.rows_kernel, "rows",
                          arrays, tuple(out_shapes), tuple(out_specs),
                          heads=heads)
    grad_bias.extend(outputs[1:])
    return outputs[0]

  grad_query = launch.over_head_slices(problem, query, "rows", launch_slice)
  if bias is None:
    return grad_query, None
  grad_bias = grad_bias[0]
  if not problem.bias_batched:
    grad_bias = grad_bias.sum(axis=0, keepdims=True)
  return grad_query, grad_bias.astype(bias.dtype)


def _column_gradient(problem, kernel, arrays, like):
  """The gradient shaped `like`, [b, m, heads, d], from programs per key
  tile (one per slice of the heads)."""
  return launch.over_head_slices(
      problem, like, "columns",
      lambda heads, shape, spec: launch.call(problem, kernel, "columns",
                                             arrays, shape, spec,
                                             heads=heads))


def _backward(problem, residuals, grad_out):
  """The gradients, by five programs (and slices of them), each holding
  as few accumulators as it can (a Triton program spills registers as
  they grow: benchmarks/RESULTS.md): D and dP_w per query tile; dP_l per
  query tile; dQ and dbias per query tile; dK per key tile; dV per key
  tile."""
  query, key, value, pre, post, mask, bias, row_max, inverse_sum = residuals
  arrays = dict(query=query, key=key, value=value, pre=pre, post=post,
                mask=mask, bias=bias, row_max=row_max,
                inverse_sum=inverse_sum, grad_out=grad_out)
  arrays["rowsum"], grad_post = _row_sums(problem, arrays)
  grad_pre = _logits_pair_sums(problem, arrays) if problem.has_pre else None
  grad_query, grad_bias = _row_gradients(problem, arrays)
  grad_key = _column_gradient(problem, pallas_programs.key_columns_kernel,
                              arrays, key)
  # dV needs W only: no D, no dO V^T.
  grad_value = _column_gradient(
      problem, pallas_programs.value_columns_kernel,
      dict(arrays, value=None, rowsum=None), value)
  return grad_query, grad_key, grad_value, grad_pre, grad_post, grad_bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(problem, query, key, value, pre, post, mask, bias):
  return _forward(problem, query, key, value, pre, post, mask, bias)[0]


def _attention_forward(problem, query, key, value, pre, post, mask, bias):
  out, row_max, inverse_sum = _forward(problem, query, key, value, pre, post,
                                       mask, bias)
  return out, (query, key, value, pre, post, mask, bias, row_max,
               inverse_sum)


def _attention_backward(problem, residuals, grad_out):
  grads = _backward(problem, residuals, grad_out)
  grad_query, grad_key, grad_value, grad_pre, grad_post, grad_bias = grads
  return (grad_query, grad_key, grad_value, grad_pre, grad_post, None,
          grad_bias)


_attention.defvjp(_attention_forward, _attention_backward)


# ---- the public entry point ------------------------------------------------


def _round_up(size, multiple):
  return -(-size // multiple) * multiple


def _feature_size(size):
  """Head sizes padded to a power of two, at least 16 (a GPU matrix
  product's smallest side); zeros change no dot product."""
  return pallas_tiles.power_of_two(size, 16)


def _pad(array, sizes):
  pads = [(0, size - dim) for dim, size in zip(array.shape, sizes)]
  if all(after == 0 for _, after in pads):
    return array
  return jnp.pad(array, pads)


def check_inputs(query, key, value, pre, post, mask, bias, causal_offset):
  """ValueError naming what does not fit; the heads (h_k, h, h_v)."""
  if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
    raise ValueError(
        f"talking-heads kernel: query, key and value must be [batch, length, "
        f"heads, head size], got shapes {query.shape}, {key.shape}, "
        f"{value.shape}.")
  b, _, h_k, d_k = query.shape
  if key.shape[0] != b or key.shape[2:] != (h_k, d_k):
    raise ValueError(f"talking-heads kernel: key shape {key.shape} does not "
                     f"match query shape {query.shape} (batch, h_k, d_k).")
  if value.shape[:2] != key.shape[:2]:
    raise ValueError(f"talking-heads kernel: value shape {value.shape} does "
                     f"not match key shape {key.shape} (batch, memory).")
  if query.dtype != key.dtype or key.dtype != value.dtype or not any(
      query.dtype == dtype for dtype in pallas_tiles.DTYPES):
    raise ValueError(
        f"talking-heads kernel: query, key and value must share one of "
        f"float32, bfloat16, float16, got {query.dtype}, {key.dtype}, "
        f"{value.dtype}.")
  heads = h_k if pre is None else pre.shape[-1]
  if pre is not None and pre.shape != (h_k, heads):
    raise ValueError(f"talking-heads kernel: P_l has shape {pre.shape}, "
                     f"expected [h_k={h_k}, h].")
  h_v = value.shape[2]
  if post is not None and post.shape != (heads, h_v):
    raise ValueError(f"talking-heads kernel: P_w has shape {post.shape}, "
                     f"expected [h={heads}, h_v={h_v}].")
  if post is None and heads != h_v:
    raise ValueError(f"talking-heads kernel: without P_w, h={heads} must "
                     f"equal h_v={h_v}.")
  n, m = query.shape[1], key.shape[1]
  if mask is not None and not (
      (mask.ndim == 2 and mask.shape[0] in (1, b) and mask.shape[1] == m) or
      (mask.ndim == 3 and mask.shape[0] in (1, b) and mask.shape[1:] ==
       (n, m))):
    raise ValueError(f"talking-heads kernel: mask has shape {mask.shape}, "
                     f"expected [{b} or 1, m={m}] or [{b} or 1, n={n}, "
                     f"m={m}].")
  if bias is not None and (bias.ndim != 4 or bias.shape[0] not in (1, b) or
                           bias.shape[1:] != (heads, n, m)):
    raise ValueError(f"talking-heads kernel: bias has shape {bias.shape}, "
                     f"expected [{b} or 1, h={heads}, n={n}, m={m}].")
  if not isinstance(causal_offset, int) or isinstance(causal_offset, bool):
    raise ValueError(f"talking-heads kernel: causal_offset must be a Python "
                     f"int (static), got {causal_offset!r}.")
  return h_k, heads, h_v


def talking_heads_attention(query, key, value, pre=None, post=None, *,
                            mask=None, bias=None, causal=False,
                            causal_offset=0, tiles=None, interpret=False):
  """O[b, n, h_v, d_v] of talking heads, by the Pallas kernel.

  Args:
    query: Q[b, n, h_k, d_k]; key: K[b, m, h_k, d_k]; value: V[b, m, h_v,
      d_v]; one dtype of float32, bfloat16, float16.
    pre: P_l[h_k, h] or None; post: P_w[h, h_v] or None (computed in
      float32).
    mask: None, [b or 1, m] or [b or 1, n, m], boolean or 0/1 (True: may
      attend).
    bias: [b or 1, h, n, m] added to the logits (T5's relative position
      bias), or None. Differentiable.
    causal, causal_offset: query i attends keys j <= i + causal_offset.
    tiles: `Tiles`, or None for `default_tiles` of the largest head count.
    interpret: run in Pallas's interpret mode (any platform, slowly).
  """
  h_k, heads, h_v = check_inputs(query, key, value, pre, post, mask, bias,
                                 causal_offset)
  tiles = tiles or pallas_tiles.default_tiles(max(h_k, heads, h_v))
  b, n, _, d_k = query.shape
  m, d_v = key.shape[1], value.shape[3]
  n_padded = _round_up(n, tiles.block_q)
  m_padded = _round_up(m, tiles.block_k)
  mask_kind = "none" if mask is None else ("keys" if mask.ndim == 2 else
                                           "full")
  problem = pallas_tiles.Problem(
      batch=b, key_heads=h_k, heads=heads, value_heads=h_v, length=n,
      memory=m, length_padded=n_padded, memory_padded=m_padded,
      has_pre=pre is not None, has_post=post is not None,
      mask_kind=mask_kind,
      mask_batched=mask is not None and mask.shape[0] == b and b > 1,
      bias_batched=None if bias is None else (bias.shape[0] == b and b > 1),
      causal=bool(causal), causal_offset=causal_offset, tiles=tiles,
      interpret=bool(interpret),
      float32_inputs=query.dtype == jnp.float32)
  d_k_padded, d_v_padded = _feature_size(d_k), _feature_size(d_v)
  query = _pad(query, (b, n_padded, h_k, d_k_padded))
  key = _pad(key, (b, m_padded, h_k, d_k_padded))
  value = _pad(value, (b, m_padded, h_v, d_v_padded))
  # P_l and P_w as [H, H] matrices, zero beyond the real heads.
  size = problem.mix_heads
  if pre is not None:
    pre = _pad(jnp.asarray(pre, jnp.float32), (size, size))
  if post is not None:
    post = _pad(jnp.asarray(post, jnp.float32), (size, size))
  if mask is not None:
    mask = jnp.asarray(mask).astype(jnp.int8)
    sizes = ((mask.shape[0], m_padded) if mask_kind == "keys" else
             (mask.shape[0], n_padded, m_padded))
    mask = _pad(mask, sizes)
  if bias is not None:
    bias = _pad(bias, (bias.shape[0], heads, n_padded, m_padded))
  out = _attention(problem, query, key, value, pre, post, mask, bias)
  return out[:, :n, :, :d_v]
