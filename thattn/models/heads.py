"""Task heads on tf_keras: the output layers of masked LM, classification and
SQuAD (`thattn.tasks`), their Keras 3 twins in `thattn.keras3.models.heads`.

Each computation is written once for both front ends in
`thattn.models.heads_and_losses`; the layers here hold the weights (their
names are the ones released runs and `.keras` files carry) and call it with
TensorFlow's ops. Registered for serialization as `thattn>MaskedLMHead` and
so on, as they were when they lived in the task modules.

`MaskedLMHead` is BERT's output layer for masked LM (Devlin et al., 2019, and
the released code): the sequence output at the masked positions goes through
a dense layer, the feed-forward activation and a layer norm, then is scored
against the word embeddings (tied) plus a per-token bias (letters as in
`thattn.core.dims`; p counts the masked positions, e the embedding width):

    H[b, p, d] = gather(X[b, n, d], positions[b, p])
    T[b, p, e] = LayerNorm(act(H W_t + b_t))
    logits[b, p, t] = einsum(T[b, p, e], E[t, e]) + bias[t]

For ALBERT, e is the factorized embedding width E, so the tie still holds.
"""

import tf_keras

from thattn.core import dims
from thattn.models import blocks
from thattn.models import embeddings
from thattn.models import front_end
from thattn.models import heads_and_losses
from thattn.ops import autograph


@tf_keras.utils.register_keras_serializable(package="thattn")
class MaskedLMHead(tf_keras.layers.Layer):
  """Logits [b, p, t] (float32) at the masked positions; see the module
  (`thattn.models.heads_and_losses.masked_lm_logits`).

  Args:
    embedding: the backbone's `TokenEmbedding` (its `word_embeddings`
      layer), whose table scores the outputs. Not serialized: rebuild the
      head around the backbone's layer.
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
    self.transform = tf_keras.layers.Dense(
        embedding.width, kernel_initializer=tf_keras.initializers
        .TruncatedNormal(stddev=initializer_range), name="transform")
    self.norm = tf_keras.layers.LayerNormalization(
        epsilon=layer_norm_epsilon, name="transform_norm")

  def build(self, input_shape, positions_shape=None):
    del positions_shape  # any number of positions
    input_shape = list(input_shape)
    blocks.build_sublayer(self.transform, input_shape)
    blocks.build_sublayer(self.norm,
                          input_shape[:-1] + [self.embedding.width])
    self.output_bias_initializer = tf_keras.initializers.get("zeros")
    self.output_bias = self.add_weight(
        name="output_bias", shape=(self.embedding.vocab_size,),
        initializer=self.output_bias_initializer)
    super().build(input_shape)

  @property
  def logical_axes(self):
    # The bias follows the tied table's vocab axis, so a vocab rule shards
    # both alike; the transform (d_model -> embedding width) stays whole.
    return {self.output_bias.name: (dims.VOCAB,)}

  @autograph.unconverted
  def call(self, sequence_output, positions):
    return heads_and_losses.masked_lm_logits(
        front_end.TF_KERAS_OPS, sequence_output, positions, self.transform,
        self._activation, self.norm, self.embedding, self.output_bias)

  def get_config(self):
    # The tied embedding is a live layer, not a config value.
    return dict(super().get_config(), activation=self.activation,
                initializer_range=self.initializer_range,
                layer_norm_epsilon=self.layer_norm_epsilon)


@tf_keras.utils.register_keras_serializable(package="thattn")
class ClassificationHead(tf_keras.layers.Layer):
  """Logits [b, num_classes] from a pooled output [b, d]
  (`thattn.models.heads_and_losses.classification_logits`).

  inner_dim > 0 adds a Dense+tanh pooler first, for backbones without one
  (T5's encoder, after taking position 0). num_classes=1 is regression and
  returns [b].
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
    self.dense = (tf_keras.layers.Dense(
        inner_dim, activation="tanh", kernel_initializer=kernel_initializer,
        name="pooler_dense") if inner_dim else None)
    self.dropout = tf_keras.layers.Dropout(dropout_rate)
    self.out_proj = tf_keras.layers.Dense(
        num_classes, kernel_initializer=kernel_initializer, name="logits")

  def build(self, input_shape):
    input_shape = list(input_shape)
    if self.dense is not None:
      blocks.build_sublayer(self.dense, input_shape)
      input_shape = input_shape[:-1] + [self.inner_dim]
    blocks.build_sublayer(self.out_proj, input_shape)
    super().build(input_shape)

  @autograph.unconverted
  def call(self, pooled_output, training=None):
    return heads_and_losses.classification_logits(
        pooled_output, self.dense, self.dropout, self.out_proj,
        self.num_classes, training=training)

  def get_config(self):
    return dict(super().get_config(), num_classes=self.num_classes,
                inner_dim=self.inner_dim, dropout_rate=self.dropout_rate,
                kernel_initializer=self.kernel_initializer)


@tf_keras.utils.register_keras_serializable(package="thattn")
class SpanHead(tf_keras.layers.Layer):
  """(start_logits, end_logits) [b, n] = X[b, n, d] W[d, 2] + b from a
  sequence output (`thattn.models.heads_and_losses.split_span_logits`).

  With a boolean mask [b, n], positions where it is False get -1e9 logits.
  """

  def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.kernel_initializer = kernel_initializer
    self.dense = tf_keras.layers.Dense(
        2, kernel_initializer=kernel_initializer, name="span_logits")

  def build(self, input_shape):
    blocks.build_sublayer(self.dense, list(input_shape))
    super().build(input_shape)

  @autograph.unconverted
  def call(self, sequence_output, mask=None):
    return heads_and_losses.split_span_logits(
        front_end.TF_KERAS_OPS, self.dense(sequence_output), mask,
        self.compute_dtype)

  def get_config(self):
    return dict(super().get_config(),
                kernel_initializer=self.kernel_initializer)
