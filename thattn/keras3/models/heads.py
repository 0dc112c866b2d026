"""Task heads in Keras 3.

`MaskedLMHead`, `ClassificationHead` and `SpanHead` are the heads of the
tasks masked LM, classification and SQuAD (`thattn.tasks`), their
computations written once for both front ends in `thattn.models.
heads_and_losses`. They have the tf_keras heads' weights' names
(`thattn.core.weight_names.shared_name`), so a run's head moves between
the fronts by name (`thattn.io.checkpoint_reading`).
"""

import keras

from thattn.core import dims
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings
from thattn.keras3.models import front_end
from thattn.models import heads_and_losses


def _build_sublayer(layer, input_shape):
  if not layer.built:
    layer.build(tuple(input_shape))


@keras.saving.register_keras_serializable(package="thattn")
class MaskedLMHead(keras.layers.Layer):
  """Float32 logits [b, p, t] at the masked positions (`thattn.models.
  heads.MaskedLMHead`; `thattn.models.heads_and_losses.masked_lm_logits`).

  Args:
    embedding: the backbone's `TokenEmbedding` (`word_embeddings`), whose
      table scores the outputs (tied; not serialized).
    activation: a name from thattn.models.config.ACTIVATIONS.
    initializer_range: stddev of the truncated-normal transform kernel.
    layer_norm_epsilon: of the transform's LayerNorm.
  """

  def __init__(self, embedding, activation="gelu", initializer_range=0.02,
               layer_norm_epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    if not isinstance(embedding, embeddings.TokenEmbedding):
      raise ValueError(f"embedding must be a TokenEmbedding, got "
                       f"{embedding!r}.")
    self._activation = blocks.activation_function(activation)  # fails early
    self.embedding = embedding
    self.activation = activation
    self.initializer_range = initializer_range
    self.layer_norm_epsilon = layer_norm_epsilon
    self.transform = keras.layers.Dense(
        embedding.width, kernel_initializer=keras.initializers
        .TruncatedNormal(stddev=initializer_range), name="transform")
    self.norm = keras.layers.LayerNormalization(
        epsilon=layer_norm_epsilon, name="transform_norm")

  def build(self, input_shape, positions_shape=None):
    del positions_shape  # any number of positions
    input_shape = list(input_shape)
    _build_sublayer(self.transform, input_shape)
    _build_sublayer(self.norm, input_shape[:-1] + [self.embedding.width])
    self.output_bias_initializer = keras.initializers.get("zeros")
    self.output_bias = self.add_weight(
        name="output_bias", shape=(self.embedding.vocab_size,),
        initializer=self.output_bias_initializer)

  @property
  def logical_axes(self):
    # The bias follows the tied table's vocab axis (as on tf_keras).
    return {self.output_bias.path: (dims.VOCAB,)}

  def call(self, sequence_output, positions):
    return heads_and_losses.masked_lm_logits(
        front_end.KERAS3_OPS, sequence_output, positions, self.transform,
        self._activation, self.norm, self.embedding, self.output_bias)

  def get_config(self):
    # The tied embedding is a live layer, not a config value.
    return dict(super().get_config(), activation=self.activation,
                initializer_range=self.initializer_range,
                layer_norm_epsilon=self.layer_norm_epsilon)


@keras.saving.register_keras_serializable(package="thattn")
class ClassificationHead(keras.layers.Layer):
  """Logits [b, num_classes] (regression: [b]) from a pooled output [b, d]
  (`thattn.models.heads.ClassificationHead`;
  `thattn.models.heads_and_losses.classification_logits`).

  Args:
    num_classes: c; 1 is regression.
    inner_dim: > 0 adds a Dense+tanh pooler first (T5's encoder).
    dropout_rate: on the pooled output.
    kernel_initializer: of the dense layers.
  """

  def __init__(self, num_classes, *, inner_dim=0, dropout_rate=0.1,
               kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    if num_classes < 1:
      raise ValueError(f"num_classes must be positive, got {num_classes}.")
    self.num_classes = num_classes
    self.inner_dim = inner_dim
    self.dropout_rate = dropout_rate
    self.kernel_initializer = kernel_initializer
    self.dense = (keras.layers.Dense(
        inner_dim, activation="tanh", kernel_initializer=kernel_initializer,
        name="pooler_dense") if inner_dim else None)
    self.dropout = keras.layers.Dropout(dropout_rate)
    self.out_proj = keras.layers.Dense(
        num_classes, kernel_initializer=kernel_initializer, name="logits")

  def build(self, input_shape):
    input_shape = list(input_shape)
    if self.dense is not None:
      _build_sublayer(self.dense, input_shape)
      input_shape = input_shape[:-1] + [self.inner_dim]
    _build_sublayer(self.out_proj, input_shape)

  def call(self, pooled_output, training=None):
    return heads_and_losses.classification_logits(
        pooled_output, self.dense, self.dropout, self.out_proj,
        self.num_classes, training=training)

  def get_config(self):
    return dict(super().get_config(), num_classes=self.num_classes,
                inner_dim=self.inner_dim, dropout_rate=self.dropout_rate,
                kernel_initializer=self.kernel_initializer)


@keras.saving.register_keras_serializable(package="thattn")
class SpanHead(keras.layers.Layer):
  """(start_logits, end_logits) [b, n] from a sequence output [b, n, d]
  (`thattn.models.heads.SpanHead`;
  `thattn.models.heads_and_losses.split_span_logits`); with a boolean mask
  [b, n], -1e9 where it is False."""

  def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.kernel_initializer = kernel_initializer
    self.dense = keras.layers.Dense(
        2, kernel_initializer=kernel_initializer, name="span_logits")

  def build(self, input_shape):
    _build_sublayer(self.dense, list(input_shape))

  def call(self, sequence_output, mask=None):
    return heads_and_losses.split_span_logits(
        front_end.KERAS3_OPS, self.dense(sequence_output), mask,
        self.compute_dtype)

  def get_config(self):
    return dict(super().get_config(),
                kernel_initializer=self.kernel_initializer)
