"""T5 (Raffel et al., 2019) as a Keras 3 functional model.

`thattn.models.t5` in `keras.ops` on any Keras 3 backend, from the same
`thattn.models.T5Config` and with the same weights (names, shapes, order):
inputs `encoder_input_tokens` and/or `decoder_input_tokens` (by
`config.stacks`), int32 [batch, length], token 0 padding the encoder input
and starting the decoder's; output float32 logits [batch, length, vocab].
The computation, the dropout placement and the initializers are the ones in
thattn.models.t5's docstring; the decoder is `thattn.models.wiring.
run_decoder`, shared with it, and `generation.T5Generator` decodes with it.
"""

import keras

from thattn.keras3 import relative_position
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings
from thattn.models import config as config_lib
from thattn.models import wiring

PAD_ID = wiring.PAD_ID


def _normal(stddev):
  return keras.initializers.RandomNormal(stddev=stddev)


def _feed_forward(config):
  return blocks.FeedForward(
      config.d_ff, activation=config.activation,
      gated=config.gated_feed_forward, use_bias=False,
      dropout_rate=config.dropout_rate,
      kernel_initializer=_normal(config.d_model ** -0.5),
      output_initializer=_normal(config.d_ff ** -0.5), name="feed_forward")


def _attention(config, attention_config, name):
  return attention_config.make_layer(
      config.d_model, name=name, dropout_rate=config.dropout_rate,
      use_bias=False, kernel_initializer=_normal(config.d_model ** -0.5),
      front_end="keras3")


def _position_bias(config, attention_name, bidirectional, name):
  num_heads = config.layer_attention(attention_name, 0).num_heads
  return embeddings.StackPositionBias(
      relative_position.RelativePositionBias(
          num_heads, bidirectional=bidirectional,
          num_buckets=config.relative_num_buckets,
          max_distance=config.relative_max_distance,
          name="relative_position_bias"),
      name=name)


def _lm_head(config, embedding):
  """The tied embedding, or (untied) a float32 Dense `lm_head`."""
  if config.tie_embeddings:
    return embedding
  return keras.layers.Dense(
      config.vocab_size, use_bias=False,
      kernel_initializer=_normal(config.d_model ** -0.5), dtype="float32",
      name="lm_head")


def _dropout(config, name):
  return keras.layers.Dropout(config.dropout_rate, name=name)


def _run_encoder(config, embedding, tokens):
  """Encoder tokens -> (its output M, the padding mask [b, 1, m])."""
  mask = embeddings.padding_mask(tokens, PAD_ID)
  x = _dropout(config, "encoder_embedding_dropout")(embedding(tokens))
  bias = _position_bias(config, "encoder_self_attention", True,
                        "encoder_position_bias")(x)
  for index in range(config.num_layers):
    block = blocks.PreNormBlock(
        self_attention=_attention(
            config, config.layer_attention("encoder_self_attention", index),
            "self_attention"),
        feed_forward=_feed_forward(config), dropout_rate=config.dropout_rate,
        epsilon=config.layer_norm_epsilon, name=f"encoder_block_{index}")
    x = block(x, attention_mask=mask, position_bias=bias)
  x = blocks.RMSNorm(config.layer_norm_epsilon, name="encoder_final_norm")(x)
  return _dropout(config, "encoder_output")(x), mask


def _make_decoder_layers(config, embedding):
  """The decoder's layers; without enc-dec attention in a decoder-only
  model."""
  cross = config.stacks == "encoder_decoder"
  layer_blocks = [
      blocks.PreNormBlock(
          self_attention=_attention(
              config, config.layer_attention("decoder_self_attention", index),
              "self_attention"),
          cross_attention=_attention(
              config,
              config.layer_attention("encoder_decoder_attention", index),
              "cross_attention") if cross else None,
          feed_forward=_feed_forward(config), causal=True,
          dropout_rate=config.dropout_rate,
          epsilon=config.layer_norm_epsilon, name=f"decoder_block_{index}")
      for index in range(config.decoder_layers)]
  return wiring.DecoderLayers(
      embedding=embedding,
      embedding_dropout=_dropout(config, "decoder_embedding_dropout"),
      position_bias=_position_bias(config, "decoder_self_attention", False,
                                   "decoder_position_bias"),
      blocks=layer_blocks,
      final_norm=blocks.RMSNorm(config.layer_norm_epsilon,
                                name="decoder_final_norm"),
      final_dropout=_dropout(config, "decoder_output"),
      lm_head=_lm_head(config, embedding))


def build_t5(config, name=None):
  """The T5 model with its LM head for a `T5Config`, by `config.stacks`
  ("encoder_decoder", "decoder" or "encoder"), as thattn.models.t5."""
  if not isinstance(config, config_lib.T5Config):
    raise ValueError(f"build_t5 needs a T5Config, got {config!r}.")
  inputs = {name: keras.Input((None,), dtype="int32", name=name)
            for name, stack in (("encoder_input_tokens", "decoder"),
                                ("decoder_input_tokens", "encoder"))
            if config.stacks != stack}
  embedding = embeddings.TokenEmbedding(
      config.vocab_size, config.d_model, embeddings_initializer=_normal(1.0),
      logits_scale=config.d_model ** -0.5 if config.tie_embeddings else 1.0,
      name="token_embedding")
  memory = memory_mask = None
  if "encoder_input_tokens" in inputs:
    memory, memory_mask = _run_encoder(config, embedding,
                                       inputs["encoder_input_tokens"])
  if config.stacks == "encoder":
    lm_head = _lm_head(config, embedding)
    logits = (embedding(memory, mode="logits") if lm_head is embedding else
              lm_head(memory))
  else:
    logits = wiring.run_decoder(_make_decoder_layers(config, embedding),
                                inputs["decoder_input_tokens"], memory,
                                memory_mask)
  logits = keras.layers.Identity(dtype="float32", name="logits")(logits)
  return keras.Model(inputs, logits, name=name or "t5")
