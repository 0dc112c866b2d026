"""Float64 NumPy transcriptions of the talking-heads paper's pseudocode.

This module is the test oracle for `thattn.layers`. It is written from the
paper (Shazeer et al., 2020, "Talking-Heads Attention", Sections 3-6 and
Appendix A) and not from the layers, so a shared misreading cannot make both
sides agree. Every function adds a leading batch dimension `b` to the paper's
pseudocode and otherwise follows it line by line.

Einsum letters used here (the paper names dimensions, NumPy needs letters):

| letter | paper | meaning                                  |
|--------|-------|------------------------------------------|
| b      | -     | batch                                    |
| n      | n     | query positions                          |
| m      | m     | memory positions                         |
| X      | d_X   | query width                              |
| M      | d_M   | memory width                             |
| Y      | d_Y   | output width                             |
| k      | d_k   | query/key size per head                  |
| v      | d_v   | value size per head                      |
| K      | h_k   | key heads (queries, keys, logits J)      |
| h      | h     | softmax heads (logits L, weights W)      |
| V      | h_v   | value heads (U, values, output)          |

Departures from the paper's text, all deliberate:

- Weight layouts follow thattn's contract, which puts heads before the head
  size: P_q[d_X, h_k, d_k], P_k[d_M, h_k, d_k], P_v[d_M, h_v, d_v] and
  P_o[h_v, d_v, d_Y]. The paper writes P_q[d_X, d_k, h_k] and
  P_o[d_Y, d_v, h_v]. Einsum does not care about axis order, so only the
  subscripts differ.
- Appendix A's pseudocode indexes R_Ml and R_Mw by `n`; they are projections
  of the memory M, so they are indexed by `m`: R_Ml[m, h_k, h], R_Mw[m, h, h_v].
- Masks (not in the paper): boolean [b, n, m], True = may attend. Masked
  logits are replaced by a large negative number after the talking-heads
  logits projection P_l (so no head can leak a masked position into another),
  just before the softmax.
- Like the paper, no 1/sqrt(d_k) scaling is applied; it is folded into P_q.

Each attention function returns Y[b, n, d_Y], or (Y, A) with
`return_weights=True`, where A[b, heads, n, m] are the weights actually applied
to the values: W for multi-head and general bilinear attention, U for
talking-heads attention. (Heads before positions, as the layers return them.)
"""

import numpy as np

# Added to, or rather substituted for, masked logits. exp(-1e9 - max) is 0.0
# in float64, and the value is finite so fully-masked rows give NaN-free
# uniform weights instead of 0/0.
MASKED_LOGIT = -1e9


def _f64(*arrays):
  return [None if a is None else np.asarray(a, dtype=np.float64)
          for a in arrays]


def _mask_logits(logits, mask):
  """L[b, n, m, h] with masked (b, n, m) entries set to MASKED_LOGIT."""
  if mask is None:
    return logits
  mask = np.asarray(mask, dtype=bool)
  if mask.shape != logits.shape[:3]:
    raise ValueError(f"mask shape {mask.shape} does not match logits "
                     f"[b, n, m] = {logits.shape[:3]}")
  return np.where(mask[..., None], logits, MASKED_LOGIT)


def softmax(logits, axis):
  """Numerically stable softmax along `axis` (the paper's reduced_dim)."""
  shifted = logits - np.max(logits, axis=axis, keepdims=True)
  e = np.exp(shifted)
  return e / np.sum(e, axis=axis, keepdims=True)


def _finish(Y, A, return_weights):
  # A is [b, n, m, heads] in the paper's order; the layers return
  # [b, heads, n, m].
  if return_weights:
    return Y, np.transpose(A, (0, 3, 1, 2))
  return Y


