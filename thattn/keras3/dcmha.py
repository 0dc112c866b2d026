"""Dynamically composable multi-head attention (DCMHA; Xiao et al., 2024)
as a Keras 3 layer, exact to the released inference path of the authors'
DCFormer and DCPythia (docs/family_sources.md, section 1); the math is
`thattn.ops.dcmha`, shared with `thattn.layers.DynamicallyComposableAttention`.
"""

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.keras3 import projected
from thattn.ops import dcmha


@keras.saving.register_keras_serializable(package="thattn")
class DynamicallyComposableAttention(projected.ProjectedAttention):
  """DCMHA: multi-head attention whose logits and probabilities are mixed
  across heads, for every query-key pair, by matrices the two positions'
  inputs generate.

  Computation (per example; letters as in `thattn.core.dims`, the dynamic
  weights' as in `thattn.ops.dcmha`)::

    Q[n, h, d_k] = einsum(X[n, d_X], P_q[d_X, h, d_k])
    K[m, h, d_k] = einsum(M[m, d_M], P_k[d_M, h_kv, d_k])   (repeated)
    V[m, h, d_v] = einsum(M[m, d_M], P_v[d_M, h_kv, d_v])   (repeated)
    J[h, n, m]   = einsum(Q, K)                            (scaled logits)
    L[h, n, m]   = compose_pre(J)      from X's and M's dynamic weights
    W[h, n, m]   = softmax(L + bias, masked, reduced_dim=m)
    U[h, n, m]   = compose_post(W)     (not renormalized)
    O[n, h, d_v] = einsum(dropout(U), V)
    Y[n, d_Y]    = einsum(O, P_o[h, d_v, d_Y])

  The dynamic weights come from three kernels beside P_q..P_o,
  `dynamic_hidden` D_1[d_X, 4, C], `dynamic_factors` Q_kw[4, C, 2R, h] and
  `dynamic_gates` D_d[d_X, 4, h], whose 4-axis is the slots pre/query,
  pre/key, post/query, post/key; the queries' slots read X, the keys'
  read M (the authors' cross-attention), so d_X must equal d_M. With
  `static_mix=True`, a learned S[2, h, h] (the weight `static_mix`) adds
  einsum(X, S) at each stage. A decoding cache keeps each key's head-mixing matrix
  [2, h, h] (the identity folded in) beside its K and V.

  A multi-head model's weights with Q_kw's w_2 rows and D_d at zero give
  its outputs: what the converters start DCMHA from.

  Args:
    num_heads: h, the heads (N in the paper); h_k = h = h_v.
    key_dim: d_k.
    value_dim: d_v; defaults to key_dim.
    num_key_value_heads: h_kv, the heads P_k and P_v project to, shared
      by h / h_kv heads each (the authors' n_local_heads); must divide h.
    dynamic_rank: R, the rank of each position's dynamic head mixes (2 in
      both releases).
    dynamic_hidden_dim: C, the hidden units of the dynamic weights'
      generator; None: 2 R h (128 for h = 32), the authors'.
    static_mix: whether to learn the static S (off in both releases).
    use_bias, bias_initializer, rotary_base, rotary_pct, rotary_scaling,
      query_key_norm_epsilon: as in `MultiHeadAttention`.
    **kwargs: as `MultiHeadAttention` (output_shape, dropout,
      kernel_initializer, use_gate, sliding_window, seed, ...). The
      dynamic kernels start as the authors' MaxText code draws them (near
      the identity). `query_chunk_size` is refused, as on every Keras 3
      layer.
  """

  def __init__(self, num_heads, key_dim, value_dim=None, dynamic_rank=2,
               dynamic_hidden_dim=None, static_mix=False, *,
               query_chunk_size=None, **kwargs):
    owner = kwargs.get("name") or "DynamicallyComposableAttention"
    rank, hidden = attention_spec.checked_dynamic_compose(
        owner, num_heads, dynamic_rank, dynamic_hidden_dim)
    if query_chunk_size is not None:
      raise ValueError(f"{owner}: query_chunk_size={query_chunk_size} is "
                       "not supported in Keras 3 (thattn.layers' chunked "
                       "core).")
    super().__init__(num_heads, num_heads, num_heads, key_dim,
                     value_dim=value_dim, **kwargs)
    self.dynamic_rank = rank
    self.dynamic_hidden_dim = hidden
    self.static_mix = bool(static_mix)
    self._dynamic_kernels = {}
    self._static_mix_weight = None

  def create_weights(self, query_width, key_width, value_width):
    super().create_weights(query_width, key_width, value_width)
    attention_spec.check_compose_widths(self.name, query_width, key_width)
    for name, shape, axes, stddev in attention_spec.compose_weights(
        query_width, self.num_heads, self.dynamic_rank,
        self.dynamic_hidden_dim, self.static_mix):
      weight = self.add_axes_weight(
          name, shape, axes, keras.initializers.RandomNormal(stddev=stddev))
      if name == attention_spec.STATIC_MIX:
        self._static_mix_weight = weight
      else:
        self._dynamic_kernels[name] = weight

  def _side_weights(self, inputs, slots):
    return dcmha.dynamic_weights(
        ops, inputs, [self._dynamic_kernels[name] for name in
                      attention_spec.COMPOSE_KERNELS],
        slots, self.dynamic_rank)

  def project_query(self, query):
    state = super().project_query(query)
    state.update(zip(attention_spec.QUERY_COMPOSE_FACTORS,
                     self._side_weights(query, dcmha.QUERY_SLOTS)))
    return state

  def project_memory(self, key, value):
    state = super().project_memory(key, value)
    state.update(zip(attention_spec.KEY_COMPOSE_FACTORS,
                     self._side_weights(key, dcmha.KEY_SLOTS)))
    return state

  def cached_memory_state(self, memory_state):
    """K, V and each key's head-mixing matrices KW[b, m, 2, h, h]."""
    return dcmha.cached_memory_state(ops, memory_state,
                                     self._static_mix_weight)

  def mix_logits(self, dot_products, query_state, memory_state):
    """L[b, h, n, m] = compose_pre(J[b, h, n, m])."""
    return dcmha.compose(ops, dot_products, 0, query_state, memory_state,
                         self._static_mix_weight)

  def mix_weights(self, weights, query_state, memory_state):
    """U[b, h, n, m] = compose_post(W[b, h, n, m])."""
    return dcmha.compose(ops, weights, 1, query_state, memory_state,
                         self._static_mix_weight)

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    # The plain core only: no fused kernel knows the dynamic compose.
    return self.plain_attend(query_state, memory_state, mask, position_bias,
                             training, causal_offset)

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                dynamic_rank=self.dynamic_rank,
                dynamic_hidden_dim=self.dynamic_hidden_dim,
                static_mix=self.static_mix)
