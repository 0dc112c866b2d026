"""T5 decoding and decoder-only LM continuations in Keras 3, with the
attention layers' caches, on any backend.

`T5Generator(model, max_length=...)(encoder_input_tokens)` decodes greedily
from a T5 of `thattn.keras3.models` and returns `{"tokens": int32 [batch,
max_length], "scores": float32 [batch]}`, as `thattn.models.T5Generator`
does for tf_keras (method "greedy"): the tokens without the start token,
padding after the end token, and the sum of their log-probabilities up to
and including the end token.

The encoder runs once; each decoder block keeps its self-attention cache,
written one position per step, and its cross-attention memory projected
once; each step is `thattn.models.wiring.run_decoder`, the code both front
ends' models are built from. The loop is `keras.ops.fori_loop` over the
steps, compiled whole per backend:

- JAX: `jax.jit` of a pure function of the model's variable values (under
  `keras.StatelessScope`), one compile for the whole decode per input
  shape, not one per step;
- TensorFlow: eagerly (the loop a `tf.while_loop`; wrap the generator in
  a `tf.function` to trace it);
- PyTorch: a Python loop under `torch.no_grad()`.

`DecoderLMGenerator` continues prompts of a decoder-only LM the same way,
greedily, by sampling or by beam search (`choose_tokens`, `beam_decode`),
as tf_keras's `thattn.models.DecoderLMGenerator` does.
"""

import keras
from keras import ops

from thattn.core import decoding_options
from thattn.core import validation
from thattn.keras3.models import embeddings
from thattn.models import config as config_lib
from thattn.models import wiring


def compile_decode(decode, model):
  """`decode` (tensors -> tensors, reading `model`'s weights) compiled
  for the backend, as the module says: (the callable, and for JAX its
  jax.jit, whose compiles can be counted; else None)."""
  backend = keras.backend.backend()
  if backend == "jax":
    import jax  # pylint: disable=g-import-not-at-top
    variables = list(model.variables)

    def pure(values, *arguments):
      with keras.StatelessScope(state_mapping=list(zip(variables, values))):
        return decode(*arguments)

    jitted = jax.jit(pure)
    # The variables' current values on each call: a changed weight needs
    # no new compile.
    return (lambda *arguments: jitted([v.value for v in variables],
                                      *arguments)), jitted
  if backend == "tensorflow":
    # Eager: keras.ops.fori_loop is a tf.while_loop run step by step.
    # (A tf.function would need TensorFlow imported here, which the
    # Keras 3 models never do themselves: tests/architecture_test.py.)
    return decode, None
  import torch  # pylint: disable=g-import-not-at-top

  def decode_without_gradients(*arguments):
    with torch.no_grad():
      return decode(*arguments)
  return decode_without_gradients, None