def _gated(O, X, P_g):
  """The output gate of gated attention (Qiu et al., 2025; Keras 3's
  `use_gate`), not in the talking-heads paper: O[n, heads, d] times
  sigmoid(einsum(X[n, d_X], P_g[d_X, heads, d])) element-wise, or, for a
  head-wise P_g[d_X, heads], each head's O times its one gate
  sigmoid(einsum(X[n, d_X], P_g[d_X, heads])); before the output
  projection."""
  if P_g is None:
    return O
  P_g = np.asarray(P_g, np.float64)
  if P_g.ndim == 2:
    G = 1.0 / (1.0 + np.exp(-np.einsum("bnX,Xh->bnh", X, P_g)))
    return O * G[..., None]
  G = 1.0 / (1.0 + np.exp(-np.einsum("bnX,Xhv->bnhv", X, P_g)))
  return O * G


def band_mask(batch, n, m, window, offset=0):
  """Boolean [b, n, m]: Keras 3's sliding window |i + offset - j| < w."""
  distance = np.arange(n)[:, None] + offset - np.arange(m)[None, :]
  return np.broadcast_to(np.abs(distance) < window, (batch, n, m)).copy()


def causal_mask(batch, n, m):
  """Boolean [b, n, m]: query position i may attend memory position j <= i."""
  tri = np.arange(m)[None, :] <= np.arange(n)[:, None]
  return np.broadcast_to(tri, (batch, n, m)).copy()


# --------------------------------------------------------------------------
# Section 3.3: multi-head attention.
# --------------------------------------------------------------------------


def multi_head_attention(X, M, P_q, P_k, P_v, P_o, mask=None,
                         return_weights=False, P_g=None):
  """MultiHeadAttention (Section 3.3), one heads dimension h.

  Args:
    X: [b, n, d_X] queries' inputs.
    M: [b, m, d_M] memory.
    P_q: [d_X, h, d_k].  P_k: [d_M, h, d_k].
    P_v: [d_M, h, d_v].  P_o: [h, d_v, d_Y].
    mask: optional boolean [b, n, m], True = may attend.
  """
  X, M, P_q, P_k, P_v, P_o = _f64(X, M, P_q, P_k, P_v, P_o)
  # Q[n, d_k, h] = einsum(X[n, d_X], P_q[d_X, d_k, h])
  Q = np.einsum("bnX,Xhk->bnhk", X, P_q)
  # K[m, d_k, h] = einsum(M[m, d_M], P_k[d_M, d_k, h])
  K = np.einsum("bmM,Mhk->bmhk", M, P_k)
  # V[m, d_v, h] = einsum(M[m, d_M], P_v[d_M, d_v, h])
  V = np.einsum("bmM,Mhv->bmhv", M, P_v)
  # L[n, m, h] = einsum(Q[n, d_k, h], K[m, d_k, h])
  L = np.einsum("bnhk,bmhk->bnmh", Q, K)
  L = _mask_logits(L, mask)
  # W[n, m, h] = softmax(L[n, m, h], reduced_dim=m)
  W = softmax(L, axis=2)
  # O[n, d_v, h] = einsum(W[n, m, h], V[m, d_v, h])
  O = np.einsum("bnmh,bmhv->bnhv", W, V)
  O = _gated(O, X, P_g)
  # Y[n, d_Y] = einsum(O[n, d_v, h], P_o[d_Y, d_v, h])
  Y = np.einsum("bnhv,hvY->bnY", O, P_o)
  return _finish(Y, W, return_weights)


# --------------------------------------------------------------------------
# Section 4: talking-heads attention.
# --------------------------------------------------------------------------


