"""How thattn's T5 layers and decoder compute, written once for both front
ends.

Plain Python over layers a front end supplies: tf_keras layers
(`thattn.models`) or Keras 3 layers (`thattn.keras3.models`). Nothing here
imports a framework, so the Keras 3 models on JAX or PyTorch run it without
TensorFlow. Each front end keeps only its layer classes and its framework's
glue (serialization, building, its Model class).

- `PreNormWiring`: T5's pre-norm layer (mixed into each front end's
  `PreNormBlock`), with RMSNorm:
      x = x + dropout(self_attention(norm(x), norm(x)))
      x = x + dropout(cross_attention(norm(x), memory))    (decoder only)
      x = x + dropout(feed_forward(norm(x)))
  and its incremental decoding with the attention layers' caches.
- `DecoderLayers` / `run_decoder`: the decoder stack, which both builders
  call on Keras symbolic tensors and both generators call one step at a
  time with the caches.
- `decoder_layers(model)`: a built (or reloaded) T5's decoder layers, by
  their names.
"""

import collections

# T5's special tokens: 0 pads the encoder input and starts the decoder's; 1
# ends a sequence.
PAD_ID = 0
DECODER_START_ID = 0
EOS_ID = 1

DecoderLayers = collections.namedtuple(
    "DecoderLayers", ["embedding", "embedding_dropout", "position_bias",
                      "blocks", "final_norm", "final_dropout", "lm_head"])


class PreNormWiring:
  """T5's pre-norm Transformer layer, for a Layer that has the attributes
  `self_attention_norm`, `self_attention`, `cross_attention_norm` and
  `cross_attention` (None in an encoder), `feed_forward_norm`,
  `feed_forward`, `_dropout` and `causal`."""

  def initial_cache(self, batch_size, max_length, memory=None):
    """Empty self-attention cache; the cross-attention memory, projected."""
    cache = {"self_attention":
                 self.self_attention.initial_cache(batch_size, max_length)}
    if self.cross_attention is not None:
      if memory is None:
        raise ValueError(f"{self.name}: a decoder block's cache needs the "
                         "encoder output as `memory`.")
      cache["cross_attention"] = self.cross_attention.memory_cache(memory)
    return cache

  def call(self, inputs, memory=None, attention_mask=None, memory_mask=None,
           position_bias=None, training=None, cache=None, decode_step=None):
    # x = x + ..., never x += ...: a PyTorch tensor would be changed in
    # place, the caller's input with it.
    x = inputs
    new_cache = {}
    h = self.self_attention_norm(x)
    if cache is None:
      y = self.self_attention(h, h, attention_mask=attention_mask,
                              use_causal_mask=self.causal,
                              position_bias=position_bias, training=training)
    else:
      y, new_cache["self_attention"] = self.self_attention(
          h, h, attention_mask=attention_mask, position_bias=position_bias,
          training=training, cache=cache["self_attention"],
          decode_step=decode_step)
    x = x + self._dropout(y, training=training)
    if self.cross_attention is not None:
      h = self.cross_attention_norm(x)
      if cache is None:
        y = self.cross_attention(h, memory, attention_mask=memory_mask,
                                 training=training)
      else:  # the memory was projected once, into the cache
        y, new_cache["cross_attention"] = self.cross_attention(
            h, None, attention_mask=memory_mask, training=training,
            cache=cache["cross_attention"])
      x = x + self._dropout(y, training=training)
    y = self.feed_forward(self.feed_forward_norm(x), training=training)
    x = x + self._dropout(y, training=training)
    return x if cache is None else (x, new_cache)


def logits(parts, x):
  """float32 logits [b, n, vocab]: the tied embedding's (when `lm_head` is
  the embedding layer itself) or the untied `lm_head`'s."""
  if parts.lm_head is parts.embedding:
    return parts.embedding(x, mode="logits")
  return parts.lm_head(x)


def run_decoder(parts, tokens, memory, memory_mask, training=None,
                caches=None, decode_step=None, max_length=None):
  """Decoder tokens [b, n] -> float32 logits [b, n, vocab].

  With `caches` (one per block, from `PreNormWiring.initial_cache`), the
  tokens are decoding steps `decode_step, decode_step + 1, ...` of at most
  `max_length`, `memory` is unused (it is in the caches), and the result is
  `(logits, new_caches)`.
  """
  x = parts.embedding(tokens)
  x = parts.embedding_dropout(x, training=training)
  if caches is None:
    bias = parts.position_bias(x)
  else:
    bias = parts.position_bias(x, memory_length=max_length,
                               query_offset=decode_step)
  new_caches = []
  for index, block in enumerate(parts.blocks):
    if caches is None:
      x = block(x, memory=memory, memory_mask=memory_mask,
                position_bias=bias, training=training)
    else:
      x, cache = block(x, memory_mask=memory_mask, position_bias=bias,
                       training=training, cache=caches[index],
                       decode_step=decode_step)
      new_caches.append(cache)
  x = parts.final_dropout(parts.final_norm(x), training=training)
  result = logits(parts, x)
  return result if caches is None else (result, new_caches)


def decoder_layers(model):
  """The `DecoderLayers` of a built T5 model (either front end's, or a
  reload), found by their names."""
  names = [layer.name for layer in model.layers]
  count = sum(name.startswith("decoder_block_") for name in names)
  lm_head = "lm_head" if "lm_head" in names else "token_embedding"
  return DecoderLayers(
      embedding=model.get_layer("token_embedding"),
      embedding_dropout=model.get_layer("decoder_embedding_dropout"),
      position_bias=model.get_layer("decoder_position_bias"),
      blocks=[model.get_layer(f"decoder_block_{index}")
              for index in range(count)],
      final_norm=model.get_layer("decoder_final_norm"),
      final_dropout=model.get_layer("decoder_output"),
      lm_head=model.get_layer(lm_head))
