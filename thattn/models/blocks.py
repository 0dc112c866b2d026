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
"""

import tensorflow as tf
import tf_keras

from thattn import dims
from thattn import tracing
from thattn import validation
from thattn.layers import base
from thattn.layers import initializers
from thattn.models import wiring


def _serialize_initializer(initializer):
  return tf_keras.initializers.serialize(
      tf_keras.initializers.get(initializer))


def _build_sublayer(layer, input_shape, memory_shape=None):
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


def _deserialize_layers(config, names):
  config = dict(config)
  for name in names:
    if isinstance(config.get(name), dict):
      config[name] = tf_keras.layers.deserialize(config[name])
  return config


# The functions behind thattn.models.config.ACTIVATIONS, for the blocks here
# and the task heads (thattn.tasks.mlm).
_ACTIVATIONS = {
    "relu": tf.nn.relu,
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),
    "gelu_approximate": lambda x: tf.nn.gelu(x, approximate=True),
}


def activation_function(name):
  """The function an activation name of config.ACTIVATIONS stands for."""
  validation.one_of("activation", name, tuple(_ACTIVATIONS))
  return _ACTIVATIONS[name]


@tf_keras.utils.register_keras_serializable(package="thattn")
class RMSNorm(tf_keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale.

  Unlike LayerNormalization it subtracts no mean and adds no bias. It runs
  in float32 under mixed precision.
  """

  def __init__(self, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon

  def build(self, input_shape):
    self.scale = self.add_weight("scale", [input_shape[-1]],
                                 initializer="ones")
    super().build(input_shape)

  @property
  def logical_axes(self):
    return {self.scale.name: (dims.D_MODEL,)}

  @tracing.unconverted
  def call(self, inputs):
    x = tf.cast(inputs, tf.float32)
    variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
    y = x * tf.math.rsqrt(variance + self.epsilon)
    return tf.cast(y * tf.cast(self.scale, tf.float32), self.compute_dtype)

  def get_config(self):
    config = super().get_config()
    config["epsilon"] = self.epsilon
    return config


@tf_keras.utils.register_keras_serializable(package="thattn")
class FeedForward(tf_keras.layers.Layer):
  """Position-wise feed-forward network.

  Computation (per position):
      H[f]  = act(X[d] W_i[d, f] (+ b_i))          plain
      H[f]  = act(X[d] W_i[d, f]) * X[d] W_g[d, f]  gated (T5.1.1's gated-GELU)
      Y[d]  = dropout(H[f]) W_o[f, d] (+ b_o)

  `dropout_rate` is on the hidden layer, where T5 puts it; BERT has none
  there (its block drops out the output instead).
  """

  def __init__(self, d_ff, activation="relu", gated=False, use_bias=False,
               dropout_rate=0.0, kernel_initializer="glorot_uniform",
               output_initializer=None, **kwargs):
    super().__init__(**kwargs)
    activation_function(activation)  # fails early on an unknown name
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
    d_model = input_shape[-1]
    self.input_dense = self._dense(self.d_ff, self.kernel_initializer,
                                   "input")
    self.gate_dense = (self._dense(self.d_ff, self.kernel_initializer, "gate")
                       if self.gated else None)
    self.output_dense = self._dense(d_model, self.output_initializer,
                                    "output")
    hidden_shape = tf.TensorShape(input_shape)[:-1].concatenate([self.d_ff])
    for layer, shape in ((self.input_dense, input_shape),
                         (self.gate_dense, input_shape),
                         (self.output_dense, hidden_shape)):
      _build_sublayer(layer, shape)
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

  @tracing.unconverted
  def call(self, inputs, training=None):
    hidden = activation_function(self.activation)(self.input_dense(inputs))
    if self.gate_dense is not None:
      hidden *= self.gate_dense(inputs)
    hidden = self._dropout(hidden, training=training)
    return self.output_dense(hidden)

  def get_config(self):
    config = super().get_config()
    config.update(
        d_ff=self.d_ff, activation=self.activation, gated=self.gated,
        use_bias=self.use_bias, dropout_rate=self.dropout_rate,
        kernel_initializer=_serialize_initializer(self.kernel_initializer),
        output_initializer=_serialize_initializer(self.output_initializer))
    return config


@tf_keras.utils.register_keras_serializable(package="thattn")
class PostNormBlock(tf_keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN)."""

  def __init__(self, attention, feed_forward, dropout_rate=0.0,
               epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    self.attention = attention
    self.feed_forward = feed_forward
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    self.attention_norm = tf_keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name="attention_norm")
    self.feed_forward_norm = tf_keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name="feed_forward_norm")
    self._dropout = tf_keras.layers.Dropout(dropout_rate,
                                            dtype=self.dtype_policy)

  def build(self, input_shape):
    for layer in (self.attention, self.attention_norm, self.feed_forward,
                  self.feed_forward_norm):
      _build_sublayer(layer, input_shape)
    super().build(input_shape)

  @tracing.unconverted
  def call(self, inputs, attention_mask=None, position_bias=None,
           training=None):
    x = inputs
    y = self.attention(x, x, attention_mask=attention_mask,
                       position_bias=position_bias, training=training)
    x = self.attention_norm(x + self._dropout(y, training=training))
    y = self.feed_forward(x, training=training)
    return self.feed_forward_norm(x + self._dropout(y, training=training))

  def get_config(self):
    config = super().get_config()
    config.update(attention=tf_keras.layers.serialize(self.attention),
                  feed_forward=tf_keras.layers.serialize(self.feed_forward),
                  dropout_rate=self.dropout_rate, epsilon=self.epsilon)
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**_deserialize_layers(config, ("attention", "feed_forward")))


@tf_keras.utils.register_keras_serializable(package="thattn")
class PreNormBlock(wiring.PreNormWiring, tf_keras.layers.Layer):
  """T5's Transformer layer: RMSNorm, sublayer, dropout, residual.

  Args:
    self_attention: an attention layer (any `thattn.layers` variant).
    feed_forward: a `FeedForward`.
    cross_attention: for decoder blocks, the attention over the encoder.
    causal: decoder self-attention, each position seeing only the past.
    dropout_rate: on every sublayer's output, before the residual add.
    epsilon: of the RMSNorms.

  Call:
    block(x, memory=None, attention_mask=None, memory_mask=None,
          position_bias=None, training=None, cache=None, decode_step=None)

    `attention_mask` is for self-attention, `memory_mask` for the cross-
    attention, both boolean and broadcastable to [b, n, m]. To decode, pass
    `cache=block.initial_cache(batch, max_length, memory)` and
    `decode_step=t`; the block then returns `(y, cache)`.
  """

  def __init__(self, self_attention, feed_forward, cross_attention=None,
               causal=False, dropout_rate=0.0, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.self_attention = self_attention
    self.feed_forward = feed_forward
    self.cross_attention = cross_attention
    self.causal = causal
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    norm = lambda name: RMSNorm(epsilon, dtype=self.dtype_policy, name=name)
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
      _build_sublayer(layer, input_shape)
    super().build(input_shape)

  # The call and the decoding cache are thattn.models.wiring's, written
  # once for both front ends; AutoGraph must not convert the call (it
  # branches in Python on whether a cache is given).
  call = tracing.unconverted(wiring.PreNormWiring.call)

  def get_config(self):
    config = super().get_config()
    config.update(
        self_attention=tf_keras.layers.serialize(self.self_attention),
        feed_forward=tf_keras.layers.serialize(self.feed_forward),
        cross_attention=(None if self.cross_attention is None else
                         tf_keras.layers.serialize(self.cross_attention)),
        causal=self.causal, dropout_rate=self.dropout_rate,
        epsilon=self.epsilon)
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**_deserialize_layers(
        config, ("self_attention", "feed_forward", "cross_attention")))
