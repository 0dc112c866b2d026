"""T5 (Raffel et al., 2019) as a functional tf_keras model.

Inputs (dict): `encoder_input_tokens` and `decoder_input_tokens`, int32
[batch, length]; token 0 pads the encoder input and starts the decoder input
(the targets shifted right). Output: float32 logits [batch, length, vocab].

    X = dropout(E[encoder tokens])
    B_enc = bidirectional relative position bias, shared by the stack
    X = encoder_block_l(X, padding mask, B_enc)    pre-norm, l = 1..L
    M = dropout(RMSNorm(X))                        the encoder output
    Y = dropout(E[decoder tokens])
    B_dec = unidirectional relative position bias, shared by the stack
    Y = decoder_block_l(Y, M, B_dec)               causal self-attention
    logits = einsum(dropout(RMSNorm(Y)) * d_model**-0.5, E)   (tied)
    logits = dropout(RMSNorm(Y)) W_lm                          (untied)

Dropout, where T5 puts it (all at `dropout_rate`): on the embeddings, on
the attention weights, on the feed-forward hidden layer, on every sublayer's
output before its residual add, and on each stack's final RMSNorm output.

The three attention types take their own `AttentionConfig`, one for the
whole stack or one per layer. Weights start as
in Mesh TensorFlow's T5: embeddings N(0, 1); attention and the feed-forward
input N(0, 1/d_model), with 1/sqrt(d_k) folded into P_q; the feed-forward
output N(0, 1/d_ff). (Mesh TensorFlow starts P_o at N(0, 1/(h d_v)); that is
the same whenever h d_v = d_model.)

`run_decoder` (thattn.models.wiring, shared with the Keras 3 model) is the
one description of the decoder: the builder calls it on Keras symbolic
tensors, and `thattn.models.generation` calls it with the attention layers'
caches, one step at a time.
"""

import tensorflow as tf
import tf_keras

from thattn.layers import relative_position
from thattn.models import blocks
from thattn.models import config as config_lib
from thattn.models import embeddings
from thattn.models import wiring

PAD_ID = wiring.PAD_ID
DECODER_START_ID = wiring.DECODER_START_ID
EOS_ID = wiring.EOS_ID

DecoderLayers = wiring.DecoderLayers
# The decoder's computation, and finding its layers in a built model, are
# written once for both front ends (thattn.models.wiring).
run_decoder = wiring.run_decoder
decoder_layers = wiring.decoder_layers


def _normal(stddev):
  return tf_keras.initializers.RandomNormal(stddev=stddev)


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
      use_bias=False, kernel_initializer=_normal(config.d_model ** -0.5))


def _position_bias(config, attention_name, bidirectional, name):
  # Every self-attention layer of a stack has this num_heads (T5Config
  # checks it), so layer 0's stands for the stack.
  num_heads = config.layer_attention(attention_name, 0).num_heads
  return embeddings.StackPositionBias(
      relative_position.RelativePositionBias(
          num_heads, bidirectional=bidirectional,
          num_buckets=config.relative_num_buckets,
          max_distance=config.relative_max_distance,
          name="relative_position_bias"),
      name=name)


def _lm_head(config, embedding):
  """The tied embedding, or (untied) a float32 Dense, so that the logits
  and the loss stay in float32."""
  if config.tie_embeddings:
    return embedding
  return tf_keras.layers.Dense(
      config.vocab_size, use_bias=False,
      kernel_initializer=_normal(config.d_model ** -0.5), dtype="float32",
      name="lm_head")


def _logits(lm_head, x):
  if isinstance(lm_head, embeddings.TokenEmbedding):  # tied
    return lm_head(x, mode="logits")
  return lm_head(x)


def _make_decoder_layers(config, embedding):
  """The decoder's layers; without enc-dec attention in a decoder-only model."""
  dropout = lambda name: tf_keras.layers.Dropout(config.dropout_rate,
                                                 name=name)
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
  return DecoderLayers(
      embedding=embedding,
      embedding_dropout=dropout("decoder_embedding_dropout"),
      position_bias=_position_bias(config, "decoder_self_attention", False,
                                   "decoder_position_bias"),
      blocks=layer_blocks,
      final_norm=blocks.RMSNorm(config.layer_norm_epsilon,
                                name="decoder_final_norm"),
      final_dropout=dropout("decoder_output"),
      lm_head=_lm_head(config, embedding))


def _run_encoder(config, embedding, tokens):
  """Encoder tokens -> (its output M, the padding mask)."""
  mask = embeddings.PaddingMask(PAD_ID, name="encoder_mask")(tokens)
  x = tf_keras.layers.Dropout(config.dropout_rate,
                              name="encoder_embedding_dropout")(
                                  embedding(tokens))
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
  memory = tf_keras.layers.Dropout(config.dropout_rate,
                                   name="encoder_output")(x)
  return memory, mask


def build_t5(config, name=None):
  """The T5 model with its LM head for a `T5Config`, by `config.stacks`.

  "encoder_decoder": inputs `encoder_input_tokens` and
  `decoder_input_tokens`; "decoder" (a language model): the decoder alone,
  on `decoder_input_tokens` (the tokens shifted right); "encoder": the
  encoder and the LM head, on `encoder_input_tokens`. Logits [b, n, vocab].
  """
  if not isinstance(config, config_lib.T5Config):
    raise ValueError(f"build_t5 needs a T5Config, got {config!r}.")
  inputs = {name: tf_keras.Input([None], dtype=tf.int32, name=name)
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
    logits = _logits(_lm_head(config, embedding), memory)
  else:
    logits = run_decoder(_make_decoder_layers(config, embedding),
                         inputs["decoder_input_tokens"], memory, memory_mask)
  # Names the output "logits" in a SavedModel's serving signature.
  logits = tf_keras.layers.Activation("linear", dtype="float32",
                                      name="logits")(logits)
  return tf_keras.Model(inputs, logits, name=name or "t5")


def encoder_model(model):
  """tokens -> (encoder output M, its attention mask [b, 1, m]), as a model.

  It shares the layers (and so the weights) of the T5 `model`.
  """
  return tf_keras.Model(
      model.input["encoder_input_tokens"],
      [model.get_layer("encoder_output").output,
       model.get_layer("encoder_mask").output],
      name=f"{model.name}_encoder")
