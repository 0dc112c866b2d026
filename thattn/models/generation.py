"""Decoding with the attention layers' incremental caches: T5, and the
decoder-only LMs.

`generate(model, tokens, max_length=N, ...)` picks the generator from the
model's inputs: a T5 (`encoder_input_tokens`) decodes N tokens from its
encoder's input; a decoder-only LM (`decoder_input_tokens` alone) continues
a prompt with N new tokens (`DecoderLMGenerator`, below the T5 one).

`T5Generator(model, max_length=...)` is a `tf.Module` whose `__call__` is a
`tf.function` over `encoder_input_tokens` [batch, length], so it exports
with `tf.saved_model.save(generator, path)`. It returns
`{"tokens": int32 [batch, max_length], "scores": float32 [batch]}`:
the generated tokens (without the start token; after the end token, padding)
and the sum of their log-probabilities up to and including the end token.

The encoder runs once. Each decoder block keeps a self-attention cache,
written one position per step, and its cross-attention memory projected
once (`PreNormBlock.initial_cache`); the decoder itself is
`thattn.models.wiring.run_decoder`, the same code the model is built from.

Methods:

- "greedy": the most likely token at every step.
- "sample": a draw from softmax(logits / temperature), optionally restricted
  to the `top_k` most likely tokens. The module holds a seeded
  `tf.random.Generator`, so an exported sampler draws fresh samples.
- "beam": beam search with `beam_size` beams. Finished beams continue with
  padding at no cost, so they compete with unfinished ones on total
  log-probability; the final choice among the beams divides by T5's length
  penalty ((5 + length) / 6) ** length_penalty. (T5's own beam search
  keeps finished and alive beams apart; with length_penalty=0 and beams
  that keep every prefix, both are exhaustive.)
"""

import tensorflow as tf

from thattn.core import decoding_options
from thattn.models import config as config_lib
from thattn.models import t5
from thattn.models import wiring


def choose_tokens(log_probs, method, rng, temperature=1.0, top_k=0,
                  top_p=1.0):
  """int32 tokens [batch] from log-probabilities [batch, vocab]: the most
  likely ("greedy"), or ("sample") a draw from softmax(log_probs /
  temperature) restricted to the `top_k` most likely tokens (0: all), then
  to the fewest most likely whose probabilities sum to `top_p` or more
  (nucleus sampling), in that order, as transformers' `generate` filters
  them. `rng`: a `tf.random.Generator`."""
  if method == "greedy":
    return tf.argmax(log_probs, axis=-1, output_type=tf.int32)
  logits = log_probs / temperature
  if top_k:
    kth_best = tf.math.top_k(logits, k=top_k).values[:, -1:]
    logits = tf.where(logits < kth_best, decoding_options.IMPOSSIBLE, logits)
  if top_p < 1.0:
    ranked = tf.sort(logits, axis=-1, direction="DESCENDING")
    # Each token's probability mass before it: the first always stays.
    before = tf.math.cumsum(tf.nn.softmax(ranked), axis=-1, exclusive=True)
    kept = tf.where(before < top_p, ranked, -decoding_options.IMPOSSIBLE)
    threshold = tf.reduce_min(kept, axis=-1, keepdims=True)
    logits = tf.where(logits < threshold, decoding_options.IMPOSSIBLE, logits)
  seed = rng.make_seeds(1)[:, 0]
  return tf.cast(tf.random.stateless_categorical(logits, 1, seed)[:, 0],
                 tf.int32)


class _Untracked:
  """Attributes that a tf.Module does not track (it wraps lists and dicts)."""

  def __init__(self, **attributes):
    self.__dict__.update(attributes)


