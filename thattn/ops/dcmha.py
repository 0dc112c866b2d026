"""Dynamically composable multi-head attention (DCMHA; Xiao et al., 2024,
"Improving Transformers with Dynamically Composable Multi-Head
Attention", ICML), written once for both front ends over an ops namespace
(`keras.ops`, `thattn.ops.tf_ops.TF_OPS`), as the released inference path
of the authors' DCFormer and DCPythia computes it (docs/family_sources.md,
section 1). Letters follow `thattn.core.dims`: u the two compose stages
(pre-softmax 0, post-softmax 1), z the dynamic weights' hidden units C, y
their rank R, a the positions of either side; in a compose, i counts the
heads mixed from and h those mixed into (h_k = h = h_v).

Each position's input, X[b, n, d_X] on the queries' side and M[b, m, d_M]
on the keys', makes the dynamic weights of its side, for both stages::

    H[b, a, u, z]     = gelu(einsum(Z[b, a, d], D_1[d, u, z]))   (exact erf)
    F[b, a, u, 2y, h] = einsum(H, Q_kw[u, z, 2y, h])
    w_1, w_2          = RMSNorm_h(F[..., :R, :]), F[..., R:, :]   (no scale,
                                                                eps 1e-6)
    g[b, a, u, h]     = tanh(einsum(Z[b, a, d], D_d[d, u, h]))

with the side's two slots of the weights (`QUERY_SLOTS`, `KEY_SLOTS`:
the released order is pre/query, pre/key, post/query, post/key). A
stage's compose, on the logits J[b, i, n, m] (scaled, before the mask)
and on the probabilities W (after the softmax, never renormalized), mixes
each query-key pair's heads::

    Y[b, h, n, m] = X[b, h, n, m] + einsum(X, S[u, i, h])           (static)
                  + sum_y qw_2[b, n, y, h] sum_i qw_1[b, n, y, i] X[b, i, n, m]
                  + sum_y kw_2[b, m, y, h] sum_i kw_1[b, m, y, i] X[b, i, n, m]
                  + (qg[b, n, h] + kg[b, m, h]) X[b, h, n, m]

A decoding cache keeps the keys' side as one [i, h] matrix per key and
stage, the identity (and S) folded in, as the authors' `KVKWCache` does:
KW[b, m, u, i, h] = sum_y kw_1[y, i] kw_2[y, h] + diag(kg) + I + S; the
compose then reads it in place of the factors. With Q_kw's w_2 half and
D_d at zero the compose is the identity: DCMHA is multi-head attention.
"""

from thattn.core import attention_spec
from thattn.ops import blocks

# The slots of the weights' 4-axis (D_1's, Q_kw's and D_d's) each side
# reads, as (pre-softmax, post-softmax): the released order is pre/query,
# pre/key, post/query, post/key.
QUERY_SLOTS = slice(0, None, 2)
KEY_SLOTS = slice(1, None, 2)
# The RMSNorm of w_1 over the heads: the authors' epsilon, no scale.
FACTOR_NORM_EPSILON = 1e-6


def dynamic_weights(ops, inputs, kernels, slots, rank):
  """One side's (w_1[b, a, u, y, h], w_2[b, a, u, y, h], g[b, a, u, h])
  from Z[b, a, d] and the `slots` (`QUERY_SLOTS` or `KEY_SLOTS`) of the
  kernels (D_1[d, 4, z], Q_kw[4, z, 2y, h], D_d[d, 4, h]). w_1's RMSNorm
  runs in float32; the rest in Z's dtype."""
  hidden_kernel, factor_kernel, gate_kernel = (
      ops.cast(kernel, inputs.dtype) for kernel in kernels)
  hidden_kernel = hidden_kernel[:, slots]
  factor_kernel = factor_kernel[slots]
  gate_kernel = gate_kernel[:, slots]
  hidden = ops.gelu(ops.einsum("bad,duz->bauz", inputs, hidden_kernel),
                    approximate=False)
  factors = ops.einsum("bauz,uzyh->bauyh", hidden, factor_kernel)
  first = blocks.rms_norm(ops, factors[:, :, :, :rank], 1.0,
                          FACTOR_NORM_EPSILON, factors.dtype)
  second = factors[:, :, :, rank:]
  gates = ops.tanh(ops.einsum("bad,duh->bauh", inputs, gate_kernel))
  return first, second, gates


def key_mixing_matrices(ops, first, second, gates, static_mix=None):
  """KW[b, m, u, i, h] = sum_y w_1[y, i] w_2[y, h] + diag(g) + I (+ S[u,
  i, h]): the keys' side of each stage's compose as one matrix per key, the
  identity folded in, from the key factors `dynamic_weights` made."""
  num_heads = gates.shape[-1]
  eye = ops.eye(num_heads, dtype=gates.dtype)
  mix = (ops.einsum("bmuyi,bmuyh->bmuih", first, second) +
         ops.expand_dims(gates, -1) * eye + eye)
  if static_mix is not None:
    mix = mix + ops.cast(static_mix, mix.dtype)
  return mix


def cached_memory_state(ops, memory_state, static_mix=None):
  """The memory state a decoding cache keeps: K, V and each key's mixing
  matrices KW[b, m, u, i, h] in place of its factors."""
  factors = attention_spec.KEY_COMPOSE_FACTORS
  state = {name: tensor for name, tensor in memory_state.items()
           if name not in factors}
  state[attention_spec.KEY_COMPOSE_MIX] = key_mixing_matrices(
      ops, *(memory_state[name] for name in factors), static_mix=static_mix)
  return state


def compose(ops, scores, stage, query_state, memory_state, static_mix=None):
  """Y[b, h, n, m] from X[b, i, n, m] (J at stage 0, W at stage 1): the
  identity, the static S[u, i, h]'s stage where there is one, the
  query-wise and the key-wise terms (from the key factors, or from a
  cache's KW, which holds the identity and S)."""
  dtype = scores.dtype
  query_first, query_second, query_gates = (
      ops.cast(query_state[name][:, :, stage], dtype)
      for name in attention_spec.QUERY_COMPOSE_FACTORS)
  queries = ops.einsum("binm,bnyi->bnmy", scores, query_first)
  mixed = (ops.einsum("bnmy,bnyh->bhnm", queries, query_second) +
           scores * ops.expand_dims(ops.transpose(query_gates, (0, 2, 1)),
                                    -1))
  if attention_spec.KEY_COMPOSE_MIX in memory_state:
    key_mix = ops.cast(
        memory_state[attention_spec.KEY_COMPOSE_MIX][:, :, stage], dtype)
    return mixed + ops.einsum("binm,bmih->bhnm", scores, key_mix)
  key_first, key_second, key_gates = (
      ops.cast(memory_state[name][:, :, stage], dtype)
      for name in attention_spec.KEY_COMPOSE_FACTORS)
  keys = ops.einsum("binm,bmyi->bnmy", scores, key_first)
  mixed = (mixed + scores +
           ops.einsum("bnmy,bmyh->bhnm", keys, key_second) +
           scores * ops.expand_dims(ops.transpose(key_gates, (0, 2, 1)), 2))
  if static_mix is not None:
    mixed = mixed + ops.einsum("binm,ih->bhnm", scores,
                               ops.cast(static_mix[stage], dtype))
  return mixed
