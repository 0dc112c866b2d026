"""A prefix LM (`prefix_lm=True` on a `DecoderConfig` or a decoder-only
`T5Config`) in tf_keras: its mask is a NumPy transcription's, its prefix
attends both ways and the rest causally, it is the causal LM where the
prefix is empty, and decoding with the caches from a prompt (the prefix)
equals the whole pass. (The task: tests/tasks/prefix_lm_test.py; Keras 3:
tests/keras3/decoding_checks.py.)"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import models
from thattn.models import wiring
from thattn.ops import masks
from thattn.ops import tf_ops

_TINY = dict(vocab_size=64, d_model=32, num_layers=2, d_ff=48, num_heads=4)
SHAPES = {
    "llama": ("lm_tiny", dict(vocab_size=64)),
    "gpt2": ("gpt2", dict(_TINY, max_position_embeddings=16)),
    "pythia": ("pythia_160m", _TINY),
    "talking_heads": ("lm_tiny", dict(vocab_size=64,
                                      attention="talking_heads",
                                      num_key_heads=6, num_value_heads=2)),
    "t5": ("t5_tiny_lm", dict(vocab_size=64)),
}
_PREFIX = 5  # the prefix region of the 8-token rows below


def _model(shape, prefix_lm=True):
  preset, overrides = SHAPES[shape]
  tf_keras.utils.set_random_seed(0)
  model = models.create_model(preset, **overrides, prefix_lm=prefix_lm,
                              dropout_rate=0.0)
  model.set_weights([np.random.default_rng(index).normal(
      0.0, 0.3, weight.shape).astype(np.float32)
                     for index, weight in enumerate(model.get_weights())])
  return model


def _tokens(vocab, length=8):
  return np.random.default_rng(1).integers(0, vocab, size=(2, length),
                                           dtype=np.int32)


def _region(tokens, prefix=_PREFIX):
  region = np.zeros_like(tokens)
  region[:, :prefix] = 1
  return region


def _logits(model, tokens, region):
  return model({"decoder_input_tokens": tf.constant(tokens),
                "decoder_causal_attention": tf.constant(region)}).numpy()


def test_the_mask_is_the_numpy_transcriptions():
  region = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
                    np.int32)
  n = region.shape[1]
  want = np.array([[[j <= i or (row[i] and row[j]) for j in range(n)]
                    for i in range(n)] for row in region])
  got = masks.prefix_lm_mask(tf_ops.TF_OPS, tf.constant(region)).numpy()
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_prefix_attends_both_ways_and_the_rest_causally(shape):
  model = _model(shape)
  vocab = model.output.shape[-1]
  tokens = _tokens(vocab)
  before = _logits(model, tokens, _region(tokens))
  in_prefix = tokens.copy()
  in_prefix[:, 3] = (in_prefix[:, 3] + 1) % vocab
  after = _logits(model, in_prefix, _region(tokens))
  assert not np.allclose(after[:, :3], before[:, :3], atol=1e-3)
  after_prefix = tokens.copy()
  after_prefix[:, 6] = (after_prefix[:, 6] + 1) % vocab
  after = _logits(model, after_prefix, _region(tokens))
  np.testing.assert_allclose(after[:, :6], before[:, :6], rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("shape", ["llama", "gpt2"])
def test_with_no_prefix_it_is_the_causal_lm(shape):
  """The same weights; T5's differs by its bidirectional position bias."""
  model = _model(shape)
  causal = models.create_model(SHAPES[shape][0], **SHAPES[shape][1],
                               dropout_rate=0.0)
  causal.set_weights(model.get_weights())
  tokens = _tokens(model.output.shape[-1])
  np.testing.assert_allclose(
      _logits(model, tokens, np.zeros_like(tokens)),
      causal({"decoder_input_tokens": tf.constant(tokens)}).numpy(),
      rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_cached_decoding_from_the_prefix_equals_the_whole_pass(shape):
  """The prompt (the prefix) fills the caches in one call under its
  mask, then one token a call: the logits are the whole pass's."""
  model = _model(shape)
  tokens = _tokens(model.output.shape[-1])
  whole = _logits(model, tokens, _region(tokens))
  parts = wiring.decoder_layers(model)
  length = tokens.shape[1]
  caches = [block.initial_cache(2, length) for block in parts.blocks]
  prompt_mask = tf.ones([2, _PREFIX, _PREFIX], tf.bool)
  logits, caches = wiring.run_decoder(
      parts, tf.constant(tokens[:, :_PREFIX]), None, None, training=False,
      caches=caches, decode_step=0, max_length=length,
      attention_mask=prompt_mask)
  steps = [logits.numpy()]
  for step in range(_PREFIX, length):
    logits, caches = wiring.run_decoder(
        parts, tf.constant(tokens[:, step:step + 1]), None, None,
        training=False, caches=caches, decode_step=step, max_length=length)
    steps.append(logits.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def test_generate_continues_the_prefix_as_the_whole_pass_does():
  model = _model("llama")
  prompt = _tokens(64)[:, :_PREFIX]
  out = models.generate(model, prompt, max_length=3)
  sequence, score = prompt, 0.0
  for _ in range(3):
    logits = _logits(model, sequence, _region(sequence))[:, -1]
    log_probs = tf.nn.log_softmax(logits).numpy()
    chosen = log_probs.argmax(-1).astype(np.int32)
    score += log_probs[np.arange(2), chosen]
    sequence = np.concatenate([sequence, chosen[:, None]], axis=1)
  np.testing.assert_array_equal(out["tokens"].numpy(), sequence[:, _PREFIX:])
  np.testing.assert_allclose(out["scores"].numpy(), score, rtol=1e-5)


def test_the_model_rebuilds_and_prefix_lm_needs_one_stack():
  model = _model("t5")
  again = tf_keras.Model.from_config(model.get_config())
  again.set_weights(model.get_weights())
  tokens = _tokens(64)
  np.testing.assert_allclose(_logits(again, tokens, _region(tokens)),
                             _logits(model, tokens, _region(tokens)),
                             rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="prefix_lm=True is a decoder-only "
                     "model's; it needs stacks='decoder', got "
                     "'encoder_decoder'"):
    models.model_config("t5_tiny", prefix_lm=True)