def talking_heads_attention(X, M, P_q, P_k, P_v, P_o, P_l=None, P_w=None,
                            mask=None, return_weights=False, P_g=None):
  """TalkingHeadsAttention (Section 4) with separate h_k, h, h_v, d_k, d_v.

  Args:
    X: [b, n, d_X].  M: [b, m, d_M].
    P_q: [d_X, h_k, d_k].  P_k: [d_M, h_k, d_k].
    P_v: [d_M, h_v, d_v].  P_o: [h_v, d_v, d_Y].
    P_l: [h_k, h], or None for no logits projection (then h = h_k), which is
      the "project weights only" variant of Section 7.1.3.
    P_w: [h, h_v], or None for no weights projection (then h_v = h), which is
      the "project logits only" variant. Both None is multi-head attention.
    mask: optional boolean [b, n, m], True = may attend.
  """
  X, M, P_q, P_k, P_v, P_o, P_l, P_w = _f64(X, M, P_q, P_k, P_v, P_o, P_l,
                                            P_w)
  # Q[n, d_k, h_k] = einsum(X[n, d_X], P_q[d_X, d_k, h_k])
  Q = np.einsum("bnX,XKk->bnKk", X, P_q)
  # K[m, d_k, h_k] = einsum(M[m, d_M], P_k[d_M, d_k, h_k])
  K = np.einsum("bmM,MKk->bmKk", M, P_k)
  # V[m, d_v, h_v] = einsum(M[m, d_M], P_v[d_M, d_v, h_v])
  V = np.einsum("bmM,MVv->bmVv", M, P_v)
  # J[n, m, h_k] = einsum(Q[n, d_k, h_k], K[m, d_k, h_k])
  J = np.einsum("bnKk,bmKk->bnmK", Q, K)
  if P_l is None:
    L = J  # no logits projection: h = h_k
  else:
    # L[n, m, h] = einsum(J[n, m, h_k], P_l[h_k, h])
    L = np.einsum("bnmK,Kh->bnmh", J, P_l)
  L = _mask_logits(L, mask)  # after P_l, before the softmax
  # W[n, m, h] = softmax(L[n, m, h], reduced_dim=m)
  W = softmax(L, axis=2)
  if P_w is None:
    U = W  # no weights projection: h_v = h
  else:
    # U[n, m, h_v] = einsum(W[n, m, h], P_w[h, h_v])
    U = np.einsum("bnmh,hV->bnmV", W, P_w)
  # O[n, d_v, h_v] = einsum(U[n, m, h_v], V[m, d_v, h_v])
  O = np.einsum("bnmV,bmVv->bnVv", U, V)
  O = _gated(O, X, P_g)
  # Y[n, d_Y] = einsum(O[n, d_v, h_v], P_o[d_Y, d_v, h_v])
  Y = np.einsum("bnVv,VvY->bnY", O, P_o)
  return _finish(Y, U, return_weights)


# --------------------------------------------------------------------------
# Appendix A: talking-heads attention with dynamic projections.
# --------------------------------------------------------------------------


