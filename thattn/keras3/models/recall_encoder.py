"""The recall task's model in Keras 3 (`thattn.models.RecallEncoder`'s
twin: the same weights, by name, and the same computation,
`thattn.models.heads_and_losses.recall_logits`)."""

import keras

from thattn.core import variants
from thattn.keras3 import relative_position
from thattn.keras3.models import front_end
from thattn.models import heads_and_losses


@keras.saving.register_keras_serializable(package="thattn")
class RecallEncoder(keras.Model):
  """Value logits [b, n, num_values] for (key, value) tokens [b, n, 2].

  Args: as `thattn.models.RecallEncoder`: num_keys, num_values, attention
  (a variant of `thattn.core.variants`), num_layers, d_model, num_heads,
  key_dim (default d_model / num_heads), d_ff (default 4 d_model).
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
    layers = keras.layers
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
              "keras3", attention, num_heads, key_dim,
              layer_index=index, name=f"block_{index}_attention"),
          "ff_norm": layers.LayerNormalization(name=f"block_{index}_ff_norm"),
          "ff_in": layers.Dense(d_ff, activation="relu",
                                name=f"block_{index}_ff_in"),
          "ff_out": layers.Dense(d_model, name=f"block_{index}_ff_out"),
      })
    self.final_norm = layers.LayerNormalization(name="final_norm")
    self.classifier = layers.Dense(num_values, name="classifier")

  def call(self, tokens, training=None):
    return heads_and_losses.recall_logits(
        front_end.KERAS3_OPS, tokens, self.key_embedding,
        self.value_embedding, self.position_bias, self.blocks,
        self.final_norm, self.classifier, training=training)

  def get_config(self):
    return dict(self.hyperparameters)
