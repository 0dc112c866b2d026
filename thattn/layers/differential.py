"""Differential attention (Ye et al., 2024) as a tf_keras layer, exact to
transformers' DiffLlama (`DiffLlamaAttention`, docs/family_sources.md
section 3); the math is `thattn.ops.differential`, shared with
`thattn.keras3.DifferentialAttention`, whose docstring has the
computation."""

import tf_keras

from thattn.core import attention_spec
from thattn.core import dims
from thattn.core import validation
from thattn.kernels import dispatch
from thattn.layers import core
from thattn.layers import initializers
from thattn.layers import projected
from thattn.ops import differential
from thattn.ops import tf_ops


@tf_keras.utils.register_keras_serializable(package="thattn")
class DifferentialAttention(projected.ProjectedAttention):
  """Differential attention: each head is the difference of two softmax
  maps, A_1 - lambda A_2, over values twice as wide, normalized.

  Computation (per example; N maps of K channels, N/2 heads)::

    Q[n, N, K]      = einsum(X[n, d_X], P_q[d_X, N, K])
    K[m, N, K]      = einsum(M[m, d_M], P_k[d_M, N_kv, K])   (repeated)
    V[m, N, K]      = einsum(M[m, d_M], P_v[d_M, N_kv, K])   (repeated)
    W[N, n, m]      = softmax(einsum(Q, K), masked, reduced_dim=m)
    U[N/2, n, m]    = dropout(W[:N/2] - lambda W[N/2:])
    O[n, N/2, 2K]   = einsum(U, concat(V[:, :N/2], V[:, N/2:]))
    Y[n, d_Y]       = einsum(RMSNorm(O) (1 - lambda_init), P_o[N/2, 2K, d_Y])

  with lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) +
  lambda_init and lambda_init = 0.8 - 0.6 exp(-0.3 layer_index)
  (`thattn.ops.differential`). The 1/sqrt(K) of the logits is folded into
  P_q.

  Args:
    num_heads: N, the softmax maps (DiffLlama's `num_attention_heads`);
      even: map j pairs with map j + N/2.
    key_dim: K, each map's query, key and value size (DiffLlama's
      `head_dim`); a differential head's values are 2K wide.
    value_dim: None or K (the size of each map's values, as a model config
      gives it).
    num_key_value_heads: N_kv, the heads P_k and P_v project to, shared
      by N / N_kv maps each; must divide N. Defaults to N.
    layer_index: l, the layer's 0-based depth, which sets lambda_init.
    norm_epsilon: the epsilon of the heads' RMSNorm (DiffLlama's
      `rms_norm_eps`).
    lambda_std_dev: the stddev of the lambda vectors' normal initializer
      (DiffLlama's `lambda_std_dev`).
    **kwargs: as `MultiHeadAttention` (use_bias, output_shape, dropout,
      kernel_initializer, use_gate, rotary_base, query_key_norm_epsilon,
      ...). `query_chunk_size` is refused: the chunked core mixes heads
      with P_l and P_w only.
  """

  def __init__(self, num_heads, key_dim, value_dim=None,
               num_key_value_heads=None, layer_index=0, norm_epsilon=1e-5,
               lambda_std_dev=0.1, *, query_chunk_size=None, **kwargs):
    owner = kwargs.get("name") or "DifferentialAttention"
    maps, key_dim, heads_kv = attention_spec.checked_differential_heads(
        owner, num_heads, key_dim, value_dim, num_key_value_heads)
    if query_chunk_size is not None:
      raise ValueError(f"{owner}: query_chunk_size={query_chunk_size} is "
                       "not supported: the chunked core mixes heads with "
                       "P_l and P_w only, not a difference of maps.")
    super().__init__(maps, maps, maps // 2, key_dim, value_dim=2 * key_dim,
                     **kwargs)
    # Not ProjectedAttention's sharing: K and V have N_kv heads of K, the
    # paired values N/2 heads of 2K (`repeat_shared_heads`).
    self.num_key_value_heads = heads_kv
    self.layer_index = validation.non_negative_int("layer_index",
                                                   layer_index, owner=owner)
    self.norm_epsilon = float(norm_epsilon)
    self.lambda_std_dev = float(lambda_std_dev)
    self.lambda_init = differential.lambda_init(self.layer_index)
    self._lambda_vectors = {}

  def create_weights(self, query_width, key_width, value_width):
    maps, d_k = self.num_heads, self.key_dim
    heads_kv = self.num_key_value_heads or maps
    query_init = initializers.ScaledInitializer(self.kernel_initializer,
                                                d_k ** -0.5)
    for name, equation, heads, width, initializer in (
        ("query", attention_spec.QUERY_PROJECTION, maps, query_width,
         query_init),
        ("key", attention_spec.KEY_PROJECTION, heads_kv, key_width,
         self.kernel_initializer),
        ("value", attention_spec.VALUE_PROJECTION, heads_kv, value_width,
         self.kernel_initializer)):
      setattr(self, f"_{name}_dense", self.add_axes_sublayer(
          self._einsum_dense(name, equation, (None, heads, d_k),
                             "ik" if name != "value" else "jv", initializer),
          [None, None, width], attention_spec.PROJECTION_AXES[name]))
    self._output_dense = self.add_axes_sublayer(
        self._einsum_dense("output", attention_spec.OUTPUT_PROJECTION,
                           (None, self.output_dim or query_width), "o",
                           self.kernel_initializer),
        [None, None, maps // 2, 2 * d_k],
        attention_spec.PROJECTION_AXES["output"])
    for name in differential.LAMBDA_WEIGHTS:
      self._lambda_vectors[name] = self.add_axes_weight(
          name, [d_k], (dims.D_K,),
          tf_keras.initializers.RandomNormal(stddev=self.lambda_std_dev))

  def repeat_shared_heads(self, memory_state):
    """K[b, m, N, K] and the paired values V'[b, m, N/2, 2K]."""
    return differential.attended_memory(
        tf_ops.TF_OPS, memory_state,
        self.num_heads // (self.num_key_value_heads or self.num_heads))

  def mix_weights(self, weights, query_state, memory_state):
    """U[b, N/2, n, m] = W[:N/2] - lambda W[N/2:]."""
    return differential.difference_of_maps(tf_ops.TF_OPS, weights,
                                           self.lambda_value())

  def lambda_value(self):
    """This layer's lambda now, a float32 scalar."""
    return differential.differential_lambda(
        tf_ops.TF_OPS, self._lambda_vectors, self.lambda_init)

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    # The plain TF-ops core only: no fused kernel knows the difference of
    # maps.
    context, value_weights = core.attention_core(
        dispatch.Choice(dispatch.OPS), query_state["query"],
        memory_state["key"], memory_state["value"], projections=(None, None),
        mask=mask, causal_offset=causal_offset, bias=position_bias,
        chunk_size=None, mix_logits=lambda dots: dots,
        mix_weights=lambda weights: self.mix_weights(weights, None, None),
        dropout=lambda scores: self.dropout_weights(scores, training))
    return differential.normalized_heads(
        tf_ops.TF_OPS, context, self.norm_epsilon,
        1.0 - self.lambda_init), value_weights

  @property
  def attention_scores_heads(self):
    """N/2; the scores returned are U, the differences of the maps."""
    return self.num_value_heads

  def get_config(self):
    config = super().get_config()
    config["value_dim"] = None  # each map's, K; the heads' 2K follows
    return dict(config, num_heads=self.num_heads,
                layer_index=self.layer_index, norm_epsilon=self.norm_epsilon,
                lambda_std_dev=self.lambda_std_dev)
