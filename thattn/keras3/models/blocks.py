"""Transformer blocks that take their attention and feed-forward layers, in
Keras 3.

`thattn.models.blocks` in `keras.ops`, with the same weights (names,
shapes, order): a block owns its norms and residual dropout, and takes the
attention layers (any `thattn.keras3` variant) and the feed-forward network
as instances.

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

from thattn.keras3.models import embeddings
from thattn.models import block_wiring

# The functions behind thattn.models.config.ACTIVATIONS, for the blocks
# here and the masked-LM head.
activation_function = block_wiring.activations(keras.ops.relu,
                                               keras.ops.gelu)


@keras.saving.register_keras_serializable(package="thattn")
class RMSNorm(block_wiring.RMSNormWiring, keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale, in
  float32; no mean subtracted, no bias (the computation: `thattn.models.
  block_wiring.RMSNormWiring`)."""

  _ops = ops

  def build(self, input_shape):
    self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                 initializer="ones")


@keras.saving.register_keras_serializable(package="thattn")
class FeedForward(block_wiring.FeedForwardWiring, embeddings.Keras3Glue,
                  keras.layers.Layer):
  """Position-wise feed-forward network (thattn.models.blocks.FeedForward;
  the computation is `thattn.models.block_wiring.FeedForwardWiring`'s)."""

  # The front end's glue for thattn.models.block_wiring.FeedForwardWiring.
  _activation_of = staticmethod(activation_function)

  def build(self, input_shape):
    for layer, shape in self.make_dense_layers(input_shape):
      layer.build(tuple(shape))



def _build_attention(layer, input_shape, memory_shape=None):
  if not layer.built:
    layer.build(input_shape, memory_shape or input_shape)


@keras.saving.register_keras_serializable(package="thattn")
class PostNormBlock(block_wiring.PostNormWiring, embeddings.Keras3Glue,
                    keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN); the call
  is `thattn.models.block_wiring.PostNormWiring`'s."""

  def build(self, input_shape):
    _build_attention(self.attention, input_shape)
    for layer in (self.attention_norm, self.feed_forward,
                  self.feed_forward_norm):
      if not layer.built:
        layer.build(input_shape)

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape


@keras.saving.register_keras_serializable(package="thattn")
class PreNormBlock(block_wiring.PreNormWiring, embeddings.Keras3Glue,
                   keras.layers.Layer):
  """T5's Transformer layer: RMSNorm, sublayer, dropout, residual.

  Call: block(x, memory=None, attention_mask=None, memory_mask=None,
  position_bias=None, training=None, cache=None, decode_step=None), and
  `initial_cache`, as thattn.models.PreNormBlock (the same code:
  `thattn.models.block_wiring.PreNormWiring`).
  """

  # The front end's glue for thattn.models.block_wiring.PreNormWiring.
  _rms_norm = RMSNorm

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
  # initial_cache are thattn.models.block_wiring's, shared with thattn.models.

  def compute_output_shape(self, input_shape, *args, **kwargs):
    return input_shape
