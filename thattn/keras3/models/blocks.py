"""Transformer blocks that take their attention and feed-forward layers, in
Keras 3.

The layers of `thattn.models.blocks` in `keras.ops`, with the same weights
(names, shapes, order) and the same computations (`thattn.ops.blocks`): a
block owns its norms and residual dropout, and takes the attention layers
(any `thattn.keras3` variant) and the feed-forward network as instances.

- `PostNormBlock` (BERT, ALBERT)::

      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))

- `PreNormBlock` (T5), with RMSNorm::

      x += dropout(self_attention(norm(x), norm(x)))
      x += dropout(cross_attention(norm(x), memory))      (decoder only)
      x += dropout(feed_forward(norm(x)))
"""

import keras
from keras import ops

from thattn.core import dims
from thattn.core import validation
from thattn.keras3 import initializers
from thattn.ops import blocks


def activation_function(name):
  """The activation of thattn.models.config.ACTIVATIONS named `name`, in
  keras.ops (for the blocks here and the masked-LM head)."""
  return blocks.activation(ops, name)


def serialize_sublayer(layer):
  return None if layer is None else keras.saving.serialize_keras_object(
      layer)


def deserialize_sublayers(config, names):
  """`config` with its sublayers `names` deserialized (None kept)."""
  config = dict(config)
  for name in names:
    if isinstance(config.get(name), dict):
      config[name] = keras.saving.deserialize_keras_object(config[name])
  return config


