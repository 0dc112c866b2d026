"""The layers around the Transformer blocks, in Keras 3: embeddings, the
stack's position bias, the pooler, the padding and prefix LM masks.

`thattn.models.embeddings` in `keras.ops`, with the same weights (names,
shapes, order), so a Keras 3 model and its tf_keras twin exchange weights
with `set_weights(get_weights())`. Letters follow `thattn.core.dims`: `t` is a
vocabulary entry.
"""

import keras
from keras import ops

from thattn.core import dims
from thattn.core import validation
from thattn.keras3 import initializers
from thattn.keras3 import lookups
from thattn.ops import embeddings
from thattn.ops import masks

_serialize = keras.saving.serialize_keras_object


def padding_mask(tokens, pad_id=None):
  """Boolean attention mask [b, 1, m], True = attend: every id but `pad_id`
  (T5), or BERT's 0/1 `input_mask` when `pad_id` is None."""
  if pad_id is None:
    keep = ops.cast(tokens, "bool")
  else:
    keep = ops.not_equal(tokens, pad_id)
  return ops.expand_dims(keep, 1)


def prefix_lm_mask(causal_attention):
  """A prefix LM's boolean self-attention mask [b, n, n] from its
  `decoder_causal_attention` [b, n] (`thattn.ops.masks.prefix_lm_mask`)."""
  return masks.prefix_lm_mask(ops, causal_attention)


@keras.saving.register_keras_serializable(package="thattn")
class TokenEmbedding(keras.layers.Layer):
  """A token embedding E[t, d] that also scores vectors against itself.

  `layer(tokens)` looks tokens up; `layer(x, mode="logits")` returns
  float32 `logits[b, n, t] = einsum(x * logits_scale, E)` (T5's tied
  embedding, with its d_model**-0.5). Its logical axes are (vocab,
  d_model), also for ALBERT's narrower E.

  Args:
    vocab_size: t, the vocabulary's size.
    width: the embedding's width (d_model, or ALBERT's E).
    embeddings_initializer: of E.
    logits_scale: multiplies x before `mode="logits"` scores it.
  """

  def __init__(self, vocab_size, width, embeddings_initializer="uniform",
               logits_scale=1.0, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.width = width
    self.embeddings_initializer = keras.initializers.get(
        embeddings_initializer)
    self.logits_scale = float(logits_scale)

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

  @property
  def logical_axes(self):
    return {self.embeddings.path: (dims.VOCAB, dims.D_MODEL)}

  def call(self, inputs, mode="embed"):
    validation.one_of("mode", mode, ("embed", "logits"), owner=self.name)
    if mode == "embed":
      return ops.cast(lookups.lookup(self.embeddings, inputs),
                      self.compute_dtype)
    return embeddings.embedding_logits(ops, inputs, self.embeddings,
                                       self.logits_scale)

  def compute_output_spec(self, inputs, mode="embed"):
    if mode == "embed":
      return keras.KerasTensor(tuple(inputs.shape) + (self.width,),
                               self.compute_dtype)
    return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.vocab_size,),
                             "float32")

  def get_config(self):
    return dict(super().get_config(), vocab_size=self.vocab_size,
                width=self.width,
                embeddings_initializer=_serialize(self.embeddings_initializer),
                logits_scale=self.logits_scale)


@keras.saving.register_keras_serializable(package="thattn")
class PositionEmbedding(keras.layers.Layer):
  """Learned absolute positions (BERT, GPT-2): X[b, n, d] + P[:n, d], for at
  most `max_length` positions, or, with `offset` (a decoding step t),
  X + P[t:t + n]. No rule shards the position axis: it stays
  replicated."""

  def __init__(self, max_length, initializer="uniform", **kwargs):
    super().__init__(**kwargs)
    self.max_length = max_length
    # Keras's convention, weight `w` from `w_initializer`: the run's seeded
    # initial weights (thattn.keras3.models.initial_weights) read it.
    self.embeddings_initializer = keras.initializers.get(initializer)

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        name="embeddings", shape=(self.max_length, input_shape[-1]),
        initializer=initializers.fresh(self.embeddings_initializer))

  @property
  def logical_axes(self):
    return {self.embeddings.path: (None, dims.D_MODEL)}

  def call(self, inputs, offset=None):
    length = inputs.shape[1]
    if isinstance(length, int) and length > self.max_length:
      raise ValueError(f"{self.name}: a sequence of {length} positions, "
                       f"longer than max_length={self.max_length}.")
    if offset is None:
      positions = self.embeddings[:ops.shape(inputs)[1]]
    else:  # a traced step: the rows are gathered, not sliced
      rows = ops.cast(offset, "int32") + ops.arange(ops.shape(inputs)[1],
                                                   dtype="int32")
      positions = ops.take(self.embeddings, rows, axis=0)
    return inputs + ops.cast(ops.expand_dims(positions, 0), inputs.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return dict(super().get_config(), max_length=self.max_length,
                initializer=_serialize(self.embeddings_initializer))


@keras.saving.register_keras_serializable(package="thattn")
class StackPositionBias(keras.layers.Layer):
  """A stack's self-attention position bias [1, h, n, n], one weight shared
  by all its blocks (T5): wraps a `thattn.keras3.RelativePositionBias`
  (a layer, or its serialized config)."""

  def __init__(self, relative_position_bias, **kwargs):
    super().__init__(**kwargs)
    if isinstance(relative_position_bias, dict):
      relative_position_bias = keras.saving.deserialize_keras_object(
          relative_position_bias)
    self.relative_position_bias = relative_position_bias

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

  def get_config(self):
    return dict(super().get_config(),
                relative_position_bias=_serialize(self.relative_position_bias))


@keras.saving.register_keras_serializable(package="thattn")
class Pooler(keras.layers.Layer):
  """BERT's pooler: tanh(X[:, 0] W + b), the first token's summary."""

  def __init__(self, width, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.width = width
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.dense = keras.layers.Dense(
        width, activation="tanh",
        kernel_initializer=initializers.fresh(self.kernel_initializer),
        dtype=self.dtype_policy, name="dense")

  def build(self, input_shape):
    self.dense.build((None, input_shape[-1]))

  @property
  def logical_axes(self):
    return {self.dense.kernel.path: (dims.D_MODEL, dims.D_MODEL),
            self.dense.bias.path: (dims.D_MODEL,)}

  def call(self, inputs):
    return self.dense(inputs[:, 0])

  def compute_output_shape(self, input_shape):
    return (input_shape[0], self.width)

  def get_config(self):
    return dict(super().get_config(), width=self.width,
                kernel_initializer=_serialize(self.kernel_initializer))