def talking_heads_attention_with_dynamic_projections(
    X, M, P_q, P_k, P_v, P_o, P_l=None, P_w=None, P_Xl=None, P_Ml=None,
    P_Xw=None, P_Mw=None, mask=None, return_weights=False, P_g=None):
  """TalkingHeadsAttentionWithDynamicProjections (Appendix A).

  Any subset of the four dynamic projections may be given; each one given
  adds its term to the static projection, exactly as in the appendix.

  Args:
    X, M, P_q, P_k, P_v, P_o, mask: as in `talking_heads_attention`.
    P_l: [h_k, h] static logits projection, or None for identity (h = h_k).
    P_w: [h, h_v] static weights projection, or None for identity (h_v = h).
    P_Xl: [d_X, h_k, h].  P_Ml: [d_M, h_k, h].
    P_Xw: [d_X, h, h_v].  P_Mw: [d_M, h, h_v].
  """
  (X, M, P_q, P_k, P_v, P_o, P_l, P_w, P_Xl, P_Ml, P_Xw, P_Mw) = _f64(
      X, M, P_q, P_k, P_v, P_o, P_l, P_w, P_Xl, P_Ml, P_Xw, P_Mw)
  # Q[n, d_k, h_k] = einsum(X[n, d_X], P_q[d_X, d_k, h_k])
  Q = np.einsum("bnX,XKk->bnKk", X, P_q)
  # K[m, d_k, h_k] = einsum(M[m, d_M], P_k[d_M, d_k, h_k])
  K = np.einsum("bmM,MKk->bmKk", M, P_k)
  # V[m, d_v, h_v] = einsum(M[m, d_M], P_v[d_M, d_v, h_v])
  V = np.einsum("bmM,MVv->bmVv", M, P_v)
  # J[n, m, h_k] = einsum(Q[n, d_k, h_k], K[m, d_k, h_k])
  J = np.einsum("bnKk,bmKk->bnmK", Q, K)

  # L[n, m, h] = einsum(J[n, m, h_k], P_l[h_k, h])            (static)
  L = J.copy() if P_l is None else np.einsum("bnmK,Kh->bnmh", J, P_l)
  if P_Xl is not None:
    # R_Xl[n, h_k, h] = einsum(X[n, d_X], P_Xl[d_X, h_k, h])
    R_Xl = np.einsum("bnX,XKh->bnKh", X, P_Xl)
    #      + einsum(J[n, m, h_k], R_Xl[n, h_k, h])
    L = L + np.einsum("bnmK,bnKh->bnmh", J, R_Xl)
  if P_Ml is not None:
    # R_Ml[m, h_k, h] = einsum(M[m, d_M], P_Ml[d_M, h_k, h])  (m, not n)
    R_Ml = np.einsum("bmM,MKh->bmKh", M, P_Ml)
    #      + einsum(J[n, m, h_k], R_Ml[m, h_k, h])
    L = L + np.einsum("bnmK,bmKh->bnmh", J, R_Ml)
  L = _mask_logits(L, mask)  # after all logits projections
  # W[n, m, h] = softmax(L[n, m, h], reduced_dim=m)
  W = softmax(L, axis=2)

  # U[n, m, h_v] = einsum(W[n, m, h], P_w[h, h_v])            (static)
  U = W.copy() if P_w is None else np.einsum("bnmh,hV->bnmV", W, P_w)
  if P_Xw is not None:
    # R_Xw[n, h, h_v] = einsum(X[n, d_X], P_Xw[d_X, h, h_v])
    R_Xw = np.einsum("bnX,XhV->bnhV", X, P_Xw)
    #      + einsum(W[n, m, h], R_Xw[n, h, h_v])
    U = U + np.einsum("bnmh,bnhV->bnmV", W, R_Xw)
  if P_Mw is not None:
    # R_Mw[m, h, h_v] = einsum(M[m, d_M], P_Mw[d_M, h, h_v])  (m, not n)
    R_Mw = np.einsum("bmM,MhV->bmhV", M, P_Mw)
    #      + einsum(W[n, m, h], R_Mw[m, h, h_v])
    U = U + np.einsum("bnmh,bmhV->bnmV", W, R_Mw)

  # O[n, d_v, h_v] = einsum(U[n, m, h_v], V[m, d_v, h_v])
  O = np.einsum("bnmV,bmVv->bnVv", U, V)
  O = _gated(O, X, P_g)
  # Y[n, d_Y] = einsum(O[n, d_v, h_v], P_o[d_Y, d_v, h_v])
  Y = np.einsum("bnVv,VvY->bnY", O, P_o)
  return _finish(Y, U, return_weights)


# --------------------------------------------------------------------------
# Grouped talking heads (not in the paper): block-diagonal P_l, P_w and
# dynamic projections, the heads of each set split into G contiguous groups.
# --------------------------------------------------------------------------


def block_diagonal(blocks):
  """[..., G, a, c] diagonal blocks -> the [..., G*a, G*c] matrix, zeros off.

  Block g maps rows [g*a, (g+1)*a) to columns [g*c, (g+1)*c): heads are
  grouped contiguously, group-major.
  """
  blocks = np.asarray(blocks, dtype=np.float64)
  *lead, groups, rows, cols = blocks.shape
  full = np.zeros(tuple(lead) + (groups * rows, groups * cols))
  for g in range(groups):
    full[..., g * rows:(g + 1) * rows, g * cols:(g + 1) * cols] = (
        blocks[..., g, :, :])
  return full


