"""T5 decoding in Keras 3 on one backend: the tf_keras decode, token for
token.

Run by `decoding_test.py` in a process per backend (KERAS_BACKEND set),
with THATTN_DECODING_EXCHANGE naming a folder where the parent left, per
case, a tf_keras T5's weights, encoder inputs and its greedy decode
(`thattn.models.generate`). Each check builds the Keras 3 model of the same
preset, sets those weights and decodes with `thattn.keras3.models.
generation.T5Generator`: the same tokens, and scores within float32
rounding. The decoder-only LMs' cached decoding (`run_decoder` with the
caches) equals their whole pass on the backend; their beam search is
tf_keras's (the parent's `lm_tiny_beam.lm.npz`), and their sampler draws
from the distribution a NumPy transcription gives
(tests/models/sampling_reference.py).
"""

import os
import pathlib

import keras
from keras import ops
import numpy as np
import pytest

from tests.models import sampling_reference
from thattn.keras3 import models
from thattn.keras3.models import generation

EXCHANGE = pathlib.Path(os.environ.get("THATTN_DECODING_EXCHANGE", "."))


def cases():
  return sorted(path.name.split(".")[0]
                for path in EXCHANGE.glob("*.tf_keras.npz"))


@pytest.mark.parametrize("case", cases())
def test_the_greedy_decode_equals_tf_keras_s(case):
  saved = np.load(EXCHANGE / f"{case}.tf_keras.npz", allow_pickle=False)
  model = models.create_model(str(saved["preset"]),
                              attention=str(saved["attention"]),
                              tie_embeddings=bool(saved["tied"]))
  model.set_weights([saved[f"weight_{index}"]
                     for index in range(len(model.weights))])
  max_length = saved["tokens"].shape[1]
  generator = generation.T5Generator(model, max_length=max_length)
  decoded = generator(saved["encoder_tokens"])
  np.testing.assert_array_equal(ops.convert_to_numpy(decoded["tokens"]),
                                saved["tokens"])
  np.testing.assert_allclose(ops.convert_to_numpy(decoded["scores"]),
                             saved["scores"], rtol=1e-5)
  # Another batch of the same shape, under changed weights, reuses the
  # compiled decode.
  model.set_weights([w * 0.5 for w in model.get_weights()])
  generator(saved["encoder_tokens"][::-1])
  if keras.backend.backend() == "jax":
    # One compile for the whole decode (the steps a loop inside it), not
    # one per step, per batch or per weight update.
    assert generator.jitted._cache_size() == 1  # pylint: disable=protected-access
    text = generator.jitted.lower([v.value for v in model.variables],
                                  saved["encoder_tokens"]).as_text()
    assert text.count("stablehlo.while") == 1


def test_a_model_without_an_encoder_is_refused_by_name():
  model = models.create_model("t5_tiny", stacks="decoder")
  with pytest.raises(ValueError, match="encoder and a decoder"):
    generation.T5Generator(model, max_length=3)


@pytest.mark.parametrize("preset", ["lm_tiny", "gpt2_tiny", "pythia_tiny"])
def test_a_decoder_lm_decodes_with_its_caches_as_the_whole_pass(preset):
  """Two tokens a call at their offsets: the learned or rotary positions
  and the shared key and value heads read the caches as the whole pass
  reads the sequence."""
  from thattn.models import wiring  # pylint: disable=g-import-not-at-top
  model = models.create_model(preset, attention="talking_heads")
  rng = np.random.default_rng(0)
  model.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                     for w in model.get_weights()])
  tokens = rng.integers(0, 128, size=(2, 6)).astype("int32")
  whole = ops.convert_to_numpy(model({"decoder_input_tokens": tokens}))
  parts = wiring.decoder_layers(model)
  caches = [block.initial_cache(2, 6) for block in parts.blocks]
  steps = []
  for step in range(0, 6, 2):
    logits, caches = wiring.run_decoder(
        parts, tokens[:, step:step + 2], None, None, training=False,
        caches=caches, decode_step=step, max_length=6)
    steps.append(ops.convert_to_numpy(logits))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=0,
                             atol=1e-5 * np.abs(whole).max())


def _greedy_by_whole_passes(model, prompt, steps):
  """Greedy decoding by definition: the argmax of a whole pass over the
  prompt and the tokens so far, once per new token (no caches)."""
  tokens = np.asarray(prompt)
  for _ in range(steps):
    logits = ops.convert_to_numpy(model({"decoder_input_tokens": tokens}))
    tokens = np.concatenate(
        [tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], axis=1)
  return tokens[:, np.asarray(prompt).shape[1]:]


@pytest.mark.parametrize("preset", ["lm_tiny", "gpt2_tiny", "pythia_tiny",
                                    "t5_tiny_lm"])
