"""How thattn's models are wired, written once for both front ends.

Plain Python over layers a front end supplies: tf_keras layers
(`thattn.models`) or Keras 3 layers (`thattn.keras3.models`), described by
a `FrontEnd` (`thattn.models.front_end.TF_KERAS`, `thattn.keras3.models.
front_end.KERAS3`). Nothing here imports a framework, so the Keras 3 models
on JAX or PyTorch build without TensorFlow. Each front end keeps only its
layer classes and its framework's glue (serialization, building, its Model
class); the blocks' computations are `thattn.ops.blocks`'.

- `build_bert`, `build_t5`, `build_decoder_lm`, `build_model`,
  `create_model`: which layers a BERT, ALBERT, T5 or decoder-only LM is
  made of, in what order, with which names, initializer scales and options
  (the order fixes the weights' order, so both front ends' models exchange
  weights by `set_weights`);
- `DecoderLayers` / `run_decoder`: a decoder stack (T5's, or a
  decoder-only LM's), which the builders call on Keras symbolic tensors
  and the generators one step at a time with the caches;
- `decoder_layers(model)`: a built (or reloaded) model's decoder layers,
  by their names.
"""

import collections

from thattn.models import config as config_lib
from thattn.models import presets

# T5's special tokens: 0 pads the encoder input and starts the decoder's; 1
# ends a sequence.
PAD_ID = 0
DECODER_START_ID = 0
EOS_ID = 1

# A BERT's or ALBERT's inputs, each int32 [batch, length].
BERT_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")

# A decoder stack's layers. T5's has a relative position bias and no
# position table; a decoder-only LM's learned table (GPT-2) or neither (its
# attention layers turn Q and K by rotary embeddings), and no final
# dropout: the absent parts are None.
DecoderLayers = collections.namedtuple(
    "DecoderLayers", ["embedding", "position_embedding", "embedding_dropout",
                      "position_bias", "blocks", "final_norm",
                      "final_dropout", "lm_head"])


def logits(lm_head, embedding, x):
  """float32 logits [b, n, vocab]: the tied embedding's (when `lm_head` is
  the embedding layer itself) or the untied `lm_head`'s."""
  if lm_head is embedding:
    return embedding(x, mode="logits")
  return lm_head(x)


def run_decoder(parts, tokens, memory, memory_mask, training=None,
                caches=None, decode_step=None, max_length=None,
                attention_mask=None):
  """Decoder tokens [b, n] -> float32 logits [b, n, vocab].

  With `caches` (one per block, from the blocks' `initial_cache`), the
  tokens are decoding steps `decode_step, decode_step + 1, ...` of at most
  `max_length`, `memory` is unused (it is in the caches), and the result is
  `(logits, new_caches)`. `attention_mask` is a prefix LM's self-attention
  mask [b, n, n] (its blocks are not causal themselves); with `caches` it
  is the prompt's, at decode_step 0.
  """
  x = parts.embedding(tokens)
  if parts.position_embedding is not None:
    x = parts.position_embedding(x, offset=decode_step)
  x = parts.embedding_dropout(x, training=training)
  bias = cached_bias = None
  if parts.position_bias is not None:
    if caches is None or attention_mask is not None:
      bias = parts.position_bias(x)
    if caches is not None:
      cached_bias = parts.position_bias(x, memory_length=max_length,
                                        query_offset=decode_step)
  new_caches = []
  for index, block in enumerate(parts.blocks):
    if caches is None:
      x = block(x, memory=memory, memory_mask=memory_mask,
                attention_mask=attention_mask, position_bias=bias,
                training=training)
      continue
    y, cache = block(x, memory_mask=memory_mask, position_bias=cached_bias,
                     training=training, cache=caches[index],
                     decode_step=decode_step)
    if attention_mask is not None:
      # A prefix LM's prompt attends to itself both ways, which a cached
      # call (always causal) does not: that call only writes the block's
      # keys and values, functions of its input x alone, into the cache,
      # and the block's output is the whole pass's under the mask.
      y = block(x, memory_mask=memory_mask, attention_mask=attention_mask,
                position_bias=bias, training=training)
    x = y
    new_caches.append(cache)
  x = parts.final_norm(x)
  if parts.final_dropout is not None:
    x = parts.final_dropout(x, training=training)
  result = logits(parts.lm_head, parts.embedding, x)
  return result if caches is None else (result, new_caches)


