"""Multi-head attention (Vaswani et al., 2017) in the paper's notation.

Computation (per example; letters as in `thattn.core.dims`; Section 3.3)::

    Q[n, h, d_k] = einsum(X[n, d_X], P_q[d_X, h, d_k])
    K[m, h, d_k] = einsum(M[m, d_M], P_k[d_M, h, d_k])
    V[m, h, d_v] = einsum(M[m, d_M], P_v[d_M, h, d_v])
    L[h, n, m]   = einsum(Q[n, h, d_k], K[m, h, d_k])
    W[h, n, m]   = softmax(L[h, n, m] + bias, masked, reduced_dim=m)
    O[n, h, d_v] = einsum(dropout(W[h, n, m]), V[m, h, d_v])
    Y[n, d_Y]    = einsum(O[n, h, d_v], P_o[h, d_v, d_Y])

The logits are not divided by sqrt(d_k) at run time: that factor starts in
P_q's initializer (see `thattn.layers.initializers.ScaledInitializer`).
"""

import tf_keras

from thattn.core import attention_spec
from thattn.layers import projected


@tf_keras.utils.register_keras_serializable(package="thattn")
class MultiHeadAttention(projected.ProjectedAttention):
  """Multi-head attention with h heads of sizes d_k and d_v.

  A drop-in for `tf_keras.layers.MultiHeadAttention`: the same
  constructor arguments in the same positional order, and the same call.
  What differs by design (docs/coming_from_keras.md): 1/sqrt(d_k) is folded
  into P_q instead of applied at run time, biases are off by default, and
  inputs are [batch, length, width] only (`attention_axes` None or (1,)).
  `thattn.layers.from_keras` converts a built tf_keras layer, weights
  included, with equal outputs.

  Args:
    num_heads: h, the number of heads.
    key_dim: d_k; free, not tied to d_model / h (fixed head size of
      Bhojanapalli et al., 2020).
    value_dim: d_v; defaults to key_dim.
    dropout: attention dropout on W (alias: dropout_rate).
    use_bias: biases on P_q, P_k, P_v and P_o (the paper has none; tf_keras
      defaults to True).
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    attention_axes: only None or (1,), tf_keras's default for rank-3 inputs.
    kernel_initializer: for P_q (scaled by d_k**-0.5), P_k, P_v and P_o.
    bias_initializer: for the biases.
    kernel_regularizer, bias_regularizer, activity_regularizer: as in
      tf_keras (the activity regularizer applies to the layer's output).
    kernel_constraint, bias_constraint: as in tf_keras.
    num_key_value_heads: h_kv, the heads P_k and P_v project to, shared
      by groups of the key and value heads (grouped-query attention, as
      `keras.layers.GroupQueryAttention`'s and Llama's); must divide
      h. Defaults to h (none shared).
    rotary_base: turns on rotary position embeddings (RoFormer; Llama's
      and GPT-NeoX's): Q and K turned by position before the logits, a
      call's rows at [0, n) and [0, m), or from the decoding step on (the
      cache keeps the turned keys), with frequencies base^(-2r / rotated)
      (10000.0 in RoFormer and GPT-NeoX, 500000.0 in Llama 3;
      `thattn.ops.rotary`). None (the default): no positions here.
    rotary_pct: the leading fraction of each head that turns (GPT-NeoX's
      rotary_pct; Pythia 0.25); 1.0 by default.
    rotary_scaling: None or Llama 3.1 and 3.2's frequency scaling, a dict
      of `thattn.ops.rotary.Llama3Scaling`'s fields (a Hugging Face
      `rope_scaling` of rope_type "llama3" reads as is).
    query_key_norm_epsilon: None (the default) or an epsilon: Q and K
      RMS-normalized over d_k, head by head, each with a learned scale
      [d_k] (`query_norm`, `key_norm`; Qwen3's and DCFormer's q/k norm),
      before the rotation; the queries' scale starts at d_k**-0.5, the
      logits' scale, which the norm would undo in P_q.
    query_chunk_size: if set, compute the attention core in chunks of this
      many queries with recomputation in the backward pass (see
      `TalkingHeadsAttention`).
  """

  def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0,
               use_bias=False, output_shape=None, attention_axes=None,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               kernel_regularizer=None, bias_regularizer=None,
               activity_regularizer=None, kernel_constraint=None,
               bias_constraint=None, *, query_chunk_size=None, **kwargs):
    attention_spec.check_attention_axes(
        kwargs.get("name") or "MultiHeadAttention", attention_axes)
    super().__init__(num_heads, num_heads, num_heads, key_dim,
                     value_dim=value_dim, dropout=dropout, use_bias=use_bias,
                     output_shape=output_shape,
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer,
                     kernel_regularizer=kernel_regularizer,
                     bias_regularizer=bias_regularizer,
                     activity_regularizer=activity_regularizer,
                     kernel_constraint=kernel_constraint,
                     bias_constraint=bias_constraint,
                     query_chunk_size=query_chunk_size, **kwargs)

  def get_config(self):
    config = super().get_config()
    config["num_heads"] = self.num_heads
    return config