class T5Generator:
  """Greedy decoding from a T5 model of `thattn.keras3.models`.

  Args:
    model: the functional model of `build_t5` / `create_model("t5_...")`,
      with an encoder and a decoder (`stacks="encoder_decoder"`).
    max_length: decoding steps, the length of the returned tokens.
    eos_id: the token that ends a sequence (T5's 1).
  """

  def __init__(self, model, *, max_length, eos_id=wiring.EOS_ID):
    validation.positive_int("max_length", max_length)
    names = [layer.name for layer in model.layers]
    if "encoder_output" not in names or "decoder_output" not in names:
      raise ValueError(
          f"T5Generator needs a T5 with an encoder and a decoder "
          f"(stacks='encoder_decoder'); {model.name!r} has layers {names}.")
    self.model = model
    self.max_length = max_length
    self.eos_id = eos_id
    self._decoder = wiring.decoder_layers(model)
    self._encoder = keras.Model(
        model.input["encoder_input_tokens"],
        model.get_layer("encoder_output").output,
        name=f"{model.name}_encoder")
    self._compiled = None
    self.jitted = None  # JAX: the jax.jit of the decode, once compiled

  def __call__(self, encoder_input_tokens):
    """{"tokens": [batch, max_length], "scores": [batch]}."""
    tokens = ops.convert_to_tensor(encoder_input_tokens, "int32")
    if self._compiled is None:
      self._compiled, self.jitted = compile_decode(self.decode, self.model)
    return self._compiled(tokens)

  def decode(self, encoder_tokens):
    """The whole decode on tensors (traced once by `__call__`)."""
    memory = self._encoder(encoder_tokens, training=False)
    memory_mask = embeddings.padding_mask(encoder_tokens, wiring.PAD_ID)
    batch = ops.shape(encoder_tokens)[0]
    caches = [block.initial_cache(batch, self.max_length, memory)
              for block in self._decoder.blocks]
    state = (ops.full((batch,), wiring.DECODER_START_ID, "int32"),
             ops.zeros((batch,), "bool"), ops.zeros((batch,), "float32"),
             ops.zeros((batch, self.max_length), "int32"), caches)

    def step(index, state):
      tokens, finished, scores, outputs, caches = state
      logits, caches = wiring.run_decoder(
          self._decoder, ops.expand_dims(tokens, 1), None, memory_mask,
          training=False, caches=caches, decode_step=index,
          max_length=self.max_length)
      log_probs = ops.log_softmax(ops.cast(logits[:, 0], "float32"),
                                  axis=-1)
      chosen = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
      tokens = ops.where(finished, wiring.PAD_ID, chosen)
      token_scores = ops.take_along_axis(
          log_probs, ops.expand_dims(tokens, 1), axis=1)[:, 0]
      scores = scores + ops.where(finished, 0.0, token_scores)
      finished = ops.logical_or(finished, ops.equal(tokens, self.eos_id))
      # Written by a one-hot sum: static shapes, a traced step.
      outputs = outputs + ops.expand_dims(tokens, 1) * ops.one_hot(
          index, self.max_length, dtype="int32")
      return tokens, finished, scores, outputs, caches

    _, _, scores, outputs, _ = ops.fori_loop(0, self.max_length, step, state)
    return {"tokens": outputs, "scores": scores}



def choose_tokens(log_probs, method, noise=None, temperature=1.0, top_k=0,
                  top_p=1.0):
  """int32 tokens [batch] from log-probabilities [batch, vocab], as
  tf_keras's `thattn.models.generation.choose_tokens` chooses them: the
  most likely ("greedy"), or ("sample") a draw from softmax(log_probs /
  temperature) restricted to the `top_k` most likely (0: all), then to the
  fewest most likely whose probabilities sum to `top_p` or more. A draw is
  the Gumbel-max trick, argmax(logits - log(-log(noise))), with `noise`
  uniform (0, 1) [batch, vocab] drawn outside the compiled loop (a seed
  generator cannot advance inside a jax.jit)."""
  if method == "greedy":
    return ops.cast(ops.argmax(log_probs, axis=-1), "int32")
  impossible = decoding_options.IMPOSSIBLE
  logits = log_probs / temperature
  if top_k:
    kth_best = ops.top_k(logits, k=top_k)[0][:, -1:]
    logits = ops.where(logits < kth_best, impossible, logits)
  if top_p < 1.0:
    ranked = -ops.sort(-logits, axis=-1)
    probs = ops.softmax(ranked, axis=-1)
    # Each token's probability mass before it: the first always stays.
    before = ops.cumsum(probs, axis=-1) - probs
    kept = ops.where(before < top_p, ranked, -impossible)
    threshold = ops.min(kept, axis=-1, keepdims=True)
    logits = ops.where(logits < threshold, impossible, logits)
  gumbel = -ops.log(-ops.log(noise))
  return ops.cast(ops.argmax(logits + gumbel, axis=-1), "int32")


