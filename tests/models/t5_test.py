"""Tiny T5: every attention variant trains under mixed precision and
survives a SavedModel round trip; the per-type attention choice and T5's
architecture (no biases, RMSNorm, shared position bias, tied embeddings).

Serving a T5 SavedModel without thattn is checked through the exported
generator (generation_test.py), T5's serving path.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers
from thattn import models

try:
  from . import model_helpers as helpers
except ImportError:  # tests/models is not a package under Bazel
  import model_helpers as helpers

TINY = models.model_config("t5_tiny")


@pytest.fixture(scope="module", params=helpers.VARIANTS)
def trained(request):
  """A tiny T5 of one attention variant under mixed_bfloat16, trained."""
  tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    tf.random.set_seed(0)
    model = models.create_model("t5_tiny", attention=request.param)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  inputs, targets = helpers.t5_inputs(TINY.vocab_size)
  losses = helpers.train(
      model, lambda: helpers.t5_loss(model, inputs, targets))
  return request.param, model, inputs, losses


def test_trains_under_mixed_precision(trained):
  _, model, inputs, losses = trained
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.9 * losses[0], losses
  block = model.get_layer("encoder_block_0")
  assert block.self_attention.compute_dtype == "bfloat16"
  assert block(tf.zeros([1, 3, TINY.d_model])).dtype == tf.bfloat16
  assert model(inputs).dtype == tf.float32  # the LM head's logits
  assert all(weight.dtype == tf.float32 for weight in model.weights)


def test_savedmodel_round_trip(trained, tmp_path):
  variant, model, inputs, _ = trained
  reloaded = helpers.savedmodel_round_trip(model, inputs, str(tmp_path))
  for kind in ("self_attention", "cross_attention"):
    attention = getattr(reloaded.get_layer("decoder_block_1"), kind)
    assert isinstance(attention, layers.AttentionLayer)
    assert attention.get_config() == getattr(
        model.get_layer("decoder_block_1"), kind).get_config(), variant


def test_trains_in_float32():
  tf.random.set_seed(0)
  model = models.create_model("t5_tiny", attention="talking_heads")
  inputs, targets = helpers.t5_inputs(TINY.vocab_size)
  losses = helpers.train(
      model, lambda: helpers.t5_loss(model, inputs, targets))
  assert losses[-1] < 0.9 * losses[0], losses


def test_mixed_float16_forward_pass_matches_float32():
  inputs, _ = helpers.t5_inputs(TINY.vocab_size)
  reference = models.create_model("t5_tiny", attention="dynamic")
  expected = reference(inputs)
  tf_keras.mixed_precision.set_global_policy("mixed_float16")
  try:
    model = models.create_model("t5_tiny", attention="dynamic")
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  model.set_weights(reference.get_weights())
  helpers.assert_outputs_close(model(inputs), expected, tolerance=5e-2)


def test_get_config_round_trip_with_a_variant_per_attention_type():
  model = models.create_model(
      "t5_tiny", encoder_self_attention="dynamic",
      decoder_self_attention={"variant": "talking_heads", "num_key_heads": 2,
                              "num_value_heads": 8},
      encoder_decoder_attention="general_bilinear")
  inputs, _ = helpers.t5_inputs(TINY.vocab_size)
  clone = tf_keras.Model.from_config(model.get_config())
  assert clone.get_config() == model.get_config()
  clone.set_weights(model.get_weights())
  helpers.assert_outputs_close(clone(inputs), model(inputs))


def _projection_owners(model, token):
  """(block, attention) names of the weights whose name contains `token`."""
  return sorted(tuple(weight.name.split("/")[:2]) for weight in model.weights
                if token in weight.name)


@pytest.mark.parametrize("kind, block, attention", [
    ("encoder_self_attention", "encoder_block", "self_attention"),
    ("decoder_self_attention", "decoder_block", "self_attention"),
    ("encoder_decoder_attention", "decoder_block", "cross_attention"),
])
def test_talking_heads_in_one_attention_type_only(kind, block, attention):
  # The paper's Table 4: talking heads in one type, multi-head elsewhere.
  model = models.create_model("t5_tiny", num_layers=3,
                              **{kind: "talking_heads"})
  expected = [(f"{block}_{index}", attention) for index in range(3)]
  assert _projection_owners(model, "pre_softmax_projection") == expected
  assert _projection_owners(model, "post_softmax_projection") == expected
  multi_head = models.create_model("t5_tiny", num_layers=3)
  assert model.count_params() - multi_head.count_params() == 3 * 2 * 4 * 4


def test_no_biases_and_one_position_bias_per_stack():
  model = models.create_model("t5_tiny", attention="talking_heads",
                              decoder_self_attention={"num_heads": 8})
  names = [weight.name for weight in model.weights]
  assert not [name for name in names
              if "bias" in name and "relative_attention_bias" not in name]
  biases = {weight.name.split("/")[0]: weight.shape.as_list()
            for weight in model.weights
            if "relative_attention_bias" in weight.name}
  # Bidirectional in the encoder, unidirectional in the decoder, each with
  # the softmax heads h of its stack's self-attention.
  assert biases == {"encoder_position_bias": [8, 4],
                    "decoder_position_bias": [8, 8]}
  assert model.get_layer("encoder_position_bias").relative_position_bias \
      .bidirectional
  assert not model.get_layer("decoder_position_bias").relative_position_bias \
      .bidirectional


def test_rms_norm_has_no_mean_and_no_bias():
  norm = models.RMSNorm(epsilon=1e-6)
  x = np.array([[[1.0, 2.0, 3.0, 6.0]]], np.float32)
  got = norm(x)
  assert [weight.name.split("/")[-1] for weight in norm.weights] == [
      "scale:0"]
  expected = x / np.sqrt(np.mean(x ** 2) + 1e-6)  # the mean is not removed
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_tied_logits_are_scaled_embedding_scores():
  model = models.create_model("t5_tiny", dropout_rate=0.0)
  inputs, _ = helpers.t5_inputs(TINY.vocab_size)
  hidden = tf_keras.Model(model.inputs,
                          model.get_layer("decoder_output").output)(inputs)
  table = model.get_layer("token_embedding").embeddings
  expected = tf.einsum("bnd,td->bnt", hidden * TINY.d_model ** -0.5, table)
  helpers.assert_outputs_close(model(inputs), expected)
  untied = models.create_model("t5_tiny", tie_embeddings=False)
  assert untied.count_params() - model.count_params() == (
      TINY.vocab_size * TINY.d_model)


def test_gated_gelu_feed_forward_adds_a_gate():
  relu = models.create_model("t5_tiny")
  gated = models.create_model("t5_tiny", activation="gelu_approximate",
                              gated_feed_forward=True)
  # One more [d_model, d_ff] kernel in each of the 2 + 2 feed-forwards.
  assert gated.count_params() - relu.count_params() == 4 * 32 * 64


def test_decoder_is_causal_and_encoder_padding_is_ignored():
  model = models.create_model("t5_tiny", attention="dynamic")
  inputs, _ = helpers.t5_inputs(TINY.vocab_size)
  logits = model(inputs)
  later = dict(inputs)
  later["decoder_input_tokens"] = tf.tensor_scatter_nd_update(
      inputs["decoder_input_tokens"], [[0, 5], [1, 5]], [7, 7])
  helpers.assert_outputs_close(model(later)[:, :5], logits[:, :5])
  padded = dict(inputs)  # example 1 pads its last two encoder positions
  padded["encoder_input_tokens"] = tf.tensor_scatter_nd_update(
      inputs["encoder_input_tokens"], [[1, 6], [1, 7]], [0, 0])
  helpers.assert_outputs_close(model(padded), logits)


def test_dropout_is_active_only_in_training():
  model = models.create_model("t5_tiny", dropout_rate=0.5)
  inputs, _ = helpers.t5_inputs(TINY.vocab_size)
  helpers.assert_outputs_close(model(inputs), model(inputs, training=False))
  assert not np.allclose(model(inputs, training=True),
                         model(inputs, training=False))


def test_every_weight_declares_its_logical_axes():
  model = models.create_model("t5_tiny", attention="dynamic",
                              gated_feed_forward=True)
  declared = helpers.declared_logical_axes(model)
  for weight in model.weights:
    assert len(declared[weight.name]) == weight.shape.rank, weight.name
  assert declared["token_embedding/embeddings:0"] == ("vocab", "d_model")
  assert declared["decoder_block_0/feed_forward/gate/kernel:0"] == (
      "d_model", "d_ff")