def decoder_layers(model):
  """The `DecoderLayers` of a built T5 model or decoder-only LM (either
  front end's, or a reload), found by their names."""
  names = [layer.name for layer in model.layers]
  count = sum(name.startswith("decoder_block_") for name in names)
  lm_head = "lm_head" if "lm_head" in names else "token_embedding"
  optional = lambda name: model.get_layer(name) if name in names else None
  return DecoderLayers(
      embedding=model.get_layer("token_embedding"),
      position_embedding=optional("position_embedding"),
      embedding_dropout=model.get_layer("decoder_embedding_dropout"),
      position_bias=optional("decoder_position_bias"),
      blocks=[model.get_layer(f"decoder_block_{index}")
              for index in range(count)],
      final_norm=model.get_layer("decoder_final_norm"),
      final_dropout=optional("decoder_output"),
      lm_head=model.get_layer(lm_head))


# ---- the builders ------------------------------------------------------------
# Each front end describes its layers in a `FrontEnd`; the builders below
# wire them into BERT, ALBERT and T5, the same layers with the same names,
# created in the same order (which fixes the weights' order), whichever
# front end it is.

FrontEnd = collections.namedtuple("FrontEnd", [
    "name",  # AttentionConfig.make_layer's front_end: "tf_keras" / "keras3"
    "Input",  # (name) -> an int32 [batch, length] model input
    "Model",  # (inputs, outputs, name) -> the functional model
    "named_output",  # (tensor, name, dtype=None) -> the output, so named
    # (stddev) -> a fresh initializer (unseeded tf-keras initializers
    # repeat their draws when one instance is shared).
    "truncated_normal", "random_normal",
    # Layer classes, with the keyword arguments both front ends' take:
    "Add", "Dense", "Dropout", "LayerNormalization",
    "TokenEmbedding", "TypeEmbedding", "PositionEmbedding", "Pooler",
    "RelativePositionBias", "StackPositionBias",
    "FeedForward", "PostNormBlock", "PreNormBlock", "RMSNorm",
    "padding_mask",  # (tokens, pad_id, name) -> boolean [b, 1, m]
    # (decoder_causal_attention, name) -> boolean [b, n, n]
    "prefix_lm_mask",
])


# The layers a front end takes from its framework itself.
_FRAMEWORK_LAYERS = ("Add", "Dense", "Dropout", "LayerNormalization")


def front_end(name, framework, modules, **parts):
  """A `FrontEnd` from a framework's Keras module (`tf_keras` or `keras`:
  its layers Add, Dense, Dropout, LayerNormalization and its TruncatedNormal
  and RandomNormal initializers), thattn's modules of that front end (the
  classes named as in `FrontEnd`, found in the first module that has them:
  blocks, embeddings, relative_position), and the remaining `parts`."""
  classes = {field: getattr(framework.layers, field)
             for field in _FRAMEWORK_LAYERS}
  for field in FrontEnd._fields:
    if field in parts or field in classes:
      continue
    for module in modules:
      if hasattr(module, field):
        classes[field] = getattr(module, field)
        break
  initializers = framework.initializers
  return FrontEnd(
      name=name,
      truncated_normal=lambda stddev: initializers.TruncatedNormal(
          stddev=stddev),
      random_normal=lambda stddev: initializers.RandomNormal(stddev=stddev),
      **classes, **parts)


def _check_config(config, kind, builder):
  if not isinstance(config, kind):
    raise ValueError(f"{builder} needs a {kind.__name__}, got {config!r}.")


def _bert_block(front, config, name, index):
  initializer = lambda: front.truncated_normal(config.initializer_range)
  return front.PostNormBlock(
      attention=config.attention.make_layer(
          config.d_model, name="attention", dropout_rate=config.dropout_rate,
          use_bias=config.use_bias, kernel_initializer=initializer(),
          front_end=front.name, layer_index=index,
          norm_epsilon=config.layer_norm_epsilon),
      feed_forward=front.FeedForward(
          config.d_ff, activation=config.activation, use_bias=config.use_bias,
          kernel_initializer=initializer(), name="feed_forward"),
      dropout_rate=config.dropout_rate, epsilon=config.layer_norm_epsilon,
      name=name)