@keras.saving.register_keras_serializable(package="thattn")
class RMSNorm(keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale, in
  float32; no mean subtracted, no bias (`thattn.ops.blocks.rms_norm`)."""

  def __init__(self, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon
    self.scale_initializer = keras.initializers.get("ones")

  def build(self, input_shape):
    self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                 initializer=self.scale_initializer)

  @property
  def logical_axes(self):
    return {self.scale.path: (dims.D_MODEL,)}

  def call(self, inputs):
    return blocks.rms_norm(ops, inputs, self.scale, self.epsilon,
                           self.compute_dtype)

  def get_config(self):
    return dict(super().get_config(), epsilon=self.epsilon)


@keras.saving.register_keras_serializable(package="thattn")
class FeedForward(keras.layers.Layer):
  """Position-wise feed-forward network (`thattn.ops.blocks.feed_forward`)::

      H[f]  = act(X[d] W_i[d, f] (+ b_i))          plain
      H[f]  = act(X[d] W_i[d, f]) * X[d] W_g[d, f]  gated (T5.1.1's gated-GELU)
      Y[d]  = dropout(H[f]) W_o[f, d] (+ b_o)

  Args:
    d_ff: f, the hidden width.
    activation: one of thattn.models.config.ACTIVATIONS.
    gated: adds W_g (T5.1.1).
    use_bias: adds b_i (and b_g) and b_o.
    dropout_rate: on the hidden layer, where T5 puts it.
    kernel_initializer: of W_i and W_g.
    output_initializer: of W_o (default: `kernel_initializer`).
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
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.output_initializer = keras.initializers.get(
        output_initializer or kernel_initializer)
    self._dropout = keras.layers.Dropout(dropout_rate,
                                         dtype=self.dtype_policy)

  def _dense(self, units, initializer, name):
    return keras.layers.Dense(
        units, use_bias=self.use_bias,
        kernel_initializer=initializers.fresh(initializer),
        dtype=self.dtype_policy, name=name)

  def build(self, input_shape):
    kernel, output = self.kernel_initializer, self.output_initializer
    self.input_dense = self._dense(self.d_ff, kernel, "input")
    self.gate_dense = (self._dense(self.d_ff, kernel, "gate")
                       if self.gated else None)
    self.output_dense = self._dense(input_shape[-1], output, "output")
    self.input_dense.build(tuple(input_shape))
    if self.gate_dense is not None:
      self.gate_dense.build(tuple(input_shape))
    self.output_dense.build(tuple(input_shape[:-1]) + (self.d_ff,))

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
    return blocks.feed_forward(inputs, self.input_dense, self.gate_dense,
                               self.output_dense, self._activation,
                               self._dropout, training=training)

  def get_config(self):
    serialize = keras.saving.serialize_keras_object
    return dict(super().get_config(), d_ff=self.d_ff,
                activation=self.activation, gated=self.gated,
                use_bias=self.use_bias, dropout_rate=self.dropout_rate,
                kernel_initializer=serialize(self.kernel_initializer),
                output_initializer=serialize(self.output_initializer))


def _build_attention(layer, input_shape, memory_shape=None):
  if not layer.built:
    layer.build(input_shape, memory_shape or input_shape)


@keras.saving.register_keras_serializable(package="thattn")
class PostNormBlock(keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN)
  (`thattn.ops.blocks.post_norm_block`).

  Args:
    attention: an attention layer (any `thattn.keras3` variant).
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
    norm = lambda name: keras.layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name=name)
    self.attention_norm = norm("attention_norm")
    self.feed_forward_norm = norm("feed_forward_norm")
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
    return blocks.post_norm_block(
        inputs, self.attention, self.attention_norm, self.feed_forward,
        self.feed_forward_norm, self._dropout, attention_mask=attention_mask,
        position_bias=position_bias, training=training)

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape

  def get_config(self):
    return dict(super().get_config(), dropout_rate=self.dropout_rate,
                epsilon=self.epsilon,
                attention=serialize_sublayer(self.attention),
                feed_forward=serialize_sublayer(self.feed_forward))

  @classmethod
  def from_config(cls, config):
    return cls(**deserialize_sublayers(config, ("attention",
                                                "feed_forward")))


@keras.saving.register_keras_serializable(package="thattn")
class PreNormBlock(keras.layers.Layer):
  """T5's Transformer layer, and the decoder-only LMs': norm, sublayer,
  dropout, residual (`thattn.ops.blocks.pre_norm_block`).

  Args:
    self_attention: an attention layer (any `thattn.keras3` variant).
    feed_forward: a `FeedForward`.
    cross_attention: for decoder blocks, the attention over the encoder.
    causal: decoder self-attention, each position seeing only the past.
    dropout_rate: on every sublayer's output, before the residual add.
    epsilon: of the norms.
    norm: "rms_norm" (T5, Llama) or "layer_norm" (LayerNorm with its bias:
      GPT-2, GPT-NeoX), before each sublayer.
    parallel_residual: GPT-NeoX's block, the feed-forward network reading
      the block's input beside the attention (no cross-attention then).

  Call: block(x, memory=None, attention_mask=None, memory_mask=None,
  position_bias=None, training=None, cache=None, decode_step=None); with
  `cache=block.initial_cache(batch, max_length, memory)` and
  `decode_step=t` it returns `(y, cache)`, as thattn.models.PreNormBlock.
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
      norm = lambda name: keras.layers.LayerNormalization(
          epsilon=epsilon, dtype=self.dtype_policy, name=name)
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

  def initial_cache(self, batch_size, max_length, memory=None):
    """Empty self-attention cache; the cross-attention memory, projected."""
    return blocks.pre_norm_initial_cache(
        self.name, self.self_attention, self.cross_attention, batch_size,
        max_length, memory)

  def call(self, inputs, memory=None, attention_mask=None, memory_mask=None,
           position_bias=None, training=None, cache=None, decode_step=None):
    sublayers = {name: getattr(self, name)
                 for name in blocks.PRE_NORM_SUBLAYERS}
    return blocks.pre_norm_block(
        inputs, sublayers, self._dropout, self.causal, memory=memory,
        attention_mask=attention_mask, memory_mask=memory_mask,
        position_bias=position_bias, training=training, cache=cache,
        decode_step=decode_step, parallel_residual=self.parallel_residual)

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape

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