def grouped_talking_heads_attention(X, M, P_q, P_k, P_v, P_o, P_l=None,
                                    P_w=None, P_Xl=None, P_Ml=None,
                                    P_Xw=None, P_Mw=None, mask=None,
                                    return_weights=False, P_g=None):
  """Talking heads whose head projections are block-diagonal.

  Takes only the blocks: P_l[G, h_k/G, h/G], P_w[G, h/G, h_v/G] and the
  dynamic P_Xl[d_X, G, h_k/G, h/G] (and so on), expands them with
  `block_diagonal`, and runs the paper's pseudocode
  (`talking_heads_attention_with_dynamic_projections`) unchanged.
  """
  dense = {name: None if blocks is None else block_diagonal(blocks)
           for name, blocks in (("P_l", P_l), ("P_w", P_w), ("P_Xl", P_Xl),
                                ("P_Ml", P_Ml), ("P_Xw", P_Xw),
                                ("P_Mw", P_Mw))}
  return talking_heads_attention_with_dynamic_projections(
      X, M, P_q, P_k, P_v, P_o, mask=mask, return_weights=return_weights,
      P_g=P_g, **dense)


# --------------------------------------------------------------------------
# Section 6: general bilinear multihead attention and the factored forms.
# --------------------------------------------------------------------------


def general_bilinear_attention(X, M, P, Q, mask=None, return_weights=False,
                               P_g=None):
  """GeneralBilinearMultiheadAttention (Section 6).

  Args:
    X: [b, n, d_X].  M: [b, m, d_M].
    P: [d_X, d_M, h].  Q: [d_M, d_Y, h]  (the paper's layouts).
    mask: optional boolean [b, n, m], True = may attend.
  """
  X, M, P, Q = _f64(X, M, P, Q)
  # L[n, m, h] = einsum(X[n, d_X], M[m, d_M], P[d_X, d_M, h])
  L = np.einsum("bnX,bmM,XMh->bnmh", X, M, P, optimize=True)
  L = _mask_logits(L, mask)
  # W[n, m, h] = softmax(L[n, m, h], reduced_dim=m)
  W = softmax(L, axis=2)
  if P_g is None:
    # Y[n, d_Y] = einsum(W[n, m, h], M[m, d_M], Q[d_M, d_Y, h])
    Y = np.einsum("bnmh,bmM,MYh->bnY", W, M, Q, optimize=True)
  else:  # the gate multiplies each head's weighted memory [n, h, d_M]
    O = _gated(np.einsum("bnmh,bmM->bnhM", W, M), X, P_g)
    Y = np.einsum("bnhM,MYh->bnY", O, Q)
  return _finish(Y, W, return_weights)


def multi_head_bilinear_factors(P_q, P_k, P_v, P_o):
  """P, Q of MultiHeadAttentionInefficient (Section 6), thattn layouts in."""
  P_q, P_k, P_v, P_o = _f64(P_q, P_k, P_v, P_o)
  # P[d_X, d_M, h] = einsum(P_q[d_X, d_k, h], P_k[d_M, d_k, h])
  P = np.einsum("Xhk,Mhk->XMh", P_q, P_k)
  # Q[d_M, d_Y, h] = einsum(P_v[d_M, d_v, h], P_o[d_Y, d_v, h])
  Q = np.einsum("Mhv,hvY->MYh", P_v, P_o)
  return P, Q


def talking_heads_bilinear_factors(P_q, P_k, P_v, P_o, P_l, P_w):
  """P, Q of TalkingHeadsAttentionInefficient (Section 6), thattn layouts in."""
  P_q, P_k, P_v, P_o, P_l, P_w = _f64(P_q, P_k, P_v, P_o, P_l, P_w)
  # P[d_X, d_M, h] = einsum(P_q[d_X, d_k, h_k], P_k[d_M, d_k, h_k], P_l[h_k, h])
  P = np.einsum("XKk,MKk,Kh->XMh", P_q, P_k, P_l, optimize=True)
  # Q[d_M, d_Y, h] = einsum(P_v[d_M, d_v, h_v], P_o[d_Y, d_v, h_v], P_w[h, h_v])
  Q = np.einsum("MVv,VvY,hV->MYh", P_v, P_o, P_w, optimize=True)
  return P, Q