def _bert_embed(front, config, word_ids, type_ids):
  """dropout(LayerNorm(E[ids] (+ P[:n]) + T[type ids])), then ALBERT's
  E -> d_model projection."""
  # A fresh initializer per weight: unseeded tf-keras initializers repeat.
  initializer = lambda: front.truncated_normal(config.initializer_range)
  width = config.embedding_size or config.d_model
  x = front.TokenEmbedding(config.vocab_size, width,
                           embeddings_initializer=initializer(),
                           name="word_embeddings")(word_ids)
  if config.position_embedding == "absolute":
    x = front.PositionEmbedding(config.max_position_embeddings,
                                initializer=initializer(),
                                name="position_embedding")(x)
  types = front.TypeEmbedding(config.type_vocab_size, width,
                              embeddings_initializer=initializer(),
                              name="type_embeddings")(type_ids)
  x = front.Add(name="embedding_sum")([x, types])
  x = front.LayerNormalization(epsilon=config.layer_norm_epsilon,
                               name="embedding_norm")(x)
  x = front.Dropout(config.dropout_rate, name="embedding_dropout")(x)
  if width != config.d_model:  # ALBERT's factorized embedding
    x = front.Dense(config.d_model, kernel_initializer=initializer(),
                    name="embedding_projection")(x)
  return x


def build_bert(config, front, name=None):
  """The BERT or ALBERT encoder with its pooler, for a `BertConfig`, of
  `front`'s layers (the computation: thattn.models.bert's docstring)."""
  _check_config(config, config_lib.BertConfig, "build_bert")
  inputs = {key: front.Input(key) for key in BERT_INPUTS}
  x = _bert_embed(front, config, inputs["input_word_ids"],
                  inputs["input_type_ids"])
  mask = front.padding_mask(inputs["input_mask"], None, "attention_mask")
  bias = None
  if config.position_embedding == "relative":
    bias = front.StackPositionBias(
        front.RelativePositionBias(
            config.attention.num_heads, bidirectional=True,
            num_buckets=config.relative_num_buckets,
            max_distance=config.relative_max_distance,
            name="relative_position_bias"),
        name="position_bias")(x)
  if config.share_layers:
    # ALBERT's one block serves every depth: it is the block at depth 0.
    shared = _bert_block(front, config, "shared_block", 0)
    layer_blocks = [shared] * config.num_layers
  else:
    layer_blocks = [_bert_block(front, config, f"block_{index}", index)
                    for index in range(config.num_layers)]
  for block in layer_blocks:
    x = block(x, attention_mask=mask, position_bias=bias)
  pooled = front.Pooler(
      config.d_model,
      kernel_initializer=front.truncated_normal(config.initializer_range),
      name="pooler")(x)
  # Named outputs: a SavedModel's serving signature returns them by name.
  outputs = {key: front.named_output(tensor, key)
             for key, tensor in (("sequence_output", x),
                                 ("pooled_output", pooled))}
  return front.Model(inputs, outputs, name or config.family)


def _t5_attention(front, config, attention_config, name, index):
  return attention_config.make_layer(
      config.d_model, name=name, dropout_rate=config.dropout_rate,
      use_bias=False,
      kernel_initializer=front.random_normal(config.d_model ** -0.5),
      front_end=front.name, layer_index=index,
      norm_epsilon=config.layer_norm_epsilon)


def _t5_feed_forward(front, config):
  return front.FeedForward(
      config.d_ff, activation=config.activation,
      gated=config.gated_feed_forward, use_bias=False,
      dropout_rate=config.dropout_rate,
      kernel_initializer=front.random_normal(config.d_model ** -0.5),
      output_initializer=front.random_normal(config.d_ff ** -0.5),
      name="feed_forward")


def _t5_position_bias(front, config, attention_name, bidirectional, name):
  # Every self-attention layer of a stack has this num_heads (T5Config
  # checks it), so layer 0's stands for the stack.
  num_heads = config.layer_attention(attention_name, 0).num_heads
  return front.StackPositionBias(
      front.RelativePositionBias(
          num_heads, bidirectional=bidirectional,
          num_buckets=config.relative_num_buckets,
          max_distance=config.relative_max_distance,
          name="relative_position_bias"),
      name=name)


def _t5_lm_head(front, config, embedding):
  """The tied embedding, or (untied) a float32 Dense, so that the logits
  and the loss stay in float32."""
  if config.tie_embeddings:
    return embedding
  return front.Dense(
      config.vocab_size, use_bias=False,
      kernel_initializer=front.random_normal(config.d_model ** -0.5),
      dtype="float32", name="lm_head")


