"""BERT and ALBERT encoders as Keras 3 functional models.

`thattn.models.bert` in `keras.ops` on any Keras 3 backend, from the same
`thattn.models.BertConfig` and with the same weights (names, shapes,
order). Inputs (dict): `input_word_ids`, `input_mask` (1 = real token),
`input_type_ids`, int32 [batch, length]. Outputs (dict):
`sequence_output` [batch, length, d_model], `pooled_output` [batch,
d_model]. The computation is the one in thattn.models.bert's docstring.
"""

import keras

from thattn.keras3 import relative_position
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings
from thattn.models import config as config_lib


def _initializer(config):
  return keras.initializers.TruncatedNormal(stddev=config.initializer_range)


def _make_block(config, name):
  return blocks.PostNormBlock(
      attention=config.attention.make_layer(
          config.d_model, name="attention", dropout_rate=config.dropout_rate,
          use_bias=config.use_bias, kernel_initializer=_initializer(config),
          front_end="keras3"),
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
  # thattn's TokenEmbedding rather than keras.layers.Embedding: it looks
  # the few token types up by selection, whose gradient has no scatter-add
  # (thattn.keras3.lookups); the weight's name and shape are the same.
  types = embeddings.TokenEmbedding(
      config.type_vocab_size, width,
      embeddings_initializer=_initializer(config),
      name="type_embeddings")(type_ids)
  x = keras.layers.Add(name="embedding_sum")([x, types])
  x = keras.layers.LayerNormalization(
      epsilon=config.layer_norm_epsilon, name="embedding_norm")(x)
  x = keras.layers.Dropout(config.dropout_rate, name="embedding_dropout")(x)
  if width != config.d_model:  # ALBERT's factorized embedding
    x = keras.layers.Dense(config.d_model,
                           kernel_initializer=_initializer(config),
                           name="embedding_projection")(x)
  return x


def build_bert(config, name=None):
  """The BERT or ALBERT encoder with its pooler, for a `BertConfig`."""
  if not isinstance(config, config_lib.BertConfig):
    raise ValueError(f"build_bert needs a BertConfig, got {config!r}.")
  inputs = {key: keras.Input((None,), dtype="int32", name=key)
            for key in ("input_word_ids", "input_mask", "input_type_ids")}
  x = _embed(config, inputs["input_word_ids"], inputs["input_type_ids"])
  mask = embeddings.padding_mask(inputs["input_mask"])
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
  outputs = {name: keras.layers.Identity(name=name)(tensor)
             for name, tensor in (("sequence_output", x),
                                  ("pooled_output", pooled))}
  return keras.Model(inputs, outputs, name=name or config.family)