class DecoderLMGenerator:
  """Continuations of prompts from a decoder-only LM of
  `thattn.keras3.models`, as `thattn.models.DecoderLMGenerator` gives them
  for tf_keras: greedy, sampled (temperature, top-k, top-p) or by beam
  search.

  `generator(prompt_tokens)`: int32 [batch, p], every prompt p tokens
  long -> `{"tokens": int32 [batch, max_length], "scores": float32
  [batch]}`, the N new tokens and the sum of their log-probabilities (up
  to and including `eos_id`'s first, after which the tokens are
  `pad_id`). The prompt runs once, filling the caches; then one step per
  token, the loop compiled whole as T5Generator's (JAX: one compile per
  prompt shape).

  Args:
    model: the functional model of `create_model` for a `DecoderConfig`
      (or a T5Config with stacks="decoder"); a prefix LM's prompt attends
      to itself both ways, as tf_keras's.
    max_length: N, the new tokens.
    method: "greedy", "sample" or "beam".
    temperature, top_k, top_p: for "sample" (`choose_tokens`). Each call
      draws [N, batch, vocab] uniform numbers first, from a
      `keras.random.SeedGenerator(seed)`: the same draws as tf_keras's
      only in distribution, not token for token.
    beam_size: for "beam", as tf_keras's (the best `beam_size`
      continuations by total log-probability kept at each step, a finished
      one continued with `pad_id` at no cost, no length penalty): the same
      tokens and scores.
    eos_id: the token that ends a continuation, or None.
    pad_id: what follows the end token; default `eos_id`.
    seed: of the sampler's draws.
  """

  def __init__(self, model, *, max_length, method="greedy", temperature=1.0,
               top_k=0, top_p=1.0, beam_size=4, eos_id=None, pad_id=None,
               seed=0):
    decoding_options.check(max_length, method, temperature, top_k,
                           beam_size, top_p)
    # A prefix LM's prompt is its prefix, which attends both ways.
    self._prefix_lm = decoding_options.is_prefix_lm(
        model.name, model.input if isinstance(model.input, dict) else [],
        config_lib.PREFIX_LM_INPUT)
    self.model = model
    self.max_length = max_length
    self.method = method
    self.temperature = float(temperature)
    self.top_k = top_k
    self.top_p = float(top_p)
    self.beam_size = beam_size
    self.eos_id = -1 if eos_id is None else eos_id  # -1: never generated
    self.pad_id = self.eos_id if pad_id is None else pad_id
    self._decoder = wiring.decoder_layers(model)
    self._vocab_size = self._decoder.embedding.vocab_size
    self._seeds = keras.random.SeedGenerator(seed)
    self._compiled = None
    self.jitted = None  # JAX: the jax.jit of the decode, once compiled

  def __call__(self, prompt_tokens):
    """{"tokens": [batch, max_length], "scores": [batch]}."""
    tokens = ops.convert_to_tensor(prompt_tokens, "int32")
    if self._compiled is None:
      decode = (self.beam_decode if self.method == "beam" else
                self.decode)
      self._compiled, self.jitted = compile_decode(decode, self.model)
    noise = None
    if self.method == "sample":
      # Never 0: log(0) would make the draw -inf.
      noise = keras.random.uniform(
          (self.max_length, tokens.shape[0], self._vocab_size),
          minval=1e-12, maxval=1.0, seed=self._seeds)
    return self._compiled(tokens, noise)

  def _log_probs(self, tokens, position, caches, cache_length,
                 attention_mask=None):
    logits, caches = wiring.run_decoder(
        self._decoder, tokens, None, None, training=False, caches=caches,
        decode_step=position, max_length=cache_length,
        attention_mask=attention_mask)
    return ops.log_softmax(ops.cast(logits[:, -1], "float32"),
                           axis=-1), caches

  def _prefill(self, prompt):
    """The caches holding the prompt (of `length + max_length`
    positions), and the log-probabilities [batch, vocab] after it."""
    batch, length = prompt.shape[0], prompt.shape[1]
    cache_length = length + self.max_length
    caches = [block.initial_cache(batch, cache_length)
              for block in self._decoder.blocks]
    mask = (ops.ones((batch, length, length), "bool") if self._prefix_lm
            else None)
    return self._log_probs(prompt, 0, caches, cache_length, mask)

  def decode(self, prompt, noise=None):
    """Greedy or sampled: the prompt's pass and the whole decode on
    tensors (traced once by `__call__` per prompt shape); `noise` the
    sampler's uniform draws [max_length, batch, vocab]."""
    batch, length = prompt.shape[0], prompt.shape[1]
    cache_length = length + self.max_length
    log_probs, caches = self._prefill(prompt)
    state = (log_probs, ops.zeros((batch,), "bool"),
             ops.zeros((batch,), "float32"),
             ops.zeros((batch, self.max_length), "int32"), caches)

    def step(index, state):
      log_probs, finished, scores, outputs, caches = state
      chosen = choose_tokens(
          log_probs, self.method,
          None if noise is None else ops.take(noise, index, axis=0),
          self.temperature, self.top_k, self.top_p)
      tokens = ops.where(finished, self.pad_id, chosen)
      token_scores = ops.take_along_axis(
          log_probs, ops.expand_dims(tokens, 1), axis=1)[:, 0]
      scores = scores + ops.where(finished, 0.0, token_scores)
      finished = ops.logical_or(finished, ops.equal(tokens, self.eos_id))
      outputs = outputs + ops.expand_dims(tokens, 1) * ops.one_hot(
          index, self.max_length, dtype="int32")
      # (The last step's log-probabilities go unused.)
      log_probs, caches = self._log_probs(ops.expand_dims(tokens, 1),
                                          length + index, caches,
                                          cache_length)
      return log_probs, finished, scores, outputs, caches

    _, _, scores, outputs, _ = ops.fori_loop(0, self.max_length, step, state)
    return {"tokens": outputs, "scores": scores}

  def beam_decode(self, prompt, noise=None):
    """Beam search, as tf_keras's `_beam_search`, on tensors (traced once
    by `__call__` per prompt shape)."""
    del noise  # nothing is drawn
    beams, vocab, length = self.beam_size, self._vocab_size, self.max_length
    batch, start = prompt.shape[0], prompt.shape[1]
    impossible = decoding_options.IMPOSSIBLE
    log_probs, caches = self._prefill(ops.repeat(prompt, beams, axis=0))
    # All beams start equal; only the first may expand at the first step.
    scores = ops.tile(ops.convert_to_tensor(
        [[0.0] + [impossible] * (beams - 1)], "float32"), (batch, 1))
    # A finished beam may only continue with padding, at no cost.
    pad_only = ops.where(ops.equal(ops.arange(vocab), self.pad_id), 0.0,
                         impossible)
    # Row r of a step's [batch * beams] inputs is beam r % beams of
    # example r // beams.
    example_rows = ops.expand_dims(ops.arange(batch) * beams, 1)
    state = (log_probs, scores, ops.zeros((batch, beams, length), "int32"),
             ops.zeros((batch, beams), "bool"), caches)

    def step(index, state):
      log_probs, scores, sequences, finished, caches = state
      log_probs = ops.reshape(log_probs, (batch, beams, vocab))
      log_probs = ops.where(ops.expand_dims(finished, 2), pad_only,
                            log_probs)
      candidates = ops.reshape(ops.expand_dims(scores, 2) + log_probs,
                               (batch, beams * vocab))
      scores, best = ops.top_k(candidates, k=beams)
      parent = ops.cast(best // vocab, "int32")
      token = ops.cast(best % vocab, "int32")
      sequences = ops.take_along_axis(
          sequences, ops.repeat(ops.expand_dims(parent, 2), length, axis=2),
          axis=1)
      sequences = sequences + ops.expand_dims(token, 2) * ops.one_hot(
          index, length, dtype="int32")
      finished = ops.logical_or(ops.take_along_axis(finished, parent, axis=1),
                                ops.equal(token, self.eos_id))
      rows = ops.reshape(parent + example_rows, (-1,))
      caches = keras.tree.map_structure(
          lambda tensor: ops.take(tensor, rows, axis=0), caches)
      log_probs, caches = self._log_probs(ops.reshape(token, (-1, 1)),
                                          start + index, caches,
                                          start + length)
      return log_probs, scores, sequences, finished, caches

    _, scores, sequences, _, _ = ops.fori_loop(0, length, step, state)
    best = ops.expand_dims(ops.argmax(scores, axis=-1), 1)
    return {"tokens": ops.take_along_axis(
        sequences, ops.repeat(ops.expand_dims(best, 2), length, axis=2),
        axis=1)[:, 0],
            "scores": ops.take_along_axis(scores, best, axis=1)[:, 0]}


def generate(model, tokens, *, max_length, **options):
  """Decodes greedily with a T5 (`tokens`: its encoder's input; see
  `T5Generator`) or continues prompts with a decoder-only LM (`tokens`:
  the prompts; `options` as `DecoderLMGenerator`'s: greedy, sampled or
  beam search), by the model's inputs. Keep one
  generator to decode many batches: each one compiles once."""
  inputs = model.input if isinstance(model.input, dict) else {}
  kind = (T5Generator if "encoder_input_tokens" in inputs else
          DecoderLMGenerator)
  return kind(model, max_length=max_length, **options)(tokens)
