"""Continuations of a decoder-only LM in tf_keras (`DecoderLMGenerator`,
`thattn.models.generate`): sampling draws from the distribution the
options define (a NumPy transcription of temperature, top-k and top-p),
greedy and beam search are what their definitions give without caches,
the end token stops a continuation, the generator exports as a
SavedModel, and bad options are named. (Greedy and beam search against
transformers' `generate`: tests/models/hugging_face_decoders_test.py.)
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.models import sampling_reference
from thattn import models
from thattn.models import generation

PROMPT = np.array([[5, 17, 99, 3], [64, 2, 2, 40]], np.int32)


@pytest.fixture(scope="module")
def model():
  lm = models.create_model("lm_tiny", attention="talking_heads")
  rng = np.random.default_rng(0)
  lm.set_weights([rng.normal(0.0, 0.3, w.shape).astype(np.float32)
                  for w in lm.get_weights()])
  return lm


def _whole_pass_log_probs(model, tokens):
  logits = model({"decoder_input_tokens": tf.constant(tokens)}).numpy()
  last = logits[:, -1].astype(np.float64)
  return last - np.log(np.exp(last - last.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - last.max(-1, keepdims=True)


def _greedy_by_whole_passes(model, prompt, steps):
  tokens = prompt
  for _ in range(steps):
    best = _whole_pass_log_probs(model, tokens).argmax(-1)
    tokens = np.concatenate([tokens, best[:, None].astype(np.int32)], 1)
  return tokens[:, prompt.shape[1]:]


def test_greedy_continues_as_whole_passes_choose(model):
  got = models.generate(model, PROMPT, max_length=6)
  want = _greedy_by_whole_passes(model, PROMPT, 6)
  assert len(np.unique(want)) > 2
  np.testing.assert_array_equal(got["tokens"].numpy(), want)
  # The score is the continuation's log-probability.
  steps = np.concatenate([PROMPT, want], 1)
  expected = sum(_whole_pass_log_probs(model, steps[:, :4 + i])[
      np.arange(2), want[:, i]] for i in range(6))
  np.testing.assert_allclose(got["scores"].numpy(), expected, rtol=1e-4)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.8, 8, 0.7)])
def test_sampling_draws_from_the_filtered_distribution(model, temperature,
                                                       top_k, top_p):
  draws = 3000
  prompt = np.repeat(PROMPT[:1], draws, axis=0)
  generator = generation.DecoderLMGenerator(
      model, max_length=1, method="sample", temperature=temperature,
      top_k=top_k, top_p=top_p, seed=1)
  tokens = generator(tf.constant(prompt))["tokens"].numpy()[:, 0]
  log_probs = _whole_pass_log_probs(model, PROMPT[:1])[0]
  want = sampling_reference.filtered_distribution(log_probs, temperature,
                                                 top_k or 128, top_p)
  sampling_reference.assert_frequencies_match(tokens, want)


def test_sampling_is_seeded_and_top_k_one_is_greedy(model):
  def draw(seed, **options):
    return generation.DecoderLMGenerator(
        model, max_length=5, method="sample", seed=seed,
        **options)(tf.constant(PROMPT))["tokens"].numpy()
  np.testing.assert_array_equal(draw(3), draw(3))
  assert not np.array_equal(draw(3), draw(4))
  greedy = _greedy_by_whole_passes(model, PROMPT, 5)
  np.testing.assert_array_equal(draw(5, top_k=1), greedy)
  np.testing.assert_array_equal(draw(5, top_p=1e-6), greedy)


def test_beam_search_of_one_beam_is_greedy_and_wider_beams_score_higher(
    model):
  greedy = models.generate(model, PROMPT, max_length=5)
  one = models.generate(model, PROMPT, max_length=5, method="beam",
                        beam_size=1)
  np.testing.assert_array_equal(one["tokens"].numpy(),
                                greedy["tokens"].numpy())
  wide = models.generate(model, PROMPT, max_length=5, method="beam",
                         beam_size=6)
  assert np.all(wide["scores"].numpy() >= greedy["scores"].numpy() - 1e-5)


def test_the_end_token_ends_a_continuation(model):
  want = _greedy_by_whole_passes(model, PROMPT, 6)
  eos = int(want[0, 2])
  got = models.generate(model, PROMPT, max_length=6, eos_id=eos,
                        pad_id=0)["tokens"].numpy()
  for row, expected in zip(got, want):
    if eos in expected:
      end = list(expected).index(eos)
      np.testing.assert_array_equal(row[:end + 1], expected[:end + 1])
      assert not row[end + 1:].any()
    else:
      np.testing.assert_array_equal(row, expected)


def test_the_generator_exports_and_reloads(model, tmp_path):
  generator = generation.DecoderLMGenerator(model, max_length=4)
  want = generator(tf.constant(PROMPT))["tokens"].numpy()
  tf.saved_model.save(generator, str(tmp_path / "lm"))
  loaded = tf.saved_model.load(str(tmp_path / "lm"))
  np.testing.assert_array_equal(
      loaded(tf.constant(PROMPT))["tokens"].numpy(), want)


@pytest.mark.parametrize("options, message", [
    (dict(top_p=0.0), "top_p must be in"),
    (dict(temperature=0.0), "temperature must be positive"),
    (dict(method="nucleus"), "method"),
])
def test_bad_options_are_named(model, options, message):
  with pytest.raises(ValueError, match=message):
    generation.DecoderLMGenerator(model, max_length=3, **options)


def test_a_t5_is_not_a_decoder_only_lm():
  with pytest.raises(ValueError, match="needs a decoder-only LM"):
    generation.DecoderLMGenerator(models.create_model("t5_tiny"),
                                  max_length=3)


def test_t5s_decoder_alone_continues_with_its_position_bias():
  """Mesh TensorFlow's LM (T5's decoder, its relative position bias over
  the cache's positions) continues as whole passes choose."""
  lm = models.create_model("t5_tiny_lm", attention="talking_heads",
                           dropout_rate=0.0)
  rng = np.random.default_rng(4)
  lm.set_weights([rng.normal(0.0, 0.5, w.shape).astype(np.float32)
                  for w in lm.get_weights()])
  prompt = np.array([[0, 7, 30], [0, 12, 3]], np.int32)
  want = _greedy_by_whole_passes(lm, prompt, 5)
  assert len(np.unique(want)) > 2
  np.testing.assert_array_equal(
      models.generate(lm, prompt, max_length=5)["tokens"].numpy(), want)
