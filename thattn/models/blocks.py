"""Transformer blocks that take their attention and feed-forward layers.

A block owns only its norms and residual dropout; the attention layers and
the feed-forward network are passed in as instances, so any
`thattn.layers` attention variant drops into any block, and a model can
share one block (ALBERT) or one layer between blocks.

- `PostNormBlock` is BERT's and ALBERT's layer:
      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))
- `PreNormBlock` is T5's layer, with RMSNorm:
      x += dropout(self_attention(norm(x), norm(x)))
      x += dropout(cross_attention(norm(x), memory))      (decoder only)
      x += dropout(feed_forward(norm(x)))
  and it decodes incrementally with the attention layers' caches.

The computations are `thattn.ops.blocks`', shared with the Keras 3 blocks
(`thattn.keras3.models.blocks`); the classes here hold their arguments,
weights and configs.
"""

import tensorflow as tf
import tf_keras

from thattn.core import dims
from thattn.core import validation
from thattn.layers import base
from thattn.layers import initializers
from thattn.ops import autograph
from thattn.ops import blocks
from thattn.ops import tf_ops


def build_sublayer(layer, input_shape, memory_shape=None):
  """Builds a sublayer in its own name scope, as its first call would.

  Blocks build their sublayers in `build`, so that loading a TF-format
  SavedModel (which calls `build` with the saved input shape before it
  restores the weights) finds every weight created by its own layer.
  """
  if layer is None:
    return
  with tf.name_scope(layer.name):
    if isinstance(layer, base.AttentionLayer):
      # build_from_shapes is idempotent; Keras may have marked the layer
      # built without its weights.
      layer.build_from_shapes(input_shape, memory_shape or input_shape)
    elif not layer.built:
      layer.build(input_shape)


def activation_function(name):
  """The activation of thattn.models.config.ACTIVATIONS named `name`, in
  TensorFlow (for the blocks here and the masked-LM head)."""
  return blocks.activation(tf_ops.TF_OPS, name)


def serialize_sublayer(layer):
  return None if layer is None else tf_keras.layers.serialize(layer)


def deserialize_sublayers(config, names):
  """`config` with its sublayers `names` deserialized (None kept)."""
  config = dict(config)
  for name in names:
    if isinstance(config.get(name), dict):
      config[name] = tf_keras.layers.deserialize(config[name])
  return config