class T5Generator(tf.Module):
  """Generation from a T5 model of `thattn.models` (built or reloaded).

  Args:
    model: the functional model of `build_t5` / `create_model("t5_...")`.
    max_length: decoding steps, the length of the returned tokens.
    method: "greedy", "sample" or "beam".
    temperature, top_k: for "sample"; top_k=0 samples from all tokens.
    beam_size, length_penalty: for "beam".
    eos_id: the token that ends a sequence (T5's 1).
    seed: of the sampler's random generator.
  """

  def __init__(self, model, *, max_length, method="greedy", temperature=1.0,
               top_k=0, beam_size=4, length_penalty=0.6, eos_id=wiring.EOS_ID,
               seed=0, name=None):
    super().__init__(name=name)
    decoding_options.check(max_length, method, temperature, top_k, beam_size)
    self.max_length = max_length
    self.method = method
    self.temperature = float(temperature)
    self.top_k = top_k
    self.beam_size = beam_size
    self.length_penalty = float(length_penalty)
    self.eos_id = eos_id
    # The layers sit in a plain object, which tf.Module does not track:
    # exported, the generator holds the weights and its one function, and
    # Keras does not trace every layer's call into the SavedModel too.
    self._layers = _Untracked(model=model, encoder=t5.encoder_model(model),
                              decoder=wiring.decoder_layers(model))
    self._model_weights = list(model.weights)  # tracked: saved with it
    self._vocab_size = self._layers.decoder.embedding.vocab_size
    self._rng = tf.random.Generator.from_seed(seed)

  @property
  def model(self):
    return self._layers.model

  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int32, name="encoder_input_tokens")])
  def __call__(self, encoder_input_tokens):
    """{"tokens": [batch, max_length], "scores": [batch]} (see the module)."""
    if self.method == "beam":
      return self._beam_search(encoder_input_tokens)
    return self._sample_or_greedy(encoder_input_tokens)

  # ---- shared steps --------------------------------------------------------
  def _start(self, encoder_tokens, repeat=1):
    """Encoder output, its mask and the decoder caches, each row x repeat."""
    memory, memory_mask = self._layers.encoder(encoder_tokens, training=False)
    if repeat > 1:
      memory = tf.repeat(memory, repeat, axis=0)
      memory_mask = tf.repeat(memory_mask, repeat, axis=0)
    batch = tf.shape(memory)[0]
    caches = [block.initial_cache(batch, self.max_length, memory)
              for block in self._layers.decoder.blocks]
    return memory_mask, caches

  def _step(self, tokens, step, memory_mask, caches):
    """Log-probabilities [batch, vocab] of the token after `tokens` [batch]."""
    logits, caches = wiring.run_decoder(
        self._layers.decoder, tf.expand_dims(tokens, 1), None, memory_mask,
        training=False, caches=caches, decode_step=step,
        max_length=self.max_length)
    return tf.nn.log_softmax(logits[:, 0]), caches

  # ---- greedy and sampling ---------------------------------------------------
  def _choose(self, log_probs):
    return choose_tokens(log_probs, self.method, self._rng,
                         self.temperature, self.top_k)

  def _sample_or_greedy(self, encoder_tokens):
    memory_mask, caches = self._start(encoder_tokens)
    batch = tf.shape(encoder_tokens)[0]
    tokens = tf.fill([batch], wiring.DECODER_START_ID)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    outputs = tf.TensorArray(tf.int32, size=self.max_length)
    for step in tf.range(self.max_length):
      log_probs, caches = self._step(tokens, step, memory_mask, caches)
      tokens = tf.where(finished, wiring.PAD_ID, self._choose(log_probs))
      token_scores = tf.gather(log_probs, tokens, batch_dims=1)
      scores += tf.where(finished, 0.0, token_scores)
      finished |= tf.equal(tokens, self.eos_id)
      outputs = outputs.write(step, tokens)
    return {"tokens": tf.transpose(outputs.stack()), "scores": scores}

  # ---- beam search -----------------------------------------------------------
  def _beam_search(self, encoder_tokens):
    beams, vocab, length = self.beam_size, self._vocab_size, self.max_length
    memory_mask, caches = self._start(encoder_tokens, repeat=beams)
    batch = tf.shape(encoder_tokens)[0]
    # All beams start equal; only the first may expand at the first step.
    impossible = decoding_options.IMPOSSIBLE
    scores = tf.tile(tf.constant([[0.0] + [impossible] * (beams - 1)]),
                     [batch, 1])
    sequences = tf.zeros([batch, beams, length], tf.int32)
    finished = tf.zeros([batch, beams], tf.bool)
    tokens = tf.fill([batch * beams], wiring.DECODER_START_ID)
    # A finished beam may only continue with padding, at no cost.
    pad_only = tf.where(tf.range(vocab) == wiring.PAD_ID, 0.0, impossible)
    for step in tf.range(length):
      log_probs, caches = self._step(tokens, step, memory_mask, caches)
      log_probs = tf.reshape(log_probs, [batch, beams, vocab])
      log_probs = tf.where(tf.expand_dims(finished, 2), pad_only, log_probs)
      candidates = tf.reshape(tf.expand_dims(scores, 2) + log_probs,
                              [batch, beams * vocab])
      scores, best = tf.math.top_k(candidates, k=beams)
      parent, token = best // vocab, best % vocab
      sequences = tf.gather(sequences, parent, batch_dims=1)
      sequences += (tf.expand_dims(token, 2) *
                    tf.one_hot(step, length, dtype=tf.int32))
      finished = (tf.gather(finished, parent, batch_dims=1) |
                  tf.equal(token, self.eos_id))
      rows = tf.reshape(parent + beams * tf.expand_dims(tf.range(batch), 1),
                        [-1])
      caches = [self._reorder(cache, rows) for cache in caches]
      tokens = tf.reshape(token, [-1])
    best = tf.argmax(scores / self._penalty(sequences), axis=-1,
                     output_type=tf.int32)
    return {"tokens": tf.gather(sequences, best, batch_dims=1),
            "scores": tf.gather(scores, best, batch_dims=1)}

  @staticmethod
  def _reorder(cache, rows):
    # The cross-attention memory is the same for all beams of an example.
    reordered = dict(cache)
    reordered["self_attention"] = tf.nest.map_structure(
        lambda tensor: tf.gather(tensor, rows), cache["self_attention"])
    return reordered

  def _penalty(self, sequences):
    """T5's length penalty ((5 + length) / 6) ** alpha, [batch, beams]."""
    is_eos = tf.equal(sequences, self.eos_id)
    first_eos = tf.argmax(tf.cast(is_eos, tf.int32), axis=-1,
                          output_type=tf.int32)
    lengths = tf.where(tf.reduce_any(is_eos, axis=-1), first_eos + 1,
                       tf.shape(sequences)[-1])
    return ((5.0 + tf.cast(lengths, tf.float32)) / 6.0) ** self.length_penalty


