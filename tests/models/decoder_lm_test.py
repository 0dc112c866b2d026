"""The decoder-only LM (`DecoderConfig`, `build_decoder_lm`) in tf_keras:
causal, decoded with the attention layers' caches as the whole pass
computes it, in its three shapes, its config saved and rebuilt, and bad
configs named. (Its logits against transformers':
tests/models/hugging_face_decoders_test.py; its published counts:
tests/models/parameter_count_test.py.)"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import models
from thattn.models import wiring

_TINY = dict(vocab_size=64, d_model=32, num_layers=2, d_ff=48, num_heads=4)
SHAPES = {
    "llama": ("lm_tiny", {}),
    "gpt2": ("gpt2", dict(_TINY, max_position_embeddings=16)),
    "pythia": ("pythia_160m", _TINY),
    "talking_heads": ("lm_tiny", dict(attention="talking_heads",
                                      num_key_heads=6, num_value_heads=2)),
    # DCMHA, q/k norm, and a local first layer whose window (3) is
    # shorter than the sequence, then a global one.
    "dcformer": ("dcformer_2p8b", dict(_TINY, sliding_window=3)),
}


def _model(shape):
  preset, overrides = SHAPES[shape]
  tf_keras.utils.set_random_seed(0)
  model = models.create_model(preset, **overrides)
  # Norm scales and biases off their start, so every weight shows.
  model.set_weights([np.random.default_rng(index).normal(
      0.0, 0.3, weight.shape).astype(np.float32)
                     for index, weight in enumerate(model.get_weights())])
  return model


def _tokens(vocab, length=8):
  return np.random.default_rng(1).integers(0, vocab, size=(2, length),
                                           dtype=np.int32)


def _logits(model, tokens):
  return model({"decoder_input_tokens": tf.constant(tokens)}).numpy()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_position_sees_only_the_past(shape):
  model = _model(shape)
  tokens = _tokens(model.output.shape[-1])
  changed = tokens.copy()
  changed[:, 5:] = (changed[:, 5:] + 1) % model.output.shape[-1]
  before, after = _logits(model, tokens), _logits(model, changed)
  np.testing.assert_allclose(after[:, :5], before[:, :5], rtol=1e-6,
                             atol=1e-6)
  assert not np.allclose(after[:, 5:], before[:, 5:], atol=1e-3)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_cached_decoding_equals_the_whole_pass(shape):
  """Two tokens a call, at their offsets: learned positions, rotary
  positions and shared key and value heads read the cache as the whole
  pass reads the sequence."""
  model = _model(shape)
  tokens = _tokens(model.output.shape[-1])
  whole = _logits(model, tokens)
  parts = wiring.decoder_layers(model)
  caches = [block.initial_cache(2, tokens.shape[1])
            for block in parts.blocks]
  steps = []
  for step in range(0, tokens.shape[1], 2):
    logits, caches = wiring.run_decoder(
        parts, tf.constant(tokens[:, step:step + 2]), None, None,
        training=False, caches=caches, decode_step=step,
        max_length=tokens.shape[1])
    steps.append(logits.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def test_the_shapes_differ_where_their_papers_do():
  """The parallel residual is another function of the same weights."""
  model = _model("pythia")
  preset, overrides = SHAPES["pythia"]
  sequential = models.create_model(preset, **overrides,
                                   parallel_residual=False)
  sequential.set_weights(model.get_weights())
  tokens = _tokens(64)
  assert not np.allclose(_logits(sequential, tokens), _logits(model, tokens),
                         atol=1e-3)


def test_the_model_rebuilds_from_its_config():
  model = _model("pythia")
  again = tf_keras.Model.from_config(model.get_config())
  again.set_weights(model.get_weights())
  tokens = _tokens(64)
  np.testing.assert_allclose(_logits(again, tokens), _logits(model, tokens),
                             rtol=1e-6, atol=1e-6)
  block = again.get_layer("decoder_block_0")
  assert (block.norm, block.parallel_residual) == ("layer_norm", True)


def test_the_layers_take_the_configs_settings():
  model = models.create_model("lm_tiny", tie_embeddings=False)
  attention = model.get_layer("decoder_block_0").self_attention
  assert attention.num_key_value_heads == 2
  assert attention.rotary_base == 10000.0
  assert "lm_head" in [layer.name for layer in model.layers]
  dcformer = models.create_model("dcformer_2p8b", **_TINY)
  assert [dcformer.get_layer(f"decoder_block_{index}").self_attention
          .sliding_window for index in (0, 1)] == [257, None]  # "LG"
  assert dcformer.get_layer(
      "decoder_block_1").self_attention.query_key_norm_epsilon == 1e-6
  gpt2 = models.create_model("gpt2", **_TINY)
  assert gpt2.get_layer("position_embedding").max_length == 1024
  assert gpt2.get_layer("decoder_block_0").self_attention.rotary_base is None


@pytest.mark.parametrize("overrides, message", [
    (dict(position_embedding="alibi"), "position_embedding"),
    (dict(norm="batch_norm"), "norm"),
    (dict(position_embedding="learned", rotary_pct=0.5),
     "need position_embedding='rotary'"),
    (dict(rotary_pct=0.1), "rotates 0 entries"),
    (dict(rotary_scaling={"rope_type": "yarn"}), "rope_type='yarn'"),
    (dict(num_key_value_heads=3), "num_key_value_heads=3 must divide"),
    (dict(attention="general_bilinear"), "no queries and keys to turn"),
    (dict(position_embedding="learned", attention="general_bilinear",
          num_key_value_heads=2),
     "no key or value heads to share"),
    (dict(sliding_window=4, window_pattern="LM"),
     "window_pattern='LM' must be a non-empty string of 'L'"),
    (dict(sliding_window=0), "sliding_window must be a positive integer"),
    (dict(query_key_epsilon=1e-6), "it needs query_key_norm=True"),
])
def test_bad_configs_are_named(overrides, message):
  with pytest.raises(ValueError, match=message):
    models.model_config("lm_tiny", **overrides)


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_table_is_gathered_from_its_value(tied):
  """A ResourceGather would put the tied table in copy-on-read mode, and
  every read of it for the logits would copy it whole (GPT-2's decoding
  step: 108 ms instead of 7; benchmarks/RESULTS.md). A table only looked
  up keeps ResourceGather."""
  model = models.create_model("gpt2", **_TINY, tie_embeddings=tied)
  graph = tf.function(lambda tokens: model(
      {"decoder_input_tokens": tokens})).get_concrete_function(
          tf.TensorSpec([1, 4], tf.int32)).graph
  ops = {op.type for op in graph.get_operations()}
  assert ("ResourceGather" in ops) == (not tied), sorted(ops)
  assert "GatherV2" in ops or not tied
