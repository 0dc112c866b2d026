"""A small pre-norm Transformer encoder for the recall task.

The model of `thattn-train --task=recall` (`thattn.tasks.recall`). It exists
so that attention variants can be compared on a task that trains in minutes
on a CPU and that needs the heads to carry information (the low-rank
bottleneck of Bhojanapalli et al., 2020).

Per block (T5-style pre-norm, relative position bias shared by all blocks):
    x += attention(norm(x), norm(x), position_bias=B)
    x += W_2 relu(W_1 norm(x))
"""

import tensorflow as tf
import tf_keras

from thattn import tracing
from thattn.layers import relative_position
from thattn.layers import variants


@tf_keras.utils.register_keras_serializable(package="thattn")
class RecallEncoder(tf_keras.Model):
  """Value classifier: logits[b, L, num_values] for (key, value) tokens[b, L, 2].

  The input embedding is E_key[key] + E_value[value]; value ids run up to
  num_values, the last one meaning "unknown".
  """

  def __init__(self, *, num_keys, num_values, attention="talking_heads", num_layers=2,
               d_model=64, num_heads=4, key_dim=None, d_ff=None, **kwargs):
    super().__init__(**kwargs)
    key_dim = key_dim or max(1, d_model // num_heads)
    d_ff = d_ff or 4 * d_model
    self.hyperparameters = dict(
        num_keys=num_keys, num_values=num_values, attention=attention, num_layers=num_layers,
        d_model=d_model, num_heads=num_heads, key_dim=key_dim, d_ff=d_ff)
    self.key_embedding = tf_keras.layers.Embedding(num_keys, d_model,
                                                   name="key_embedding")
    self.value_embedding = tf_keras.layers.Embedding(num_values + 1, d_model,
                                                     name="value_embedding")
    self.position_bias = relative_position.RelativePositionBias(
        num_heads, bidirectional=True, name="relative_position_bias")
    self.blocks = []
    for index in range(num_layers):
      self.blocks.append({
          "attention_norm": tf_keras.layers.LayerNormalization(
              name=f"block_{index}_attention_norm"),
          "attention": variants.make_attention(
              attention, num_heads, key_dim, name=f"block_{index}_attention"),
          "ff_norm": tf_keras.layers.LayerNormalization(
              name=f"block_{index}_ff_norm"),
          "ff_in": tf_keras.layers.Dense(d_ff, activation="relu",
                                         name=f"block_{index}_ff_in"),
          "ff_out": tf_keras.layers.Dense(d_model,
                                          name=f"block_{index}_ff_out"),
      })
    self.final_norm = tf_keras.layers.LayerNormalization(name="final_norm")
    self.classifier = tf_keras.layers.Dense(num_values, name="classifier")

  @tracing.unconverted
  def call(self, tokens, training=None):
    x = self.key_embedding(tokens[..., 0]) + self.value_embedding(tokens[..., 1])
    length = tf.shape(tokens)[1]
    bias = self.position_bias(length, length)
    for block in self.blocks:
      normed = block["attention_norm"](x)
      x += block["attention"](normed, normed, position_bias=bias,
                              training=training)
      x += block["ff_out"](block["ff_in"](block["ff_norm"](x)))
    return self.classifier(self.final_norm(x))

  def get_config(self):
    return dict(self.hyperparameters)