def multi_head_attention_inefficient(X, M, P_q, P_k, P_v, P_o, mask=None,
                                     return_weights=False):
  """MultiHeadAttentionInefficient (Section 6): GBMA with two factors."""
  P, Q = multi_head_bilinear_factors(P_q, P_k, P_v, P_o)
  return general_bilinear_attention(X, M, P, Q, mask=mask,
                                    return_weights=return_weights)


def talking_heads_attention_inefficient(X, M, P_q, P_k, P_v, P_o, P_l, P_w,
                                        mask=None, return_weights=False):
  """TalkingHeadsAttentionInefficient (Section 6): GBMA with three factors.

  With return_weights=True the weights returned are GBMA's W[b, h, n, m],
  not talking heads' U (the factored form never forms U).
  """
  P, Q = talking_heads_bilinear_factors(P_q, P_k, P_v, P_o, P_l, P_w)
  return general_bilinear_attention(X, M, P, Q, mask=mask,
                                    return_weights=return_weights)


# --------------------------------------------------------------------------
# Test helpers shared by the layer tests: read and overwrite a layer's
# weights by name token, random inputs and masks, and the float32-vs-float64
# comparison. They touch only `variable.name`, `.shape`, `.numpy()` and
# `.assign()`, so this module stays free of TensorFlow.
# --------------------------------------------------------------------------

# thattn's weight-name tokens (docs/architecture.md) -> this module's argument names.
TOKEN_TO_ARG = {
    "query": "P_q",
    "key": "P_k",
    "value": "P_v",
    "output": "P_o",
    "pre_softmax_projection": "P_l",
    "post_softmax_projection": "P_w",
    "x2l": "P_Xl",
    "m2l": "P_Ml",
    "x2w": "P_Xw",
    "m2w": "P_Mw",
    "bilinear_p": "P",
    "bilinear_q": "Q",
    "gate": "P_g",
}


def name_components(variable):
  """'mha/query/kernel:0' -> ['mha', 'query', 'kernel']."""
  return variable.name.split(":")[0].split("/")


def token_of(variable):
  """The one contract token naming `variable`, matched as a whole component.

  Whole-component matching keeps "key" from matching names such as
  "num_key_heads" or "key_bias"-like components. Raises ValueError if a
  variable carries no token or more than one.
  """
  components = name_components(variable)
  found = [t for t in TOKEN_TO_ARG if t in components]
  if len(found) != 1:
    raise ValueError(f"variable {variable.name!r} must carry exactly one of "
                     f"{sorted(TOKEN_TO_ARG)} as a name component; found "
                     f"{found}")
  return found[0]


def weights_by_token(layer):
  """{token: variable} over all of `layer`'s weights.

  Strict on purpose: every weight must carry exactly one token, no token may
  appear twice, and (biases being off by default) no weight may be a bias.
  """
  out = {}
  for v in layer.weights:
    if "bias" in name_components(v)[-1]:
      raise ValueError(f"unexpected bias variable {v.name!r} with "
                       "use_bias=False")
    token = token_of(v)
    if token in out:
      raise ValueError(f"token {token!r} names both {out[token].name!r} "
                       f"and {v.name!r}")
    out[token] = v
  return out


def reference_kwargs(layer):
  """The layer's weights as float64 arrays keyed by reference argument name."""
  return {TOKEN_TO_ARG[t]: np.asarray(v.numpy(), dtype=np.float64)
          for t, v in weights_by_token(layer).items()}


# Leading axes each weight contracts over, for `randomize_weights`' scale.
_FAN_IN_AXES = {"output": 2, "bilinear_p": 2}


def randomize_weights(layer, rng):
  """Overwrites every weight with N(0, 1/fan_in) draws.

  Initializers may start P_l and P_w near the identity or the dynamic
  projections near zero; a layer that ignored them would then still match
  the reference. Random weights of ordinary size make every term count while
  keeping the logits O(1), so the softmax is not saturated.
  """
  for token, v in weights_by_token(layer).items():
    shape = tuple(v.shape)
    fan_in = int(np.prod(shape[:_FAN_IN_AXES.get(token, 1)]))
    value = rng.normal(size=shape) / np.sqrt(fan_in)
    v.assign(value.astype(np.asarray(v.numpy()).dtype))


