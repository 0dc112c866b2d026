"""The layers around the Transformer blocks: embeddings, masks, biases, pooler.

Each is a small `tf_keras` layer with `get_config`, so the BERT and T5
builders can wire them into functional models that serialize. Letters in
the comments follow `thattn.core.dims`: `t` is a vocabulary entry.
"""

import tensorflow as tf
import tf_keras

from thattn.ops import autograph
from thattn.core import validation
from thattn.layers import initializers
from thattn.models import block_wiring
from thattn.models import embedding_wiring

EMBEDDING_LOGITS = embedding_wiring.EMBEDDING_LOGITS


def _serialize_initializer(initializer):
  return tf_keras.initializers.serialize(
      tf_keras.initializers.get(initializer))


# tf_keras's glue for the shared wiring's mixins (fresh initializers:
# unseeded tf-keras initializers repeat their draws when one is shared).
TfKerasGlue = block_wiring.glue(
    "TfKerasGlue", tf_keras, serialize=tf_keras.layers.serialize,
    deserialize=tf_keras.layers.deserialize,
    serialize_initializer=_serialize_initializer, fresh=initializers.fresh)


@tf_keras.utils.register_keras_serializable(package="thattn")
class TokenEmbedding(embedding_wiring.TokenEmbeddingConfig, TfKerasGlue,
                     tf_keras.layers.Layer):
  """A token embedding E[t, d] that can also score vectors against itself.

  Its logical axes are (vocab, d_model), also for ALBERT's narrower E.
  `layer(tokens)` looks tokens up; `layer(x, mode="logits")` returns
  float32 `logits[b, n, t] = einsum(x * logits_scale, E)`. Calling the one
  layer both ways ties the input and output embeddings, as T5 does; T5
  scales the decoder output by d_model**-0.5 before the tied projection,
  because its embeddings start with unit variance.
  """

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        "embeddings", [self.vocab_size, self.width],
        initializer=initializers.fresh(self.embeddings_initializer))
    super().build(input_shape)

  @autograph.unconverted
  def call(self, inputs, mode="embed"):
    validation.one_of("mode", mode, ("embed", "logits"), owner=self.name)
    if mode == "embed":
      table = self.embeddings
      # DTensor (TF 2.21) refuses ResourceGather from a table sharded along
      # its first axis (a vocab:<mesh axis> rule), but lays out GatherV2 on
      # the table's value (its gradient then comes back replicated). Only a
      # DVariable has a `layout`; ordinary variables keep ResourceGather.
      if getattr(table, "layout", None) is not None:
        table = table.read_value()
      return tf.cast(tf.gather(table, inputs), self.compute_dtype)
    # mode == "logits": float32 logits, so that the softmax and the loss
    # never run in float16.
    scaled = tf.cast(inputs, tf.float32) * self.logits_scale
    return tf.einsum(EMBEDDING_LOGITS, scaled,
                     tf.cast(self.embeddings, tf.float32))


@tf_keras.utils.register_keras_serializable(package="thattn")
class PositionEmbedding(embedding_wiring.PositionEmbeddingConfig,
                        TfKerasGlue, tf_keras.layers.Layer):
  """BERT's learned absolute positions: returns X[b, n, d] + P[:n, d]."""

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        "embeddings", [self.max_length, input_shape[-1]],
        initializer=initializers.fresh(self.initializer))
    super().build(input_shape)

  @autograph.unconverted
  def call(self, inputs):
    length = tf.shape(inputs)[1]
    tf.debugging.assert_less_equal(
        length, self.max_length,
        message=f"{self.name}: sequence longer than max_length="
        f"{self.max_length}")
    return inputs + tf.cast(tf.expand_dims(self.embeddings[:length], 0),
                            inputs.dtype)


@tf_keras.utils.register_keras_serializable(package="thattn")
class PaddingMask(tf_keras.layers.Layer):
  """Boolean attention mask [b, 1, m] from the memory side, True = attend.

  With `pad_id`, the inputs are token ids and every id but `pad_id` may be
  attended (T5). Without it, the inputs are BERT's 0/1 `input_mask`.
  """

  def __init__(self, pad_id=None, **kwargs):
    super().__init__(**kwargs)
    self.pad_id = pad_id

  @autograph.unconverted
  def call(self, inputs):
    if self.pad_id is None:
      keep = tf.cast(inputs, tf.bool)
    else:
      keep = tf.not_equal(inputs, tf.cast(self.pad_id, inputs.dtype))
    return tf.expand_dims(keep, 1)

  def get_config(self):
    config = super().get_config()
    config["pad_id"] = self.pad_id
    return config


@tf_keras.utils.register_keras_serializable(package="thattn")
class StackPositionBias(embedding_wiring.StackPositionBiasConfig,
                        TfKerasGlue, tf_keras.layers.Layer):
  """A stack's self-attention position bias, computed once for all its blocks.

  Wraps a `thattn.layers.RelativePositionBias`, whose one weight all the
  stack's blocks share, as in T5. `layer(x)` gives the bias for
  self-attention over x's n positions, `[1, h, n, n]`; while decoding,
  `layer(x_t, memory_length=max_length, query_offset=t)` gives the rows of
  the steps in x_t.
  """

  def build(self, input_shape):
    # Built here rather than on first call, so that loading a TF-format
    # SavedModel restores into the weight the layer itself created.
    bias = self.relative_position_bias
    if not bias.built:
      with tf.name_scope(bias.name):
        bias.build(None)
    super().build(input_shape)

  @autograph.unconverted
  def call(self, inputs, memory_length=None, query_offset=0):
    query_length = tf.shape(inputs)[1]
    if memory_length is None:
      memory_length = query_length
    return self.relative_position_bias(query_length, memory_length,
                                       query_offset=query_offset)


@tf_keras.utils.register_keras_serializable(package="thattn")
class Pooler(embedding_wiring.PoolerWiring, TfKerasGlue,
             tf_keras.layers.Layer):
  """BERT's pooler: tanh(X[:, 0] W + b), the first token's summary (the
  layer is `thattn.models.embedding_wiring.PoolerWiring`)."""

  def build(self, input_shape):
    with tf.name_scope(self.dense.name):
      self.dense.build([None, input_shape[-1]])
    super().build(input_shape)

  call = autograph.unconverted(embedding_wiring.PoolerWiring.call)