def test_a_decoder_lm_continues_its_prompt_greedily(preset):
  """Also T5's decoder alone, its position bias over the cache."""
  model = models.create_model(preset, attention="talking_heads",
                              dropout_rate=0.0)
  rng = np.random.default_rng(2)
  model.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                     for w in model.get_weights()])
  prompt = rng.integers(0, 64, size=(2, 3)).astype("int32")
  decoded = models.generate(model, prompt, max_length=5)
  want = _greedy_by_whole_passes(model, prompt, 5)
  assert len(np.unique(want)) > 2  # not one token over and over
  np.testing.assert_array_equal(ops.convert_to_numpy(decoded["tokens"]),
                                want)
  # The end token stops a continuation, padding after it.
  eos = int(want[0, 1])
  ended = generation.DecoderLMGenerator(model, max_length=5, eos_id=eos,
                                        pad_id=0)(prompt)
  row = ops.convert_to_numpy(ended["tokens"])[0]
  first = list(want[0]).index(eos)
  assert list(row[:first + 1]) == list(want[0, :first + 1])
  assert set(row[first + 1:]) <= {0}


@pytest.mark.parametrize("preset", ["lm_tiny", "t5_tiny_lm"])
def test_a_prefix_lm_continues_its_prefix_as_the_whole_passes_do(preset):
  """The prompt is the prefix, attending both ways, in the cache-filling
  call as in each whole pass."""
  model = models.create_model(preset, prefix_lm=True, dropout_rate=0.0)
  rng = np.random.default_rng(3)
  model.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                     for w in model.get_weights()])
  prompt = rng.integers(0, 64, size=(2, 4)).astype("int32")
  tokens = prompt
  for _ in range(4):
    region = (np.arange(tokens.shape[1]) < 4).astype("int32")
    logits = ops.convert_to_numpy(model({
        "decoder_input_tokens": tokens,
        "decoder_causal_attention": np.tile(region, (2, 1))}))
    tokens = np.concatenate(
        [tokens, logits[:, -1].argmax(-1)[:, None].astype("int32")], axis=1)
  assert len(np.unique(tokens[:, 4:])) > 1
  decoded = models.generate(model, prompt, max_length=4)
  np.testing.assert_array_equal(ops.convert_to_numpy(decoded["tokens"]),
                                tokens[:, 4:])


def test_beam_search_equals_tf_keras_s():
  saved = np.load(EXCHANGE / "lm_tiny_beam.lm.npz", allow_pickle=False)
  model = models.create_model("lm_tiny", attention="talking_heads",
                              dropout_rate=0.0)
  model.set_weights([saved[f"weight_{index}"]
                     for index in range(len(model.weights))])
  decoded = models.generate(model, saved["prompt"],
                            max_length=saved["tokens"].shape[1],
                            method="beam", beam_size=3,
                            eos_id=int(saved["eos"]), pad_id=0)
  np.testing.assert_array_equal(ops.convert_to_numpy(decoded["tokens"]),
                                saved["tokens"])
  np.testing.assert_allclose(ops.convert_to_numpy(decoded["scores"]),
                             saved["scores"], rtol=1e-5)
  assert int(saved["eos"]) in saved["tokens"]  # a beam finished


@pytest.fixture(scope="module")
def sampled_lm():
  model = models.create_model("lm_tiny", attention="talking_heads",
                              dropout_rate=0.0)
  rng = np.random.default_rng(4)
  model.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                     for w in model.get_weights()])
  return model


@pytest.mark.parametrize("temperature, top_k, top_p",
                         [(1.5, 0, 1.0), (0.8, 8, 0.7)])
def test_sampling_draws_from_the_filtered_distribution(
    sampled_lm, temperature, top_k, top_p):
  draws = 2000
  prompt = np.array([[5, 17, 99, 3]], np.int32)
  logits = ops.convert_to_numpy(
      sampled_lm({"decoder_input_tokens": prompt}))[0, -1].astype("float64")
  log_probs = logits - logits.max() - np.log(
      np.exp(logits - logits.max()).sum())
  want = sampling_reference.filtered_distribution(
      log_probs, temperature, top_k or log_probs.size, top_p)
  generator = generation.DecoderLMGenerator(
      sampled_lm, max_length=1, method="sample", temperature=temperature,
      top_k=top_k, top_p=top_p, seed=1)
  tokens = ops.convert_to_numpy(
      generator(np.repeat(prompt, draws, axis=0))["tokens"])[:, 0]
  sampling_reference.assert_frequencies_match(tokens, want)


def test_sampling_is_seeded_and_top_k_one_is_greedy(sampled_lm):
  prompt = np.array([[5, 17, 99, 3], [64, 2, 2, 40]], np.int32)

  def sampler(seed, **options):
    return generation.DecoderLMGenerator(sampled_lm, max_length=5,
                                         method="sample", seed=seed,
                                         **options)
  first = sampler(3)
  draws = [ops.convert_to_numpy(first(prompt)["tokens"]) for _ in range(2)]
  np.testing.assert_array_equal(
      ops.convert_to_numpy(sampler(3)(prompt)["tokens"]), draws[0])
  assert not np.array_equal(draws[0], draws[1])  # each call draws anew
  greedy = _greedy_by_whole_passes(sampled_lm, prompt, 5)
  np.testing.assert_array_equal(
      ops.convert_to_numpy(sampler(5, top_k=1)(prompt)["tokens"]), greedy)
  np.testing.assert_array_equal(
      ops.convert_to_numpy(sampler(5, top_p=1e-6)(prompt)["tokens"]), greedy)
