"""Float64 NumPy transcriptions of the head-interaction methods after
talking heads, written from their authors' code as docs/family_sources.md
restates it, not from thattn's layers.

- `differential_attention`: transformers' `DiffLlamaAttention.forward`
  (eager), in its own order: every map times the doubled-width values,
  then the halves split and subtracted (thattn subtracts the maps first).
- `dcmha_attention`: the DCFormer authors' prefill (`DCMHAttention.
  forward` with `CrossHeadProjection`), in the form of their decoding
  path: one [N, N] matrix per query-key pair and stage, I + QW_t + KW_s,
  applied to the logits and to the probabilities (thattn applies the
  low-rank factors without forming the matrices).

Letters as in numpy_reference.py; N counts the softmax maps, K is one
map's size. Weights in thattn's layouts: P_q[d_X, N, K],
P_k[d_M, N_kv, K], P_v[d_M, N_kv, K]; P_o is DiffLlama's o_proj as
[N K, d_Y] (input index j 2K + c: channel c of differential head j).
"""

import math

import numpy as np

MASKED_LOGIT = -1e9


def differential_lambda_init(layer_index):
  """DiffLlama's `lambda_init_fn`: 0.8 - 0.6 exp(-0.3 l), l from 0."""
  return 0.8 - 0.6 * np.exp(-0.3 * layer_index)


def differential_attention(X, M, P_q, P_k, P_v, P_o, lambda_q1, lambda_k1,
                           lambda_q2, lambda_k2, layer_index, mask=None,
                           epsilon=1e-5):
  """Y[b, n, d_Y] of differential attention; `mask` boolean [b, n, m],
  True = may attend. The 1/sqrt(K) is in P_q, as in thattn."""
  X, M, P_q, P_k, P_v, P_o = (np.asarray(a, np.float64)
                              for a in (X, M, P_q, P_k, P_v, P_o))
  maps, kv_heads = P_q.shape[1], P_k.shape[1]
  half = maps // 2
  Q = np.einsum("bnX,XhK->bhnK", X, P_q)
  # repeat_kv: map h reads key and value head h // (N / N_kv).
  K = np.repeat(np.einsum("bmM,MhK->bhmK", M, P_k), maps // kv_heads, 1)
  V = np.repeat(np.einsum("bmM,MhK->bhmK", M, P_v), maps // kv_heads, 1)
  L = np.einsum("bhnK,bhmK->bhnm", Q, K)
  if mask is not None:
    L = np.where(np.asarray(mask)[:, None], L, MASKED_LOGIT)
  A = np.exp(L - L.max(-1, keepdims=True))
  A /= A.sum(-1, keepdims=True)
  # The values of map j and map j + N/2 side by side, repeated for both
  # halves of the maps: [b, N, m, 2K].
  wide = np.concatenate([V[:, :half], V[:, half:]], axis=-1)
  O = np.einsum("bhnm,bhmv->bhnv", A, np.concatenate([wide, wide], axis=1))
  vectors = [np.asarray(v, np.float64)
             for v in (lambda_q1, lambda_k1, lambda_q2, lambda_k2)]
  initial = differential_lambda_init(layer_index)
  lam = (np.exp(np.sum(vectors[0] * vectors[1])) -
         np.exp(np.sum(vectors[2] * vectors[3])) + initial)
  Z = O[:, :half] - lam * O[:, half:]
  Z = Z / np.sqrt(np.mean(Z ** 2, axis=-1, keepdims=True) + epsilon)
  Z = Z * (1 - initial)
  batch, _, length, width = Z.shape
  flat = np.transpose(Z, (0, 2, 1, 3)).reshape(batch, length, half * width)
  return flat @ P_o


def _gelu_erf(x):
  """GELU in its exact form, x Phi(x) (PyTorch's nn.GELU() default)."""
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _dcmha_dynamic_weights(Z, dw1, qkw, dd, rank):
  """(w1[b, a, 4, R, N], w2[b, a, 4, R, N], g[b, a, 4, N]) of every slot
  (pre/query, pre/key, post/query, post/key) from Z[b, a, D]."""
  hidden = _gelu_erf(np.einsum("baD,DsC->basC", Z, dw1))
  factors = np.einsum("basC,sCrN->basrN", hidden, qkw)
  w1, w2 = factors[:, :, :, :rank], factors[:, :, :, rank:]
  w1 = w1 / np.sqrt(np.mean(w1 ** 2, axis=-1, keepdims=True) + 1e-6)
  return w1, w2, np.tanh(np.einsum("baD,DsN->basN", Z, dd))


def dcmha_attention(X, M, P_q, P_k, P_v, P_o, dw1, qkw, dd, mask=None,
                    static=None):
  """Y[b, n, d_Y] of DCMHA; `mask` boolean [b, n, m], True = may attend.
  Weights in thattn's layouts (P_q[d_X, N, K] with the 1/sqrt(K) in it;
  P_k, P_v [d_M, N_kv, K]; P_o[N, K, d_Y]) and the authors' dynamic
  weights without their group axis: dw1[D, 4, C], qkw[4, C, 2R, N],
  dd[D, 4, N] (dd's 4N columns as 4 blocks of N); `static`: None or S[2,
  N, N], added to the identity. Query slots read X, key slots M."""
  X, M, P_q, P_k, P_v, P_o, dw1, qkw, dd = (
      np.asarray(a, np.float64)
      for a in (X, M, P_q, P_k, P_v, P_o, dw1, qkw, dd))
  heads, kv_heads = P_q.shape[1], P_k.shape[1]
  rank = qkw.shape[2] // 2
  Q = np.einsum("bnX,XhK->bhnK", X, P_q)
  K = np.repeat(np.einsum("bmM,MhK->bhmK", M, P_k), heads // kv_heads, 1)
  V = np.repeat(np.einsum("bmM,MhK->bhmK", M, P_v), heads // kv_heads, 1)
  query_side = _dcmha_dynamic_weights(X, dw1, qkw, dd, rank)
  key_side = _dcmha_dynamic_weights(M, dw1, qkw, dd, rank)

  def mixing(side, slot):  # [b, a, N_from, N_to]
    w1, w2, g = (part[:, :, slot] for part in side)
    return (np.einsum("barf,bart->baft", w1, w2) +
            g[..., None] * np.eye(heads))

  def compose(scores, stage):  # stage 0: slots 0, 1; stage 1: slots 2, 3
    matrix = (np.eye(heads) + mixing(query_side, 2 * stage)[:, :, None] +
              mixing(key_side, 2 * stage + 1)[:, None])  # [b, n, m, f, t]
    if static is not None:
      matrix = matrix + np.asarray(static, np.float64)[stage]
    return np.einsum("bfnm,bnmft->btnm", scores, matrix)

  L = compose(np.einsum("bhnK,bhmK->bhnm", Q, K), 0)
  if mask is not None:
    L = np.where(np.asarray(mask)[:, None], L, MASKED_LOGIT)
  A = np.exp(L - L.max(-1, keepdims=True))
  A /= A.sum(-1, keepdims=True)
  O = np.einsum("bhnm,bhmv->bnhv", compose(A, 1), V)
  return np.einsum("bnhv,hvY->bnY", O, P_o)