@tf_keras.utils.register_keras_serializable(package="thattn")
class RMSNorm(tf_keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale.

  Unlike LayerNormalization it subtracts no mean and adds no bias. It runs
  in float32 under mixed precision (`thattn.ops.blocks.rms_norm`).
  """

  def __init__(self, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon
    self.scale_initializer = tf_keras.initializers.get("ones")

  def build(self, input_shape):
    self.scale = self.add_weight("scale", [input_shape[-1]],
                                 initializer=self.scale_initializer)
    super().build(input_shape)

  @property
  def logical_axes(self):
    return {self.scale.name: (dims.D_MODEL,)}

  @autograph.unconverted
  def call(self, inputs):
    return blocks.rms_norm(tf_ops.TF_OPS, inputs, self.scale, self.epsilon,
                           self.compute_dtype)

  def get_config(self):
    return dict(super().get_config(), epsilon=self.epsilon)


@tf_keras.utils.register_keras_serializable(package="thattn")
class FeedForward(tf_keras.layers.Layer):
  """Position-wise feed-forward network (`thattn.ops.blocks.feed_forward`)::

      H[f]  = act(X[d] W_i[d, f] (+ b_i))          plain
      H[f]  = act(X[d] W_i[d, f]) * X[d] W_g[d, f]  gated (T5.1.1's gated-GELU)
      Y[d]  = dropout(H[f]) W_o[f, d] (+ b_o)

  `activation` is one of thattn.models.config.ACTIVATIONS. `dropout_rate`
  is on the hidden layer, where T5 puts it; BERT has none there (its block
  drops out the output instead). `output_initializer` (default: the
  `kernel_initializer`) starts W_o.
  """

  def __init__(self, d_ff, activation="relu", gated=False, use_bias=False,
               dropout_rate=0.0, kernel_initializer="glorot_uniform",
               output_initializer=None, **kwargs):
    super().__init__(**kwargs)
    self._activation = activation_function(activation)  # fails early
    self.d_ff = d_ff
    self.activation = activation
    self.gated = gated
    self.use_bias = use_bias
    self.dropout_rate = dropout_rate
    self.kernel_initializer = tf_keras.initializers.get(kernel_initializer)
    self.output_initializer = tf_keras.initializers.get(
        output_initializer or kernel_initializer)
    self._dropout = tf_keras.layers.Dropout(dropout_rate,
                                            dtype=self.dtype_policy)

  def _dense(self, units, initializer, name):
    return tf_keras.layers.Dense(
        units, use_bias=self.use_bias,
        kernel_initializer=initializers.fresh(initializer),
        dtype=self.dtype_policy, name=name)

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape).as_list()
    kernel, output = self.kernel_initializer, self.output_initializer
    self.input_dense = self._dense(self.d_ff, kernel, "input")
    self.gate_dense = (self._dense(self.d_ff, kernel, "gate")
                       if self.gated else None)
    self.output_dense = self._dense(input_shape[-1], output, "output")
    build_sublayer(self.input_dense, input_shape)
    build_sublayer(self.gate_dense, input_shape)
    build_sublayer(self.output_dense, input_shape[:-1] + [self.d_ff])
    super().build(input_shape)

  @property
  def logical_axes(self):
    axes = {}
    for layer, kernel_axes in ((self.input_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.gate_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.output_dense, (dims.D_FF, dims.D_MODEL))):
      if layer is not None:
        axes[layer.kernel.name] = kernel_axes
        if layer.use_bias:
          axes[layer.bias.name] = kernel_axes[-1:]
    return axes

  @autograph.unconverted
  def call(self, inputs, training=None):
    return blocks.feed_forward(inputs, self.input_dense, self.gate_dense,
                               self.output_dense, self._activation,
                               self._dropout, training=training)

  def get_config(self):
    serialize = tf_keras.initializers.serialize
    return dict(super().get_config(), d_ff=self.d_ff,
                activation=self.activation, gated=self.gated,
                use_bias=self.use_bias, dropout_rate=self.dropout_rate,
                kernel_initializer=serialize(self.kernel_initializer),
                output_initializer=serialize(self.output_initializer))


@tf_keras.utils.register_keras_serializable(package="thattn")
class PostNormBlock(tf_keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN)
  (`thattn.ops.blocks.post_norm_block`).

  Args:
    attention: an attention layer (any `thattn.layers` variant).
    feed_forward: a `FeedForward`.
    dropout_rate: on both sublayers' outputs, before the residual add.
    epsilon: of the LayerNorms.
  """

  def __init__(self, attention, feed_forward, dropout_rate=0.0,
               epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    self.attention = attention
    self.feed_forward = feed_forward
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    norm = lambda name: tf_keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name=name)
    self.attention_norm = norm("attention_norm")
    self.feed_forward_norm = norm("feed_forward_norm")
    self._dropout = tf_keras.layers.Dropout(dropout_rate,
                                            dtype=self.dtype_policy)

  def build(self, input_shape):
    for layer in (self.attention, self.attention_norm, self.feed_forward,
                  self.feed_forward_norm):
      build_sublayer(layer, input_shape)
    super().build(input_shape)

  @autograph.unconverted
  def call(self, inputs, attention_mask=None, position_bias=None,
           training=None):
    return blocks.post_norm_block(
        inputs, self.attention, self.attention_norm, self.feed_forward,
        self.feed_forward_norm, self._dropout, attention_mask=attention_mask,
        position_bias=position_bias, training=training)

  def get_config(self):
    return dict(super().get_config(), dropout_rate=self.dropout_rate,
                epsilon=self.epsilon,
                attention=serialize_sublayer(self.attention),
                feed_forward=serialize_sublayer(self.feed_forward))

  @classmethod
  def from_config(cls, config):
    return cls(**deserialize_sublayers(config, ("attention",
                                                "feed_forward")))


@tf_keras.utils.register_keras_serializable(package="thattn")
class PreNormBlock(tf_keras.layers.Layer):
  """T5's Transformer layer, and the decoder-only LMs': norm, sublayer,
  dropout, residual (`thattn.ops.blocks.pre_norm_block`).

  Args:
    self_attention: an attention layer (any `thattn.layers` variant).
    feed_forward: a `FeedForward`.
    cross_attention: for decoder blocks, the attention over the encoder.
    causal: decoder self-attention, each position seeing only the past.
    dropout_rate: on every sublayer's output, before the residual add.
    epsilon: of the norms.
    norm: "rms_norm" (T5, Llama) or "layer_norm" (LayerNorm with its bias:
      GPT-2, GPT-NeoX), before each sublayer.
    parallel_residual: GPT-NeoX's block, the feed-forward network reading
      the block's input beside the attention (no cross-attention then).

  Call::

    block(x, memory=None, attention_mask=None, memory_mask=None,
          position_bias=None, training=None, cache=None, decode_step=None)

    `attention_mask` is for self-attention, `memory_mask` for the cross-
    attention, both boolean and broadcastable to [b, n, m]. To decode, pass
    `cache=block.initial_cache(batch, max_length, memory)` and
    `decode_step=t`; the block then returns `(y, cache)`.
  """

  _SUBLAYERS = ("self_attention", "feed_forward", "cross_attention")

  def __init__(self, self_attention, feed_forward, cross_attention=None,
               causal=False, dropout_rate=0.0, epsilon=1e-6, norm="rms_norm",
               parallel_residual=False, **kwargs):
    super().__init__(**kwargs)
    validation.one_of("norm", norm, ("rms_norm", "layer_norm"),
                      owner=self.name)
    if parallel_residual and cross_attention is not None:
      raise ValueError(f"{self.name}: parallel_residual=True is GPT-NeoX's "
                       "decoder-only block; a block with cross_attention has "
                       "none.")
    self.self_attention = self_attention
    self.feed_forward = feed_forward
    self.cross_attention = cross_attention
    self.causal = causal
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    self.norm = norm
    self.parallel_residual = parallel_residual
    if norm == "rms_norm":
      norm = lambda name: RMSNorm(epsilon, dtype=self.dtype_policy, name=name)
    else:
      norm = lambda name: tf_keras.layers.LayerNormalization(
          epsilon=epsilon, dtype=self.dtype_policy, name=name)
    self.self_attention_norm = norm("self_attention_norm")
    self.cross_attention_norm = (norm("cross_attention_norm")
                                 if cross_attention is not None else None)
    self.feed_forward_norm = norm("feed_forward_norm")
    self._dropout = tf_keras.layers.Dropout(dropout_rate,
                                            dtype=self.dtype_policy)

  def build(self, input_shape):
    # The cross-attention memory (the encoder output) has the same width
    # as the decoder in every thattn model.
    for layer in (self.self_attention_norm, self.self_attention,
                  self.cross_attention_norm, self.cross_attention,
                  self.feed_forward_norm, self.feed_forward):
      build_sublayer(layer, input_shape)
    super().build(input_shape)

  def initial_cache(self, batch_size, max_length, memory=None):
    """Empty self-attention cache; the cross-attention memory, projected."""
    return blocks.pre_norm_initial_cache(
        self.name, self.self_attention, self.cross_attention, batch_size,
        max_length, memory)

  # Not converted by AutoGraph: the call branches in Python on whether a
  # cache is given.
  @autograph.unconverted
  def call(self, inputs, memory=None, attention_mask=None, memory_mask=None,
           position_bias=None, training=None, cache=None, decode_step=None):
    sublayers = {name: getattr(self, name)
                 for name in blocks.PRE_NORM_SUBLAYERS}
    return blocks.pre_norm_block(
        inputs, sublayers, self._dropout, self.causal, memory=memory,
        attention_mask=attention_mask, memory_mask=memory_mask,
        position_bias=position_bias, training=training, cache=cache,
        decode_step=decode_step, parallel_residual=self.parallel_residual)

  def get_config(self):
    config = dict(super().get_config(), causal=self.causal,
                  dropout_rate=self.dropout_rate, epsilon=self.epsilon,
                  norm=self.norm, parallel_residual=self.parallel_residual)
    config.update({name: serialize_sublayer(getattr(self, name))
                   for name in self._SUBLAYERS})
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**deserialize_sublayers(config, cls._SUBLAYERS))