def assert_close(got, want, rtol=1e-4, atol=1e-5):
  """float32 layer output vs float64 reference; atol scales with |want|."""
  got = np.asarray(got)
  want = np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape)
  scale = max(1.0, float(np.max(np.abs(want))))
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


def make_inputs(rng, batch, n, m, d_x, d_m, self_attention):
  """Random (X[b, n, d_X], M[b, m, d_M]); M is X for self-attention."""
  x = rng.normal(size=(batch, n, d_x))
  if self_attention:
    if (n, d_x) != (m, d_m):
      raise ValueError(f"self-attention needs n == m and d_X == d_M; got "
                       f"n={n}, m={m}, d_X={d_x}, d_M={d_m}")
    return x, x
  return x, rng.normal(size=(batch, m, d_m))


def make_masks(rng, kind, batch, n, m):
  """(attention_mask for the layer, use_causal_mask, mask for the reference).

  `kind` is "none", "random", "causal" or "random_and_causal". Random masks
  keep memory position 0 open for every query, so (even with the causal mask)
  no softmax row is fully masked.
  """
  if kind not in ("none", "random", "causal", "random_and_causal"):
    raise ValueError(f"unknown mask kind {kind!r}")
  layer_mask = None
  if "random" in kind:
    layer_mask = rng.random((batch, n, m)) < 0.6
    layer_mask[:, :, 0] = True
  use_causal = "causal" in kind
  ref_mask = layer_mask
  if use_causal:
    tri = causal_mask(batch, n, m)
    ref_mask = tri if ref_mask is None else (ref_mask & tri)
  return layer_mask, use_causal, ref_mask


# ---- Rotary position embeddings (Su et al., 2021, "RoFormer") --------------
# Not the talking-heads paper's: the decoder-only families rotate queries
# and keys by position before the logits. Written from RoFormer's Section
# 3.4 as a rotation matrix per position, with the "half" pairing of
# transformers' Llama and GPT-NeoX code (entry r turns with entry r + R,
# R = rotated / 2), and from Meta's description of the Llama 3.1
# frequency scaling.


def rotary_frequencies(rotated, base, llama3=None):
  """float64 theta[r] = base^(-2r / rotated); `llama3`: (factor,
  low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
  theta = base ** (-np.arange(0, rotated, 2, dtype=np.float64) / rotated)
  if llama3 is None:
    return theta
  factor, low, high, original = llama3
  wavelength = 2 * np.pi / theta
  out = theta.copy()
  for r, w in enumerate(wavelength):
    if w < original / high:  # high frequency: kept
      continue
    if w > original / low:  # low frequency: slowed by the factor
      out[r] = theta[r] / factor
      continue
    smooth = (original / w - low) / (high - low)
    out[r] = (1 - smooth) * theta[r] / factor + smooth * theta[r]
  return out


def rotary_matrix(position, theta, size):
  """The [size, size] rotation of one position: pairs (r, r + R) turned by
  position * theta[r], R = len(theta); entries from 2R on kept."""
  half = len(theta)
  matrix = np.eye(size)
  for r, frequency in enumerate(theta):
    angle = position * frequency
    matrix[r, r] = matrix[r + half, r + half] = np.cos(angle)
    matrix[r, r + half] = -np.sin(angle)
    matrix[r + half, r] = np.sin(angle)
  return matrix


def rotary(x, positions, theta):
  """x [b, n, heads, k] rotated by positions [b, n] (float64)."""
  x = np.asarray(x, np.float64)
  out = np.empty_like(x)
  for b in range(x.shape[0]):
    for n in range(x.shape[1]):
      matrix = rotary_matrix(positions[b, n], theta, x.shape[-1])
      out[b, n] = x[b, n] @ matrix.T
  return out
