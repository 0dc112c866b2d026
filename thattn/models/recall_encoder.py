"""A small pre-norm Transformer encoder for the recall task.

The model of `thattn-train --task=recall` (`thattn.tasks.recall`). It exists
so that attention variants can be compared on a task that trains in minutes
on a CPU and that needs the heads to carry information (the low-rank
bottleneck of Bhojanapalli et al., 2020).

Per block (T5-style pre-norm, relative position bias shared by all blocks):
    x += attention(norm(x), norm(x), position_bias=B)
    x += W_2 relu(W_1 norm(x))
"""

import tf_keras

from thattn.core import variants
from thattn.layers import relative_position
from thattn.models import front_end
from thattn.models import heads_and_losses
from thattn.ops import autograph


@tf_keras.utils.register_keras_serializable(package="thattn")
class RecallEncoder(tf_keras.Model):
  """Value classifier: logits[b, L, num_values] for (key, value) tokens[b, L, 2]
  (`thattn.models.heads_and_losses.recall_logits`).

  The input embedding is E_key[key] + E_value[value]; value ids run up to
  num_values, the last one meaning "unknown". `attention` names a variant
  of `thattn.core.variants`; key_dim defaults to d_model / num_heads and
  d_ff to 4 d_model.
  """

  def __init__(self, *, num_keys, num_values, attention="talking_heads",
               num_layers=2, d_model=64, num_heads=4, key_dim=None, d_ff=None,
               **kwargs):
    super().__init__(**kwargs)
    self.hyperparameters = heads_and_losses.recall_hyperparameters(
        num_keys, num_values, attention, num_layers, d_model, num_heads,
        key_dim, d_ff)
    key_dim, d_ff = (self.hyperparameters["key_dim"],
                     self.hyperparameters["d_ff"])
    layers = tf_keras.layers
    self.key_embedding = layers.Embedding(num_keys, d_model,
                                          name="key_embedding")
    self.value_embedding = layers.Embedding(num_values + 1, d_model,
                                            name="value_embedding")
    self.position_bias = relative_position.RelativePositionBias(
        num_heads, bidirectional=True, name="relative_position_bias")
    self.blocks = []
    for index in range(num_layers):
      self.blocks.append({
          "attention_norm": layers.LayerNormalization(
              name=f"block_{index}_attention_norm"),
          "attention": variants.make_attention(
              "tf_keras", attention, num_heads, key_dim,
              layer_index=index, name=f"block_{index}_attention"),
          "ff_norm": layers.LayerNormalization(name=f"block_{index}_ff_norm"),
          "ff_in": layers.Dense(d_ff, activation="relu",
                                name=f"block_{index}_ff_in"),
          "ff_out": layers.Dense(d_model, name=f"block_{index}_ff_out"),
      })
    self.final_norm = layers.LayerNormalization(name="final_norm")
    self.classifier = layers.Dense(num_values, name="classifier")

  @autograph.unconverted
  def call(self, tokens, training=None):
    return heads_and_losses.recall_logits(
        front_end.TF_KERAS_OPS, tokens, self.key_embedding,
        self.value_embedding, self.position_bias, self.blocks,
        self.final_norm, self.classifier, training=training)

  def get_config(self):
    return dict(self.hyperparameters)
