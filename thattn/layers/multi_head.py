"""Multi-head attention (Vaswani et al., 2017) in the paper's notation.

Computation (per example; letters as in `thattn.dims`; Section 3.3):

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

from thattn.layers import projected


@tf_keras.utils.register_keras_serializable(package="thattn")
class MultiHeadAttention(projected.ProjectedAttention):
  """Multi-head attention with h heads of sizes d_k and d_v.

  Args:
    num_heads: h.
    key_dim: d_k; free, not tied to d_model / h (fixed head size of
      Bhojanapalli et al., 2020).
    value_dim: d_v; defaults to key_dim.
    output_dim: d_Y; defaults to the query width.
    use_bias: biases on P_q, P_k, P_v and P_o.
    dropout_rate: attention dropout on W.
    kernel_initializer: for P_q (scaled by d_k**-0.5), P_k, P_v and P_o.
    bias_initializer: for the biases.
    query_chunk_size: if set, compute the attention core in chunks of this
      many queries with recomputation in the backward pass (see
      `TalkingHeadsAttention`).
  """

  def __init__(self, num_heads, key_dim, value_dim=None, output_dim=None,
               use_bias=False, dropout_rate=0.0,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               query_chunk_size=None, **kwargs):
    super().__init__(num_heads, num_heads, num_heads, key_dim,
                     value_dim=value_dim, output_dim=output_dim,
                     use_bias=use_bias, dropout_rate=dropout_rate,
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer,
                     query_chunk_size=query_chunk_size, **kwargs)

  def get_config(self):
    config = super().get_config()
    config["num_heads"] = self.num_heads
    return config
