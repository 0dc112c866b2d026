"""General bilinear multihead attention (Section 6) as a Keras 3 layer.

Computation (per example; letters as in `thattn.core.dims`)::

    L[h, n, m] = einsum(X[n, d_X], M[m, d_M], P[d_X, d_M, h])
    W[h, n, m] = softmax(L[h, n, m] + bias, masked, reduced_dim=m)
    Y[n, d_Y]  = einsum(dropout(W[h, n, m]), M[m, d_M], Q[d_M, d_Y, h])

`thattn.layers.GeneralBilinearAttention` in Keras 3: the same arguments and
the weights `bilinear_p [d_X, d_M, h]` and `bilinear_q [d_M, d_Y, h]`.
"""

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.core import validation
from thattn.keras3 import attention_math
from thattn.keras3 import base


@keras.saving.register_keras_serializable(package="thattn")
class GeneralBilinearAttention(base.AttentionLayer):
  """General bilinear attention with h heads reading the whole memory.

  Args:
    num_heads: h.
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    dropout: attention dropout on W (alias: dropout_rate).
    kernel_initializer: for P and Q; defaults to normals with stddev
      1/sqrt(fan_in), fan_in d_X * d_M for P and d_M * h for Q
      (unit-variance logits and outputs for unit-variance inputs).
    flash_attention: None or False (True is refused: below).
    use_gate, sliding_window, seed: as in `keras.layers.MultiHeadAttention`.
    kernel_regularizer, bias_regularizer, activity_regularizer: as in Keras.
    kernel_constraint, bias_constraint: as in Keras.

  P and Q stay the layer's own weights, named as in thattn.layers (the
  names the two front ends, the models and Mesh TensorFlow conversion
  share), not projections of one input each: so `query_dense`,
  `key_dense`, `value_dense` and `output_dense` are None and LoRA and
  quantization have nothing to act on here (the gate, with `use_gate`, is
  a projection: it gates the weighted memory [b, n, h, d_M]). There is no
  fused kernel for this core: `flash_attention` may be None or False, and
  True is refused.
  """

  def __init__(self, num_heads, output_shape=None, dropout=0.0,
               kernel_initializer=None, *, flash_attention=None, **kwargs):
    super().__init__(output_shape=output_shape, dropout=dropout,
                     kernel_initializer=kernel_initializer, **kwargs)
    self.num_heads = validation.layer_int("num_heads", num_heads)
    if flash_attention:
      raise ValueError(
          f"{self.name}: flash_attention=True, but general bilinear "
          "attention's core (logits X P M^T, one bilinear form per head) is "
          "not a dot-product attention of projected queries and keys, and "
          "thattn has no fused kernel for it; pass flash_attention=None.")
    if flash_attention not in (None, False):
      raise ValueError(f"{self.name}: `flash_attention` must be None, True "
                       f"or False. Received: flash_attention="
                       f"{flash_attention!r}")

  def _initializer(self, fan_in):
    return self.kernel_initializer or keras.initializers.RandomNormal(
        stddev=fan_in ** -0.5)

  def create_weights(self, query_width, key_width, value_width):
    attention_spec.check_one_memory(self.name, key_width, value_width)
    h = self.num_heads
    self._value_width = value_width
    self._p = self.add_axes_weight(
        "bilinear_p", [query_width, key_width, h],
        attention_spec.BILINEAR_AXES["bilinear_p"],
        self._initializer(query_width * key_width))
    self._q = self.add_axes_weight(
        "bilinear_q", [value_width, self.output_dim or query_width, h],
        attention_spec.BILINEAR_AXES["bilinear_q"],
        self._initializer(value_width * h))

  def gate_shape(self):
    return self.num_heads, self._value_width

  def project_query(self, query):
    return {"query": ops.einsum(attention_spec.QUERY_BILINEAR, query,
                                self._p)}

  def project_output(self, context):
    return ops.einsum(attention_spec.BILINEAR_OUTPUT, context, self._q)

  def project_memory(self, key, value):
    return {"key": key, "value": value}

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    del need_scores  # the weights are formed anyway
    logits = ops.einsum(attention_spec.BILINEAR_LOGITS, query_state["query"],
                        memory_state["key"])
    _, _, query_length, memory_length = ops.shape(logits)
    mask = self.full_mask(mask, causal_offset, query_length, memory_length)
    weights = ops.cast(
        attention_math.masked_softmax(logits, mask, position_bias),
        self.compute_dtype)
    weighted_memory = ops.einsum(attention_spec.WEIGHTED_MEMORY,
                                 self.dropout_weights(weights, training),
                                 memory_state["value"])
    return weighted_memory, weights

  def get_config(self):
    config = super().get_config()
    config["num_heads"] = self.num_heads
    return config