class DecoderLMGenerator(tf.Module):
  """Continuations of prompts from a decoder-only LM of `thattn.models`.

  `generator(prompt_tokens)` takes int32 [batch, p], every prompt of the
  batch p tokens long, and returns `{"tokens": int32 [batch, max_length],
  "scores": float32 [batch]}`: the `max_length` tokens after the prompt,
  and the sum of their log-probabilities (up to and including `eos_id`'s
  first, after which the tokens are `pad_id`). The prompt runs through the
  model once, filling the caches; each new token is then one step.

  Args:
    model: the functional model of `create_model` for a `DecoderConfig`
      (or a T5Config with stacks="decoder", its prompt starting with the
      decoder start token 0). A prefix LM's (`prefix_lm=True`) prompt is
      its prefix, whose positions attend to each other both ways (its
      task ends it with the end token: `thattn.tasks.prefix_lm`).
    max_length: N, the new tokens.
    method: "greedy", "sample" or "beam".
    temperature, top_k, top_p: for "sample" (`choose_tokens`).
    beam_size: for "beam": the best `beam_size` continuations by total
      log-probability are kept at each step; a finished one continues with
      `pad_id` at no cost, and the best of them is returned (no length
      penalty: with no `eos_id`, every beam has N tokens).
    eos_id: the token that ends a continuation, or None (GPT-2's and
      Llama's models run on until N).
    pad_id: what follows the end token; default `eos_id`, as transformers'
      `generate` pads when a model has no padding token.
    seed: of the sampler's random generator.
  """

  def __init__(self, model, *, max_length, method="greedy", temperature=1.0,
               top_k=0, top_p=1.0, beam_size=4, eos_id=None, pad_id=None,
               seed=0, name=None):
    super().__init__(name=name)
    decoding_options.check(max_length, method, temperature, top_k, beam_size,
                           top_p)
    # A prefix LM's prompt is its prefix, which attends both ways.
    self._prefix_lm = decoding_options.is_prefix_lm(
        model.name, model.input if isinstance(model.input, dict) else [],
        config_lib.PREFIX_LM_INPUT)
    self.max_length = max_length
    self.method = method
    self.temperature = float(temperature)
    self.top_k = top_k
    self.top_p = float(top_p)
    self.beam_size = beam_size
    self.eos_id = -1 if eos_id is None else eos_id  # -1: never generated
    self.pad_id = self.eos_id if pad_id is None else pad_id
    # Untracked, as in T5Generator: exported, the module holds the weights
    # and its one function.
    self._layers = _Untracked(model=model,
                              decoder=wiring.decoder_layers(model))
    self._model_weights = list(model.weights)
    self._vocab_size = self._layers.decoder.embedding.vocab_size
    self._rng = tf.random.Generator.from_seed(seed)

  @property
  def model(self):
    return self._layers.model

  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int32, name="prompt_tokens")])
  def __call__(self, prompt_tokens):
    """{"tokens": [batch, max_length], "scores": [batch]} (see the class)."""
    if self.method == "beam":
      return self._beam_search(prompt_tokens)
    return self._sample_or_greedy(prompt_tokens)

  def _prefill(self, prompt):
    """The caches holding the prompt, and the log-probabilities [batch,
    vocab] of the token after it."""
    batch, length = tf.shape(prompt)[0], tf.shape(prompt)[1]
    caches = [block.initial_cache(batch, length + self.max_length)
              for block in self._layers.decoder.blocks]
    mask = (tf.ones([batch, length, length], tf.bool) if self._prefix_lm
            else None)
    return self._step(prompt, 0, caches, length + self.max_length, mask)

  def _step(self, tokens, position, caches, cache_length,
            attention_mask=None):
    """Log-probabilities of the token after `tokens` [batch, n] written at
    `position`, and the caches (of `cache_length` positions) with them;
    `attention_mask`: a prefix LM's prompt's (`wiring.run_decoder`)."""
    logits, caches = wiring.run_decoder(
        self._layers.decoder, tokens, None, None, training=False,
        caches=caches, decode_step=position, max_length=cache_length,
        attention_mask=attention_mask)
    return tf.nn.log_softmax(logits[:, -1]), caches

  def _sample_or_greedy(self, prompt):
    log_probs, caches = self._prefill(prompt)
    start = tf.shape(prompt)[1]
    cache_length = start + self.max_length
    batch = tf.shape(prompt)[0]
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    outputs = tf.TensorArray(tf.int32, size=self.max_length)
    for step in tf.range(self.max_length):
      chosen = choose_tokens(log_probs, self.method, self._rng,
                             self.temperature, self.top_k, self.top_p)
      tokens = tf.where(finished, self.pad_id, chosen)
      scores += tf.where(finished, 0.0,
                         tf.gather(log_probs, tokens, batch_dims=1))
      finished |= tf.equal(tokens, self.eos_id)
      outputs = outputs.write(step, tokens)
      # (The last step's log-probabilities go unused; its cache row is
      # the last of the prompt's length + max_length.)
      log_probs, caches = self._step(tf.expand_dims(tokens, 1),
                                     start + step, caches, cache_length)
    return {"tokens": tf.transpose(outputs.stack()), "scores": scores}

  def _beam_search(self, prompt):
    beams, vocab, length = self.beam_size, self._vocab_size, self.max_length
    batch, start = tf.shape(prompt)[0], tf.shape(prompt)[1]
    log_probs, caches = self._prefill(tf.repeat(prompt, beams, axis=0))
    # All beams start equal; only the first may expand at the first step.
    impossible = decoding_options.IMPOSSIBLE
    scores = tf.tile(tf.constant([[0.0] + [impossible] * (beams - 1)]),
                     [batch, 1])
    sequences = tf.zeros([batch, beams, length], tf.int32)
    finished = tf.zeros([batch, beams], tf.bool)
    # A finished beam may only continue with padding, at no cost.
    pad_only = tf.where(tf.range(vocab) == self.pad_id, 0.0, impossible)
    for step in tf.range(length):
      log_probs = tf.reshape(log_probs, [batch, beams, vocab])
      log_probs = tf.where(tf.expand_dims(finished, 2), pad_only, log_probs)
      candidates = tf.reshape(tf.expand_dims(scores, 2) + log_probs,
                              [batch, beams * vocab])
      scores, best = tf.math.top_k(candidates, k=beams)
      parent, token = best // vocab, best % vocab
      sequences = tf.gather(sequences, parent, batch_dims=1)
      sequences += (tf.expand_dims(token, 2) *
                    tf.one_hot(step, length, dtype=tf.int32))
      finished = (tf.gather(finished, parent, batch_dims=1) |
                  tf.equal(token, self.eos_id))
      rows = tf.reshape(parent + beams * tf.expand_dims(tf.range(batch), 1),
                        [-1])
      caches = [tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows),
                                      cache) for cache in caches]
      log_probs, caches = self._step(tf.reshape(token, [-1, 1]),
                                     start + step, caches, start + length)
    best = tf.argmax(scores, axis=-1, output_type=tf.int32)
    return {"tokens": tf.gather(sequences, best, batch_dims=1),
            "scores": tf.gather(scores, best, batch_dims=1)}


def generate(model, tokens, *, max_length, **options):
  """Decodes with a T5 model (`tokens`: its encoder's input; see
  `T5Generator`) or continues prompts with a decoder-only LM (`tokens`:
  the prompts; see `DecoderLMGenerator`), by the model's inputs.

  Builds (and traces) a new generator on every call; keep one generator
  to decode many batches.
  """
  inputs = model.input if isinstance(model.input, dict) else {}
  kind = (T5Generator if "encoder_input_tokens" in inputs else
          DecoderLMGenerator)
  generator = kind(model, max_length=max_length, **options)
  return generator(tf.convert_to_tensor(tokens, tf.int32))
