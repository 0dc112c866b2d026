"""General bilinear multihead attention (GBMA), Section 6 of the paper.

Computation (per example; letters as in `thattn.core.dims`)::

    L[h, n, m] = einsum(X[n, d_X], M[m, d_M], P[d_X, d_M, h])
    W[h, n, m] = softmax(L[h, n, m] + bias, masked, reduced_dim=m)
    Y[n, d_Y]  = einsum(dropout(W[h, n, m]), M[m, d_M], Q[d_M, d_Y, h])

Multi-head attention is GBMA with P and Q each factored into two matrices,
and talking-heads attention is GBMA with each factored into three::

    P[d_X, d_M, h] = einsum(P_q[d_X, h_k, d_k], P_k[d_M, h_k, d_k], P_l[h_k, h])
    Q[d_M, d_Y, h] = einsum(P_v[d_M, h_v, d_v], P_o[h_v, d_v, d_Y], P_w[h, h_v])

The paper notes GBMA "may have no practical use" because of its cost; it is
here as the reference point of its Table 1 (d_k = d_v = d_model).
"""

import tensorflow as tf
import tf_keras

from thattn.core import attention_spec
from thattn.core import validation
from thattn.layers import attention_ops
from thattn.layers import base
from thattn.layers import initializers


@tf_keras.utils.register_keras_serializable(package="thattn")
class GeneralBilinearAttention(base.AttentionLayer):
  """General bilinear multihead attention with h heads.

  Args:
    num_heads: h, the number of heads.
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    dropout: attention dropout on W (alias: dropout_rate).
    kernel_initializer: for P and Q. Defaults to normals with stddev
      1/sqrt(fan_in), fan_in being d_X * d_M for P and d_M * h for Q, which
      gives unit-variance logits and outputs for unit-variance inputs.
  """

  def __init__(self, num_heads, output_shape=None, dropout=0.0,
               kernel_initializer=None, **kwargs):
    super().__init__(output_shape=output_shape, dropout=dropout,
                     kernel_initializer=kernel_initializer, **kwargs)
    self.num_heads = validation.layer_int("num_heads", num_heads)

  def create_weights(self, query_width, key_width, value_width):
    attention_spec.check_one_memory(self.name, key_width, value_width)
    h = self.num_heads
    self._value_width = value_width
    output_dim = self.output_dim or query_width
    self._p = self.add_axes_weight(
        "bilinear_p", [query_width, key_width, h],
        attention_spec.BILINEAR_AXES["bilinear_p"],
        self.kernel_initializer or
        initializers.fan_in_normal(query_width * key_width))
    self._q = self.add_axes_weight(
        "bilinear_q", [value_width, output_dim, h],
        attention_spec.BILINEAR_AXES["bilinear_q"],
        self.kernel_initializer or initializers.fan_in_normal(value_width * h))

  def project_query(self, query):
    return {"query": tf.einsum(attention_spec.QUERY_BILINEAR, query, self._p)}

  def project_memory(self, key, value):
    return {"key": key, "value": value}

  def project_output(self, context):
    return tf.einsum(attention_spec.BILINEAR_OUTPUT, context, self._q)

  def gate_shape(self):
    """(h, d_M): the gate multiplies the weighted memory [b, n, h, d_M]."""
    return self.num_heads, self._value_width

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    del need_scores  # the weights are computed either way
    logits = tf.einsum(attention_spec.BILINEAR_LOGITS, query_state["query"],
                       memory_state["key"])
    shape = tf.shape(logits)
    mask = self.full_mask(mask, causal_offset, shape[2], shape[3])
    weights = tf.cast(
        attention_ops.masked_softmax(logits, mask, position_bias),
        self.compute_dtype)
    weighted_memory = tf.einsum(attention_spec.WEIGHTED_MEMORY,
                                self.dropout_weights(weights, training),
                                memory_state["value"])
    return weighted_memory, weights

  def get_config(self):
    config = super().get_config()
    config["num_heads"] = self.num_heads
    if self.kernel_initializer is None:
      config["kernel_initializer"] = None
    return config
