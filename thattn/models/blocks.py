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

from thattn.ops import tf_ops
from thattn.ops import autograph
from thattn.layers import base
from thattn.models import block_wiring
from thattn.models import embeddings


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


# The functions behind thattn.models.config.ACTIVATIONS, for the blocks here
# and the task heads (thattn.tasks.mlm).
activation_function = block_wiring.activations(tf.nn.relu, tf.nn.gelu)


@tf_keras.utils.register_keras_serializable(package="thattn")
class RMSNorm(block_wiring.RMSNormWiring, tf_keras.layers.Layer):
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale.

  Unlike LayerNormalization it subtracts no mean and adds no bias. It runs
  in float32 under mixed precision. (The computation: `thattn.models.
  block_wiring.RMSNormWiring`.)
  """

  _ops = tf_ops.TF_OPS

  def build(self, input_shape):
    self.scale = self.add_weight("scale", [input_shape[-1]],
                                 initializer="ones")
    super().build(input_shape)

  call = autograph.unconverted(block_wiring.RMSNormWiring.call)


@tf_keras.utils.register_keras_serializable(package="thattn")
class FeedForward(block_wiring.FeedForwardWiring, embeddings.TfKerasGlue,
                  tf_keras.layers.Layer):
  """Position-wise feed-forward network (the computation is
  `thattn.models.block_wiring.FeedForwardWiring`'s)::

      H[f]  = act(X[d] W_i[d, f] (+ b_i))          plain
      H[f]  = act(X[d] W_i[d, f]) * X[d] W_g[d, f]  gated (T5.1.1's gated-GELU)
      Y[d]  = dropout(H[f]) W_o[f, d] (+ b_o)

  `dropout_rate` is on the hidden layer, where T5 puts it; BERT has none
  there (its block drops out the output instead).
  """

  # The front end's glue for thattn.models.block_wiring.FeedForwardWiring.
  _activation_of = staticmethod(activation_function)

  def build(self, input_shape):
    for layer, shape in self.make_dense_layers(
        tf.TensorShape(input_shape).as_list()):
      build_sublayer(layer, shape)
    super().build(input_shape)

  call = autograph.unconverted(block_wiring.FeedForwardWiring.call)



@tf_keras.utils.register_keras_serializable(package="thattn")
class PostNormBlock(block_wiring.PostNormWiring, embeddings.TfKerasGlue,
                    tf_keras.layers.Layer):
  """BERT's Transformer layer: residual, then LayerNorm (post-LN); the call
  is `thattn.models.block_wiring.PostNormWiring`'s."""

  def build(self, input_shape):
    for layer in (self.attention, self.attention_norm, self.feed_forward,
                  self.feed_forward_norm):
      build_sublayer(layer, input_shape)
    super().build(input_shape)

  call = autograph.unconverted(block_wiring.PostNormWiring.call)


@tf_keras.utils.register_keras_serializable(package="thattn")
class PreNormBlock(block_wiring.PreNormWiring, embeddings.TfKerasGlue,
                   tf_keras.layers.Layer):
  """T5's Transformer layer: RMSNorm, sublayer, dropout, residual.

  Args:
    self_attention: an attention layer (any `thattn.layers` variant).
    feed_forward: a `FeedForward`.
    cross_attention: for decoder blocks, the attention over the encoder.
    causal: decoder self-attention, each position seeing only the past.
    dropout_rate: on every sublayer's output, before the residual add.
    epsilon: of the RMSNorms.

  Call::

    block(x, memory=None, attention_mask=None, memory_mask=None,
          position_bias=None, training=None, cache=None, decode_step=None)

    `attention_mask` is for self-attention, `memory_mask` for the cross-
    attention, both boolean and broadcastable to [b, n, m]. To decode, pass
    `cache=block.initial_cache(batch, max_length, memory)` and
    `decode_step=t`; the block then returns `(y, cache)`.
  """

  # The front end's glue for thattn.models.block_wiring.PreNormWiring.
  _rms_norm = RMSNorm

  def build(self, input_shape):
    # The cross-attention memory (the encoder output) has the same width
    # as the decoder in every thattn model.
    for layer in (self.self_attention_norm, self.self_attention,
                  self.cross_attention_norm, self.cross_attention,
                  self.feed_forward_norm, self.feed_forward):
      build_sublayer(layer, input_shape)
    super().build(input_shape)

  # The call and the decoding cache are thattn.models.block_wiring's, written
  # once for both front ends; AutoGraph must not convert the call (it
  # branches in Python on whether a cache is given).
  call = autograph.unconverted(block_wiring.PreNormWiring.call)
