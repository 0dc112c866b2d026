"""BERT and ALBERT encoders as functional tf_keras models.

Inputs (dict): `input_word_ids`, `input_mask` (1 = real token) and
`input_type_ids`, each int32 [batch, length].
Outputs (dict): `sequence_output` [batch, length, d_model] and
`pooled_output` [batch, d_model].

    E      = word_embeddings[ids] (+ position_embedding[:n])
             + type_embeddings[type_ids]     width E (d_model, or ALBERT's E)
    X      = dropout(LayerNorm(E))
    X      = X W_E + b_E                     ALBERT only: E -> d_model
    X      = block_l(X, mask, bias)          l = 1..L; ALBERT shares one block
    pooled = tanh(X[:, 0] W_p + b_p)

Notes:
- As everywhere in thattn, 1/sqrt(d_k) is folded into P_q's initializer
  instead of being applied to the logits (numerically the same model); a
  converted BERT checkpoint needs its query kernel and bias multiplied by
  1/sqrt(d_k).
- With `position_embedding="relative"` there is no position table; T5's
  bidirectional relative position bias, one for the whole stack, is added
  to every layer's logits (the paper's Section 7.3).
"""

import tensorflow as tf
import tf_keras

from thattn.layers import relative_position
from thattn.models import blocks
from thattn.models import config as config_lib
from thattn.models import embeddings


def _initializer(config):
  # A fresh instance per weight: unseeded tf-keras initializers repeat.
  return tf_keras.initializers.TruncatedNormal(stddev=config.initializer_range)


def _make_block(config, name):
  return blocks.PostNormBlock(
      attention=config.attention.make_layer(
          config.d_model, name="attention", dropout_rate=config.dropout_rate,
          use_bias=config.use_bias, kernel_initializer=_initializer(config)),
      feed_forward=blocks.FeedForward(
          config.d_ff, activation=config.activation, use_bias=config.use_bias,
          kernel_initializer=_initializer(config), name="feed_forward"),
      dropout_rate=config.dropout_rate, epsilon=config.layer_norm_epsilon,
      name=name)


def _embed(config, word_ids, type_ids):
  width = config.embedding_size or config.d_model
  x = embeddings.TokenEmbedding(
      config.vocab_size, width, embeddings_initializer=_initializer(config),
      name="word_embeddings")(word_ids)
  if config.position_embedding == "absolute":
    x = embeddings.PositionEmbedding(
        config.max_position_embeddings, initializer=_initializer(config),
        name="position_embedding")(x)
  types = tf_keras.layers.Embedding(
      config.type_vocab_size, width,
      embeddings_initializer=_initializer(config),
      name="type_embeddings")(type_ids)
  x = tf_keras.layers.Add(name="embedding_sum")([x, types])
  x = tf_keras.layers.LayerNormalization(
      epsilon=config.layer_norm_epsilon, name="embedding_norm")(x)
  x = tf_keras.layers.Dropout(config.dropout_rate,
                              name="embedding_dropout")(x)
  if width != config.d_model:  # ALBERT's factorized embedding
    x = tf_keras.layers.Dense(
        config.d_model, kernel_initializer=_initializer(config),
        name="embedding_projection")(x)
  return x


def build_bert(config, name=None):
  """The BERT or ALBERT encoder with its pooler, for a `BertConfig`."""
  if not isinstance(config, config_lib.BertConfig):
    raise ValueError(f"build_bert needs a BertConfig, got {config!r}.")
  inputs = {key: tf_keras.Input([None], dtype=tf.int32, name=key)
            for key in ("input_word_ids", "input_mask", "input_type_ids")}
  x = _embed(config, inputs["input_word_ids"], inputs["input_type_ids"])
  mask = embeddings.PaddingMask(name="attention_mask")(inputs["input_mask"])
  bias = None
  if config.position_embedding == "relative":
    bias = embeddings.StackPositionBias(
        relative_position.RelativePositionBias(
            config.attention.num_heads, bidirectional=True,
            num_buckets=config.relative_num_buckets,
            max_distance=config.relative_max_distance,
            name="relative_position_bias"),
        name="position_bias")(x)
  if config.share_layers:
    shared = _make_block(config, "shared_block")
    layer_blocks = [shared] * config.num_layers
  else:
    layer_blocks = [_make_block(config, f"block_{index}")
                    for index in range(config.num_layers)]
  for block in layer_blocks:
    x = block(x, attention_mask=mask, position_bias=bias)
  pooled = embeddings.Pooler(config.d_model,
                             kernel_initializer=_initializer(config),
                             name="pooler")(x)
  # Identity layers name the outputs, so a SavedModel's serving signature
  # returns "sequence_output" and "pooled_output".
  outputs = {name: tf_keras.layers.Activation("linear", name=name)(tensor)
             for name, tensor in (("sequence_output", x),
                                  ("pooled_output", pooled))}
  return tf_keras.Model(inputs, outputs, name=name or config.family)
