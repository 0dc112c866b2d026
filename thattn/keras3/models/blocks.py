"""Transformer blocks that take their attention and feed-forward layers, in
Keras 3.

`thattn.models.blocks` in `keras.ops`, with the same weights (names,
shapes, order): a block owns its norms and residual dropout, and takes the
attention layers (any `thattn.keras3` variant) and the feed-forward network
as instances.

- `PostNormBlock` (BERT, ALBERT):
      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))
- `PreNormBlock` (T5), with RMSNorm:
      x += dropout(self_attention(norm(x), norm(x)))
      x += dropout(cross_attention(norm(x), memory))      (decoder only)
      x += dropout(feed_forward(norm(x)))
"""

import keras
from keras import ops

from thattn import dims
from thattn import validation
from thattn.keras3 import initializers
from thattn.models import wiring

ACTIVATIONS = {
    "relu": keras.ops.relu,
    "gelu": lambda x: keras.ops.gelu(x, approximate=False),
    "gelu_approximate": lambda x: keras.ops.gelu(x, approximate=True),
}


def activation_function(name):
  """The function an activation name of thattn.models.config stands for."""
  validation.one_of("activation", name, tuple(ACTIVATIONS))
  return ACTIVATIONS[name]


def _deserialize_layers(config, names):
  config = dict(config)
  for name in names:
    if isinstance(config.get(name), dict):
      config[name] = keras.saving.deserialize_keras_object(config[name])
  return config


@keras.saving.register_keras_serializable(package="thattn")
class RMSNorm(keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale, in
  float32; no mean subtracted, no bias."""

  def __init__(self, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon

  def build(self, input_shape):
    self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                 initializer="ones")

  @property
  def logical_axes(self):
    return {self.scale.path: (dims.D_MODEL,)}

  def call(self, inputs):
    x = ops.cast(inputs, "float32")
    variance = ops.mean(ops.square(x), axis=-1, keepdims=True)
    y = x * ops.rsqrt(variance + self.epsilon)
    return ops.cast(y * ops.cast(self.scale, "float32"), self.compute_dtype)

  def get_config(self):
    config = super().get_config()
    config["epsilon"] = self.epsilon
    return config


@keras.saving.register_keras_serializable(package="thattn")
class FeedForward(keras.layers.Layer):
  """Position-wise feed-forward network (thattn.models.blocks.FeedForward):

      H[f] = act(X[d] W_i[d, f] (+ b_i))           plain
      H[f] = act(X[d] W_i[d, f]) * X[d] W_g[d, f]   gated (T5.1.1)
      Y[d] = dropout(H[f]) W_o[f, d] (+ b_o)
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
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.output_initializer = keras.initializers.get(
        output_initializer or kernel_initializer)
    self._dropout = keras.layers.Dropout(dropout_rate,
                                         dtype=self.dtype_policy)

  def _dense(self, units, initializer, name):
    return keras.layers.Dense(units, use_bias=self.use_bias,
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
    hidden_shape = tuple(input_shape[:-1]) + (self.d_ff,)
    for layer, shape in ((self.input_dense, input_shape),
                         (self.gate_dense, input_shape),
                         (self.output_dense, hidden_shape)):
      if layer is not None:
        layer.build(shape)

  @property
  def logical_axes(self):
    axes = {}
    for layer, kernel_axes in ((self.input_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.gate_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.output_dense, (dims.D_FF, dims.D_MODEL))):
      if layer is not None:
        axes[layer.kernel.path] = kernel_axes
        if layer.use_bias:
          axes[layer.bias.path] = kernel_axes[-1:]
    return axes

  def call(self, inputs, training=None):
    hidden = activation_function(self.activation)(self.input_dense(inputs))
    if self.gate_dense is not None:
      hidden = hidden * self.gate_dense(inputs)
    hidden = self._dropout(hidden, training=training)
    return self.output_dense(hidden)

  def get_config(self):
    config = super().get_config()
    serialize = keras.saving.serialize_keras_object
    config.update(d_ff=self.d_ff, activation=self.activation,
                  gated=self.gated, use_bias=self.use_bias,
                  dropout_rate=self.dropout_rate,
                  kernel_initializer=serialize(self.kernel_initializer),
                  output_initializer=serialize(self.output_initializer))
    return config


def _build_attention(layer, input_shape, memory_shape=None):
  if not layer.built:
    layer.build(input_shape, memory_shape or input_shape)


@keras.saving.register_keras_serializable(package="thattn")
class PostNormBlock(keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN)."""

  def __init__(self, attention, feed_forward, dropout_rate=0.0,
               epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    self.attention = attention
    self.feed_forward = feed_forward
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    self.attention_norm = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name="attention_norm")
    self.feed_forward_norm = keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name="feed_forward_norm")
    self._dropout = keras.layers.Dropout(dropout_rate,
                                         dtype=self.dtype_policy)

  def build(self, input_shape):
    _build_attention(self.attention, input_shape)
    for layer in (self.attention_norm, self.feed_forward,
                  self.feed_forward_norm):
      if not layer.built:
        layer.build(input_shape)

  def call(self, inputs, attention_mask=None, position_bias=None,
           training=None):
    x = inputs
    y = self.attention(x, x, attention_mask=attention_mask,
                       position_bias=position_bias, training=training)
    x = self.attention_norm(x + self._dropout(y, training=training))
    y = self.feed_forward(x, training=training)
    return self.feed_forward_norm(x + self._dropout(y, training=training))

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape

  def get_config(self):
    config = super().get_config()
    serialize = keras.saving.serialize_keras_object
    config.update(attention=serialize(self.attention),
                  feed_forward=serialize(self.feed_forward),
                  dropout_rate=self.dropout_rate, epsilon=self.epsilon)
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**_deserialize_layers(config, ("attention", "feed_forward")))


@keras.saving.register_keras_serializable(package="thattn")
class PreNormBlock(wiring.PreNormWiring, keras.layers.Layer):
  """T5's Transformer layer: RMSNorm, sublayer, dropout, residual.

  Call: block(x, memory=None, attention_mask=None, memory_mask=None,
  position_bias=None, training=None, cache=None, decode_step=None), and
  `initial_cache`, as thattn.models.PreNormBlock (the same code:
  `thattn.models.wiring.PreNormWiring`).
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
    self._dropout = keras.layers.Dropout(dropout_rate,
                                         dtype=self.dtype_policy)

  def build(self, input_shape, *args, **kwargs):
    # The memory (the encoder output) has the decoder's width in every
    # thattn model.
    _build_attention(self.self_attention, input_shape)
    if self.cross_attention is not None:
      _build_attention(self.cross_attention, input_shape)
    for layer in (self.self_attention_norm, self.cross_attention_norm,
                  self.feed_forward_norm, self.feed_forward):
      if layer is not None and not layer.built:
        layer.build(input_shape)

  # call(inputs, memory=None, attention_mask=None, memory_mask=None,
  # position_bias=None, training=None, cache=None, decode_step=None) and
  # initial_cache are thattn.models.wiring's, shared with thattn.models.

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape

  def get_config(self):
    config = super().get_config()
    serialize = keras.saving.serialize_keras_object
    config.update(
        self_attention=serialize(self.self_attention),
        feed_forward=serialize(self.feed_forward),
        cross_attention=(None if self.cross_attention is None else
                         serialize(self.cross_attention)),
        causal=self.causal, dropout_rate=self.dropout_rate,
        epsilon=self.epsilon)
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**_deserialize_layers(
        config, ("self_attention", "feed_forward", "cross_attention")))
