"""T5 generation with the decoding caches equals uncached decoding.

The references here run the whole model on the full decoder input at every
step, with no cache, and pick tokens with NumPy.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import models

try:
  from . import model_helpers as helpers
except ImportError:  # tests/models is not a package under Bazel
  import model_helpers as helpers

MAX_LENGTH = 8
ENCODER_TOKENS = np.array([[5, 6, 7, 8, 9, 0],
                           [10, 11, 12, 0, 0, 0],
                           [3, 4, 5, 6, 7, 8]], np.int32)
# Untied embeddings: with tied ones, an untrained tiny T5 mostly repeats its
# input token, which would make equal tokens a weaker test.
UNTIED = dict(tie_embeddings=False, dropout_rate=0.0)
CASES = {variant: dict(attention=variant) for variant in helpers.VARIANTS}
CASES.update({
    "talking_heads_non_square_dynamic": dict(
        attention="talking_heads", num_key_heads=2, num_heads=4,
        num_value_heads=8, dynamic_projections=["x2l", "m2l", "x2w", "m2w"]),
    "one_variant_per_type": dict(encoder_self_attention="dynamic",
                                 decoder_self_attention="talking_heads",
                                 encoder_decoder_attention="general_bilinear"),
})


def _log_softmax(logits):
  logits = logits - logits.max(-1, keepdims=True)
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def uncached_greedy(model, encoder_tokens, max_length, eos_id=1):
  """Greedy decoding by full-sequence passes: (tokens, scores)."""
  batch = encoder_tokens.shape[0]
  decoder_input = np.zeros([batch, max_length], np.int32)
  tokens = np.zeros([batch, max_length], np.int32)
  scores = np.zeros([batch])
  finished = np.zeros([batch], bool)
  for step in range(max_length):
    logits = model({"encoder_input_tokens": encoder_tokens,
                    "decoder_input_tokens": decoder_input}).numpy()[:, step]
    log_probs = _log_softmax(logits.astype(np.float64))
    chosen = np.where(finished, 0, log_probs.argmax(-1))
    scores += np.where(finished, 0.0, log_probs[np.arange(batch), chosen])
    finished |= chosen == eos_id
    tokens[:, step] = chosen
    if step + 1 < max_length:
      decoder_input[:, step + 1] = chosen
  return tokens, scores


def _tiny_t5(**overrides):
  tf.random.set_seed(0)
  return models.create_model("t5_tiny", **{**UNTIED, **overrides})


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
  model = _tiny_t5(**CASES[request.param])
  greedy = models.T5Generator(model, max_length=MAX_LENGTH)
  return model, greedy


def test_cached_greedy_equals_uncached_greedy(case):
  model, greedy = case
  expected_tokens, expected_scores = uncached_greedy(model, ENCODER_TOKENS,
                                                     MAX_LENGTH)
  got = greedy(ENCODER_TOKENS)
  np.testing.assert_array_equal(got["tokens"], expected_tokens)
  # The scores sum the log-probabilities of every step, which depend on
  # every cached key and value: equal tokens alone could hide a cache that
  # is read wrongly but changes no argmax.
  np.testing.assert_allclose(got["scores"], expected_scores, rtol=1e-4)


@pytest.mark.parametrize("variant", ["multi_head", "dynamic"])
def test_beam_search_with_one_beam_is_greedy(variant):
  model = _tiny_t5(attention=variant)
  expected_tokens, expected_scores = uncached_greedy(model, ENCODER_TOKENS,
                                                     MAX_LENGTH)
  got = models.generate(model, ENCODER_TOKENS, max_length=MAX_LENGTH,
                        method="beam", beam_size=1)
  np.testing.assert_array_equal(got["tokens"], expected_tokens)
  np.testing.assert_allclose(got["scores"], expected_scores, rtol=1e-4)


def test_tied_embeddings_and_dropout_decode_the_same_way():
  model = models.create_model("t5_tiny", attention="talking_heads")
  expected_tokens, expected_scores = uncached_greedy(model, ENCODER_TOKENS,
                                                     MAX_LENGTH)
  got = models.generate(model, ENCODER_TOKENS, max_length=MAX_LENGTH)
  np.testing.assert_array_equal(got["tokens"], expected_tokens)
  np.testing.assert_allclose(got["scores"], expected_scores, rtol=1e-4)


def test_end_token_stops_a_sequence():
  model = _tiny_t5(attention="dynamic")
  never_ending, _ = uncached_greedy(model, ENCODER_TOKENS, MAX_LENGTH,
                                    eos_id=-1)
  eos_id = int(never_ending[0, 2])  # make example 0 end at step 2
  expected_tokens, expected_scores = uncached_greedy(
      model, ENCODER_TOKENS, MAX_LENGTH, eos_id=eos_id)
  assert (expected_tokens[0, 3:] == 0).all()
  got = models.generate(model, ENCODER_TOKENS, max_length=MAX_LENGTH,
                        eos_id=eos_id)
  np.testing.assert_array_equal(got["tokens"], expected_tokens)
  np.testing.assert_allclose(got["scores"], expected_scores, rtol=1e-4)


def test_beam_search_with_every_prefix_is_exhaustive():
  vocab, length = 6, 3
  model = _tiny_t5(attention="talking_heads", vocab_size=vocab)
  encoder_tokens = np.array([[2, 3, 4, 5], [5, 4, 0, 0]], np.int32)
  got = models.generate(model, encoder_tokens, max_length=length,
                        method="beam", beam_size=vocab ** (length - 1),
                        length_penalty=0.0)
  # Score every sequence that pads after its end token (1) with one call.
  sequences = np.array([s for s in itertools.product(range(vocab),
                                                     repeat=length)
                        if 1 not in s[:-1] or not any(s[s.index(1) + 1:])],
                       np.int32)
  decoder_input = np.concatenate(
      [np.zeros([len(sequences), 1], np.int32), sequences[:, :-1]], axis=1)
  for example, row in enumerate(encoder_tokens):
    logits = model({"encoder_input_tokens": np.repeat(row[None],
                                                      len(sequences), 0),
                    "decoder_input_tokens": decoder_input}).numpy()
    log_probs = np.take_along_axis(_log_softmax(logits.astype(np.float64)),
                                   sequences[..., None], -1)[..., 0]
    ended = np.cumsum(sequences == 1, axis=1) - (sequences == 1) > 0
    scores = np.where(ended, 0.0, log_probs).sum(-1)
    best = scores.argmax()
    np.testing.assert_array_equal(got["tokens"][example], sequences[best])
    np.testing.assert_allclose(got["scores"][example], scores[best],
                               rtol=1e-4)


def test_sampling():
  model = _tiny_t5(attention="talking_heads")
  greedy, _ = uncached_greedy(model, ENCODER_TOKENS, MAX_LENGTH)
  top_1 = models.generate(model, ENCODER_TOKENS, max_length=MAX_LENGTH,
                          method="sample", top_k=1)
  np.testing.assert_array_equal(top_1["tokens"], greedy)
  first, second = (models.generate(model, ENCODER_TOKENS,
                                   max_length=MAX_LENGTH, method="sample",
                                   temperature=2.0, seed=7)
                   for _ in range(2))
  np.testing.assert_array_equal(first["tokens"], second["tokens"])
  assert not np.array_equal(first["tokens"], greedy)
  assert first["tokens"].numpy().min() >= 0
  assert first["tokens"].numpy().max() < model.get_layer(
      "token_embedding").vocab_size


def test_exported_generator_reloads_with_equal_tokens(tmp_path):
  model = _tiny_t5(attention="dynamic")
  generator = models.T5Generator(model, max_length=MAX_LENGTH)
  expected = generator(ENCODER_TOKENS)
  path = str(tmp_path / "generator")
  tf.saved_model.save(generator, path,
                      signatures={"serving_default": generator.__call__})
  loaded = tf.saved_model.load(path)
  np.testing.assert_array_equal(loaded(ENCODER_TOKENS)["tokens"],
                                expected["tokens"])
  served = loaded.signatures["serving_default"](
      encoder_input_tokens=tf.constant(ENCODER_TOKENS))
  np.testing.assert_array_equal(served["tokens"], expected["tokens"])


def test_generation_from_a_reloaded_keras_model(tmp_path):
  model = _tiny_t5(attention="project_logits")
  expected = models.generate(model, ENCODER_TOKENS, max_length=4)["tokens"]
  path = str(tmp_path / "model.keras")
  model.save(path)
  reloaded = tf_keras.models.load_model(path)
  np.testing.assert_array_equal(
      models.generate(reloaded, ENCODER_TOKENS, max_length=4)["tokens"],
      expected)


def test_generation_from_a_reloaded_tf_format_savedmodel(tmp_path):
  model = _tiny_t5(attention="project_logits")
  inputs, _ = helpers.t5_inputs(model.get_layer("token_embedding").vocab_size)
  reloaded = helpers.savedmodel_round_trip(model, inputs, str(tmp_path))
  np.testing.assert_array_equal(
      models.generate(reloaded, ENCODER_TOKENS, max_length=4)["tokens"],
      models.generate(model, ENCODER_TOKENS, max_length=4)["tokens"])


def test_generation_under_mixed_precision():
  tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    model = _tiny_t5(attention="dynamic")
    got = models.generate(model, ENCODER_TOKENS, max_length=4,
                          method="beam", beam_size=2)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  assert got["tokens"].shape == [3, 4]
  assert np.isfinite(got["scores"].numpy()).all()