def make_decoder_layers(front, config, embedding):
  """The T5 decoder's layers (`DecoderLayers`); without enc-dec attention
  in a decoder-only model."""
  cross = config.stacks == "encoder_decoder"
  layer_blocks = [
      front.PreNormBlock(
          self_attention=_t5_attention(
              front, config,
              config.layer_attention("decoder_self_attention", index),
              "self_attention", index),
          cross_attention=_t5_attention(
              front, config,
              config.layer_attention("encoder_decoder_attention", index),
              "cross_attention", index) if cross else None,
          feed_forward=_t5_feed_forward(front, config),
          causal=not config.prefix_lm,  # a prefix LM's mask is the model's
          dropout_rate=config.dropout_rate,
          epsilon=config.layer_norm_epsilon, name=f"decoder_block_{index}")
      for index in range(config.decoder_layers)]
  return DecoderLayers(
      embedding=embedding,
      position_embedding=None,
      embedding_dropout=front.Dropout(config.dropout_rate,
                                      name="decoder_embedding_dropout"),
      # Bidirectional in a prefix LM, as Mesh TensorFlow's is in a model
      # not fully autoregressive.
      position_bias=_t5_position_bias(front, config,
                                      "decoder_self_attention",
                                      config.prefix_lm,
                                      "decoder_position_bias"),
      blocks=layer_blocks,
      final_norm=front.RMSNorm(config.layer_norm_epsilon,
                               name="decoder_final_norm"),
      final_dropout=front.Dropout(config.dropout_rate, name="decoder_output"),
      lm_head=_t5_lm_head(front, config, embedding))


def _t5_encoder(front, config, embedding, tokens):
  """Encoder tokens -> (its output M, the padding mask [b, 1, m])."""
  mask = front.padding_mask(tokens, PAD_ID, "encoder_mask")
  x = front.Dropout(config.dropout_rate,
                    name="encoder_embedding_dropout")(embedding(tokens))
  bias = _t5_position_bias(front, config, "encoder_self_attention", True,
                           "encoder_position_bias")(x)
  for index in range(config.num_layers):
    block = front.PreNormBlock(
        self_attention=_t5_attention(
            front, config,
            config.layer_attention("encoder_self_attention", index),
            "self_attention", index),
        feed_forward=_t5_feed_forward(front, config),
        dropout_rate=config.dropout_rate, epsilon=config.layer_norm_epsilon,
        name=f"encoder_block_{index}")
    x = block(x, attention_mask=mask, position_bias=bias)
  x = front.RMSNorm(config.layer_norm_epsilon, name="encoder_final_norm")(x)
  return front.Dropout(config.dropout_rate, name="encoder_output")(x), mask


def build_t5(config, front, name=None):
  """The T5 model with its LM head for a `T5Config`, by `config.stacks`, of
  `front`'s layers (the computation: thattn.models.t5's docstring).

  "encoder_decoder": inputs `encoder_input_tokens` and
  `decoder_input_tokens`; "decoder" (a language model): the decoder alone,
  on `decoder_input_tokens` (the tokens shifted right); "encoder": the
  encoder and the LM head, on `encoder_input_tokens`. Logits [b, n, vocab].
  """
  _check_config(config, config_lib.T5Config, "build_t5")
  inputs = {key: front.Input(key)
            for key, stack in (("encoder_input_tokens", "decoder"),
                               ("decoder_input_tokens", "encoder"))
            if config.stacks != stack}
  if config.prefix_lm:
    inputs[config_lib.PREFIX_LM_INPUT] = front.Input(
        config_lib.PREFIX_LM_INPUT)
  embedding = front.TokenEmbedding(
      config.vocab_size, config.d_model,
      embeddings_initializer=front.random_normal(1.0),
      logits_scale=config.d_model ** -0.5 if config.tie_embeddings else 1.0,
      name="token_embedding")
  memory = memory_mask = None
  if "encoder_input_tokens" in inputs:
    memory, memory_mask = _t5_encoder(front, config, embedding,
                                      inputs["encoder_input_tokens"])
  if config.stacks == "encoder":
    result = logits(_t5_lm_head(front, config, embedding), embedding,
                    memory)
  else:
    result = run_decoder(make_decoder_layers(front, config, embedding),
                         inputs["decoder_input_tokens"], memory, memory_mask,
                         attention_mask=_prefix_lm_mask(front, config,
                                                        inputs))
  # Named "logits" in a SavedModel's serving signature.
  return front.Model(inputs, front.named_output(result, "logits", "float32"),
                     name or "t5")


