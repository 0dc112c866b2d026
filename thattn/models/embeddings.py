"""The layers around the Transformer blocks: embeddings, masks, biases, pooler.

Each is a small `tf_keras` layer with `get_config`, so the BERT and T5
builders can wire them into functional models that serialize. Letters in
the comments follow `thattn.core.dims`: `t` is a vocabulary entry.
"""

import tensorflow as tf
import tf_keras

from thattn.core import dims
from thattn.core import validation
from thattn.layers import initializers
from thattn.ops import autograph
from thattn.ops import embeddings
from thattn.ops import masks
from thattn.ops import tf_ops


@tf_keras.utils.register_keras_serializable(package="thattn")
class TokenEmbedding(tf_keras.layers.Layer):
  """A token embedding E[t, d] that can also score vectors against itself.

  Its logical axes are (vocab, d_model), also for ALBERT's narrower E.
  `layer(tokens)` looks tokens up; `layer(x, mode="logits")` returns
  float32 `logits[b, n, t] = einsum(x * logits_scale, E)`. Calling the one
  layer both ways ties the input and output embeddings, as T5 does; T5
  scales the decoder output by d_model**-0.5 before the tied projection,
  because its embeddings start with unit variance.
  """

  def __init__(self, vocab_size, width, embeddings_initializer="uniform",
               logits_scale=1.0, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.width = width
    self.embeddings_initializer = tf_keras.initializers.get(
        embeddings_initializer)
    self.logits_scale = float(logits_scale)
    # Whether mode="logits" was called: a tied table (see `call`).
    self._used_for_logits = False

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        "embeddings", [self.vocab_size, self.width],
        initializer=initializers.fresh(self.embeddings_initializer))
    super().build(input_shape)

  @property
  def logical_axes(self):
    return {self.embeddings.name: (dims.VOCAB, dims.D_MODEL)}

  @autograph.unconverted
  def call(self, inputs, mode="embed"):
    validation.one_of("mode", mode, ("embed", "logits"), owner=self.name)
    if mode == "embed":
      table = self.embeddings
      # A table the layer also scores with (tied: T5's, GPT-2's, whose
      # functional models call mode="logits" as they are built) is
      # gathered from its value (GatherV2): a ResourceGather puts a
      # resource variable in copy-on-read mode, after which every dense
      # read, the logits' among them, copies the whole table (GPT-2's
      # 50257 x 768 logits took 108 ms a decoding step instead of 7 ms).
      # A table only looked up keeps ResourceGather, whose sparse updates
      # (Adam's) would put it in that mode anyway. DTensor (TF 2.21) also
      # needs GatherV2: it refuses ResourceGather from a table sharded
      # along its first axis (a vocab:<mesh axis> rule); only a DVariable
      # has a `layout`.
      if self._used_for_logits or getattr(table, "layout", None) is not None:
        table = table.read_value()
      return tf.cast(tf.gather(table, inputs), self.compute_dtype)
    self._used_for_logits = True
    return embeddings.embedding_logits(tf_ops.TF_OPS, inputs,
                                       self.embeddings, self.logits_scale)

  def get_config(self):
    return dict(super().get_config(), vocab_size=self.vocab_size,
                width=self.width,
                embeddings_initializer=tf_keras.initializers.serialize(
                    self.embeddings_initializer),
                logits_scale=self.logits_scale)


@tf_keras.utils.register_keras_serializable(package="thattn")
class PositionEmbedding(tf_keras.layers.Layer):
  """Learned absolute positions (BERT, GPT-2): returns X[b, n, d] + P[:n, d],
  or, with `offset` (a decoding step t), X + P[t:t + n].

  No rule shards the position axis: it stays replicated.
  """

  def __init__(self, max_length, initializer="uniform", **kwargs):
    super().__init__(**kwargs)
    self.max_length = max_length
    # Keras's convention, weight `w` from `w_initializer`: the run's seeded
    # initial weights (thattn.models.initial_weights) read it.
    self.embeddings_initializer = tf_keras.initializers.get(initializer)

  def build(self, input_shape):
    self.embeddings = self.add_weight(
        "embeddings", [self.max_length, input_shape[-1]],
        initializer=initializers.fresh(self.embeddings_initializer))
    super().build(input_shape)

  @property
  def logical_axes(self):
    return {self.embeddings.name: (None, dims.D_MODEL)}

  def get_config(self):
    return dict(super().get_config(), max_length=self.max_length,
                initializer=tf_keras.initializers.serialize(
                    self.embeddings_initializer))

  @autograph.unconverted
  def call(self, inputs, offset=None):
    length = tf.shape(inputs)[1]
    if offset is None:
      tf.debugging.assert_less_equal(
          length, self.max_length,
          message=f"{self.name}: sequence longer than max_length="
          f"{self.max_length}")
      rows = self.embeddings[:length]
    else:
      offset = tf.cast(offset, tf.int32)
      tf.debugging.assert_less_equal(
          offset + length, self.max_length,
          message=f"{self.name}: decoding past max_length="
          f"{self.max_length}")
      rows = tf.gather(self.embeddings, offset + tf.range(length))
    return inputs + tf.cast(tf.expand_dims(rows, 0), inputs.dtype)


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
class PrefixLMMask(tf_keras.layers.Layer):
  """A prefix LM's boolean self-attention mask [b, n, n] from its
  `decoder_causal_attention` [b, n] (`thattn.ops.masks.prefix_lm_mask`)."""

  @autograph.unconverted
  def call(self, inputs):
    return masks.prefix_lm_mask(tf_ops.TF_OPS, inputs)


@tf_keras.utils.register_keras_serializable(package="thattn")
class StackPositionBias(tf_keras.layers.Layer):
  """A stack's self-attention position bias, computed once for all its blocks.

  Wraps a `thattn.layers.RelativePositionBias`, whose one weight all the
  stack's blocks share, as in T5. `layer(x)` gives the bias for
  self-attention over x's n positions, `[1, h, n, n]`; while decoding,
  `layer(x_t, memory_length=max_length, query_offset=t)` gives the rows of
  the steps in x_t.
  """

  def __init__(self, relative_position_bias, **kwargs):
    super().__init__(**kwargs)
    if isinstance(relative_position_bias, dict):
      relative_position_bias = tf_keras.layers.deserialize(
          relative_position_bias)
    self.relative_position_bias = relative_position_bias

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

  def get_config(self):
    return dict(super().get_config(),
                relative_position_bias=tf_keras.layers.serialize(
                    self.relative_position_bias))


@tf_keras.utils.register_keras_serializable(package="thattn")
class Pooler(tf_keras.layers.Layer):
  """BERT's pooler: tanh(X[:, 0] W + b), the first token's summary."""

  def __init__(self, width, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.width = width
    self.kernel_initializer = tf_keras.initializers.get(kernel_initializer)
    self.dense = tf_keras.layers.Dense(
        width, activation="tanh",
        kernel_initializer=initializers.fresh(self.kernel_initializer),
        dtype=self.dtype_policy, name="dense")

  def build(self, input_shape):
    with tf.name_scope(self.dense.name):
      self.dense.build([None, input_shape[-1]])
    super().build(input_shape)

  @property
  def logical_axes(self):
    return {self.dense.kernel.name: (dims.D_MODEL, dims.D_MODEL),
            self.dense.bias.name: (dims.D_MODEL,)}

  @autograph.unconverted
  def call(self, inputs):
    return self.dense(inputs[:, 0])

  def get_config(self):
    return dict(super().get_config(), width=self.width,
                kernel_initializer=tf_keras.initializers.serialize(
                    self.kernel_initializer))
