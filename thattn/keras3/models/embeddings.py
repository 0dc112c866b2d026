"""The layers around the Transformer blocks, in Keras 3: embeddings, the
stack's position bias, the pooler, the padding mask.

`thattn.models.embeddings` in `keras.ops`, with the same weights (names,
shapes, order), so a Keras 3 model and its tf_keras twin exchange weights
with `set_weights(get_weights())`. Letters follow `thattn.core.dims`: `t` is a
vocabulary entry.
"""

import keras
from keras import ops

from thattn.core import validation
from thattn.keras3 import initializers
from thattn.keras3 import lookups
from thattn.models import block_wiring
from thattn.models import embedding_wiring

EMBEDDING_LOGITS = embedding_wiring.EMBEDDING_LOGITS


# Keras 3's glue for the shared wiring's mixins.
Keras3Glue = block_wiring.glue(
    "Keras3Glue", keras, serialize=keras.saving.serialize_keras_object,
    deserialize=keras.saving.deserialize_keras_object,
    serialize_initializer=keras.saving.serialize_keras_object,
    fresh=initializers.fresh)


def padding_mask(tokens, pad_id=None):
  """Boolean attention mask [b, 1, m], True = attend: every id but `pad_id`
  (T5), or BERT's 0/1 `input_mask` when `pad_id` is None."""
  if pad_id is None:
    keep = ops.cast(tokens, "bool")
  else:
    keep = ops.not_equal(tokens, pad_id)
  return ops.expand_dims(keep, 1)


@keras.saving.register_keras_serializable(package="thattn")
class TokenEmbedding(embedding_wiring.TokenEmbeddingConfig, Keras3Glue,
                     keras.layers.Layer):
  """A token embedding E[t, d] that also scores vectors against itself.

  `layer(tokens)` looks tokens up; `layer(x, mode="logits")` returns
  float32 `logits[b, n, t] = einsum(x * logits_scale, E)` (T5's tied
  embedding, with its d_model**-0.5).
  """

  def build(self, input_shape=None):
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.vocab_size, self.width),
        initializer=initializers.fresh(self.embeddings_initializer),
        # Read in float32 under a mixed policy too. Autocast would gather
        # from a bfloat16 copy, and the gradient would be a bfloat16
        # scatter-add into [t, d], which rounds every row it sums and which
        # GPUs serialize where rows collide (the padding id): about 75 ms
        # of a BERT-base step on an H200 (benchmarks/RESULTS.md, "Keras 3
        # models on a GPU"). The variable's own flag, since a layer's
        # `autocast = False` (keras.layers.Embedding's way) does not hold
        # when the layer is the first mixed one called (Keras 3.15).
        autocast=False)

  def call(self, inputs, mode="embed"):
    validation.one_of("mode", mode, ("embed", "logits"), owner=self.name)
    if mode == "embed":
      return ops.cast(lookups.lookup(self.embeddings, inputs),
                      self.compute_dtype)
    # float32 logits, so the softmax and the loss never run in float16.
    scaled = ops.cast(inputs, "float32") * self.logits_scale
    return ops.einsum(EMBEDDING_LOGITS, scaled,
                      ops.cast(self.embeddings, "float32"))

  def compute_output_spec(self, inputs, mode="embed"):
    if mode == "embed":
      return keras.KerasTensor(tuple(inputs.shape) + (self.width,),
                               self.compute_dtype)
    return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.vocab_size,),
                             "float32")


@keras.saving.register_keras_serializable(package="thattn")
class PositionEmbedding(embedding_wiring.PositionEmbeddingConfig,
                        Keras3Glue, keras.layers.Layer):
  """BERT's learned absolute positions: X[b, n, d] + P[:n, d]."""

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.max_length, input_shape[-1]),
        initializer=initializers.fresh(self.initializer))

  def call(self, inputs):
    length = inputs.shape[1]
    if isinstance(length, int) and length > self.max_length:
      raise ValueError(f"{self.name}: a sequence of {length} positions, "
                       f"longer than max_length={self.max_length}.")
    positions = self.embeddings[:ops.shape(inputs)[1]]
    return inputs + ops.cast(ops.expand_dims(positions, 0), inputs.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape


@keras.saving.register_keras_serializable(package="thattn")
class StackPositionBias(embedding_wiring.StackPositionBiasConfig,
                        Keras3Glue, keras.layers.Layer):
  """A stack's self-attention position bias [1, h, n, n], one weight shared
  by all its blocks (T5): wraps a `thattn.keras3.RelativePositionBias`."""

  def build(self, input_shape):
    if not self.relative_position_bias.built:
      self.relative_position_bias.build()

  def call(self, inputs, memory_length=None, query_offset=0):
    query_length = ops.shape(inputs)[1]
    return self.relative_position_bias(
        query_length=query_length,
        memory_length=query_length if memory_length is None else
        memory_length, query_offset=query_offset)

  def compute_output_spec(self, inputs, memory_length=None, query_offset=0):
    del query_offset
    length = inputs.shape[1]
    return keras.KerasTensor(
        (1, self.relative_position_bias.num_heads, length,
         length if memory_length is None else memory_length), "float32")


@keras.saving.register_keras_serializable(package="thattn")
class Pooler(embedding_wiring.PoolerWiring, Keras3Glue, keras.layers.Layer):
  """BERT's pooler: tanh(X[:, 0] W + b), the first token's summary (the
  layer is `thattn.models.embedding_wiring.PoolerWiring`)."""

  def build(self, input_shape):
    self.dense.build((None, input_shape[-1]))

  def compute_output_shape(self, input_shape):
    return (input_shape[0], self.width)