def _lm_block(front, config, index):
  initializer = lambda: front.random_normal(config.initializer_range)
  return front.PreNormBlock(
      self_attention=config.attention.make_layer(
          config.d_model, name="self_attention",
          dropout_rate=config.dropout_rate, use_bias=config.use_bias,
          kernel_initializer=initializer(), front_end=front.name,
          rotary=config.rotary_arguments(), layer_index=index,
          norm_epsilon=config.layer_norm_epsilon,
          query_key_norm_epsilon=config.query_key_norm_epsilon(),
          sliding_window=config.layer_window(index)),
      feed_forward=front.FeedForward(
          config.d_ff, activation=config.activation,
          gated=config.gated_feed_forward, use_bias=config.use_bias,
          kernel_initializer=initializer(), name="feed_forward"),
      causal=not config.prefix_lm,  # a prefix LM's mask is the model's
      dropout_rate=config.dropout_rate,
      epsilon=config.layer_norm_epsilon, norm=config.norm,
      parallel_residual=config.parallel_residual,
      name=f"decoder_block_{index}")


def make_lm_layers(front, config):
  """A decoder-only LM's layers (`DecoderLayers`) for a `DecoderConfig`."""
  embedding = front.TokenEmbedding(
      config.vocab_size, config.d_model,
      embeddings_initializer=front.random_normal(config.initializer_range),
      name="token_embedding")
  position_embedding = None
  if config.position_embedding == "learned":
    position_embedding = front.PositionEmbedding(
        config.max_position_embeddings,
        initializer=front.random_normal(config.initializer_range),
        name="position_embedding")
  if config.norm == "rms_norm":
    final_norm = front.RMSNorm(config.layer_norm_epsilon,
                               name="decoder_final_norm")
  else:
    final_norm = front.LayerNormalization(epsilon=config.layer_norm_epsilon,
                                          name="decoder_final_norm")
  lm_head = embedding
  if not config.tie_embeddings:  # float32, as the tied logits are
    lm_head = front.Dense(
        config.vocab_size, use_bias=False,
        kernel_initializer=front.random_normal(config.initializer_range),
        dtype="float32", name="lm_head")
  return DecoderLayers(
      embedding=embedding, position_embedding=position_embedding,
      embedding_dropout=front.Dropout(config.dropout_rate,
                                      name="decoder_embedding_dropout"),
      position_bias=None,
      blocks=[_lm_block(front, config, index)
              for index in range(config.num_layers)],
      final_norm=final_norm, final_dropout=None, lm_head=lm_head)


def _prefix_lm_mask(front, config, inputs):
  """A prefix LM's self-attention mask from its inputs; None otherwise."""
  if not config.prefix_lm:
    return None
  return front.prefix_lm_mask(inputs[config_lib.PREFIX_LM_INPUT],
                              "prefix_lm_mask")


def build_decoder_lm(config, front, name=None):
  """The decoder-only LM of a `DecoderConfig`, of `front`'s layers: input
  `decoder_input_tokens` int32 [b, n] (and a prefix LM's
  `decoder_causal_attention` [b, n]: `config_lib.PREFIX_LM_INPUT`), output
  float32 logits [b, n, vocab], position i's scoring the token after it
  (the computation: `DecoderConfig`'s docstring)."""
  _check_config(config, config_lib.DecoderConfig, "build_decoder_lm")
  inputs = {"decoder_input_tokens": front.Input("decoder_input_tokens")}
  if config.prefix_lm:
    inputs[config_lib.PREFIX_LM_INPUT] = front.Input(
        config_lib.PREFIX_LM_INPUT)
  result = run_decoder(make_lm_layers(front, config),
                       inputs["decoder_input_tokens"], None, None,
                       attention_mask=_prefix_lm_mask(front, config, inputs))
  return front.Model(inputs, front.named_output(result, "logits", "float32"),
                     name or config.family)


_BUILDERS = ((config_lib.T5Config, build_t5),
             (config_lib.BertConfig, build_bert),
             (config_lib.DecoderConfig, build_decoder_lm))


def build_model(config, front, name=None):
  """The functional model of a `BertConfig`, `T5Config` or `DecoderConfig`,
  of `front`'s layers."""
  for kind, builder in _BUILDERS:
    if isinstance(config, kind):
      return builder(config, front, name)
  raise ValueError(f"Expected a BertConfig, T5Config or DecoderConfig, got "
                   f"{config!r}.")


def create_model(preset, front, **overrides):
  """`front`'s model of `preset` (a name or a config) with overrides, named
  after the preset."""
  config = presets.model_config(preset, **overrides)
  return build_model(config, front,
                     name=preset if isinstance(preset, str) else None)
