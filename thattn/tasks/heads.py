"""Pretraining heads and losses: BERT's masked-LM head and masked cross-entropy.

`MaskedLMHead` is BERT's output layer for masked LM (Devlin et al., 2019, and
the released code): the sequence output at the masked positions goes through
a dense layer, the feed-forward activation and a layer norm, then is scored
against the word embeddings (tied) plus a per-token bias:

    H[b, p, d] = gather(X[b, n, d], positions[b, p])
    T[b, p, e] = LayerNorm(act(H W_t + b_t))          e = embedding width
    logits[b, p, v] = einsum(T[b, p, e], E[v, e]) + bias[v]

For ALBERT, e is the factorized embedding width E, so the tie still holds.

`masked_cross_entropy` is the mean cross-entropy in nats over the positions
whose weight is nonzero: for a language model, ln(PPL).
"""

import tensorflow as tf
import tf_keras

from thattn import dims
from thattn.models import blocks
from thattn.models import embeddings



@tf_keras.utils.register_keras_serializable(package="thattn")
class MaskedLMHead(tf_keras.layers.Layer):
  """Logits [b, p, vocab] (float32) at the masked positions; see the module.

  Args:
    embedding: the backbone's `TokenEmbedding` (its `word_embeddings`
      layer), whose table scores the outputs. Not serialized: rebuild the
      head around the backbone's layer.
    activation: a name from thattn.models.config.ACTIVATIONS.
    initializer_range: stddev of the truncated-normal transform kernel.
  """

  def __init__(self, embedding, activation="gelu", initializer_range=0.02,
               layer_norm_epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    if not isinstance(embedding, embeddings.TokenEmbedding):
      raise ValueError(f"embedding must be a TokenEmbedding, got "
                       f"{embedding!r}.")
    blocks.activation_function(activation)  # fails early on an unknown name
    self.embedding = embedding
    self.activation = activation
    self.initializer_range = initializer_range
    self.layer_norm_epsilon = layer_norm_epsilon
    self.transform = tf_keras.layers.Dense(
        embedding.width, kernel_initializer=tf_keras.initializers
        .TruncatedNormal(stddev=initializer_range), name="transform")
    self.norm = tf_keras.layers.LayerNormalization(epsilon=layer_norm_epsilon,
                                                   name="transform_norm")

  def build(self, input_shape):
    with tf.name_scope(self.transform.name):
      self.transform.build(input_shape)
    with tf.name_scope(self.norm.name):
      self.norm.build(input_shape[:-1] + [self.embedding.width])
    self.output_bias = self.add_weight(
        "output_bias", [self.embedding.vocab_size], initializer="zeros")
    super().build(input_shape)

  @property
  def logical_axes(self):
    # The bias follows the tied table's vocab axis, so a vocab rule shards
    # both alike; the transform (d_model -> embedding width) stays whole.
    return {self.output_bias.name: (dims.VOCAB,)}

  def call(self, sequence_output, positions):
    hidden = tf.gather(sequence_output, positions, batch_dims=1)
    activation = blocks.activation_function(self.activation)
    hidden = self.norm(activation(self.transform(hidden)))
    logits = self.embedding(hidden, mode="logits")
    return logits + tf.cast(self.output_bias, tf.float32)

  def get_config(self):
    # The tied embedding is a live layer, not a config value.
    return dict(super().get_config(), activation=self.activation,
                initializer_range=self.initializer_range,
                layer_norm_epsilon=self.layer_norm_epsilon)


def masked_cross_entropy(targets, logits, weights):
  """(sum of weighted cross-entropies, sum of weights), in nats.

  Returned apart, so that a mean over several batches or replicas weighs
  every position alike: ln(PPL) = total / count.
  """
  losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(targets, tf.int32), logits=tf.cast(logits, tf.float32))
  weights = tf.cast(weights, tf.float32)
  return tf.reduce_sum(losses * weights), tf.reduce_sum(weights)
