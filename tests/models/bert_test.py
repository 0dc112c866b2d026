"""Tiny BERT and ALBERT: every attention variant trains under mixed
precision and survives a SavedModel round trip; get_config round trips,
padding, ALBERT's sharing and factorization, relative positions."""

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

VOCAB = models.model_config("bert_tiny").vocab_size


@pytest.fixture(scope="module", params=helpers.VARIANTS)
def trained(request):
  """A tiny BERT of one attention variant under mixed_bfloat16, trained."""
  tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    tf.random.set_seed(0)
    model = models.create_model("bert_tiny", attention=request.param)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  inputs = helpers.bert_inputs(VOCAB)
  losses = helpers.train(model, lambda: helpers.bert_loss(model, inputs))
  return request.param, model, inputs, losses


def test_trains_under_mixed_precision(trained):
  _, model, inputs, losses = trained
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.9 * losses[0], losses
  assert model(inputs)["sequence_output"].dtype == tf.bfloat16
  assert all(weight.dtype == tf.float32 for weight in model.weights)


def test_savedmodel_round_trip(trained, tmp_path):
  variant, model, inputs, _ = trained
  reloaded = helpers.savedmodel_round_trip(model, inputs, str(tmp_path))
  attention = reloaded.get_layer("block_0").attention
  assert isinstance(attention, layers.AttentionLayer)
  assert attention.get_config() == model.get_layer(
      "block_0").attention.get_config(), variant


@pytest.mark.parametrize("preset", ["bert_tiny", "albert_tiny"])
def test_trains_in_float32(preset):
  tf.random.set_seed(0)
  model = models.create_model(preset, attention="talking_heads")
  inputs = helpers.bert_inputs(VOCAB)
  losses = helpers.train(model, lambda: helpers.bert_loss(model, inputs))
  # ALBERT's one shared layer starts slower.
  assert losses[-1] < (0.9 if preset == "bert_tiny" else 0.95) * losses[0], (
      losses)


@pytest.mark.parametrize("preset", ["bert_tiny", "albert_tiny"])
def test_get_config_round_trip(preset):
  model = models.create_model(preset, attention="talking_heads",
                              num_key_heads=2, num_value_heads=3,
                              dynamic_projections=["x2l", "m2w"],
                              position_embedding="relative")
  inputs = helpers.bert_inputs(VOCAB)
  expected = model(inputs)
  clone = tf_keras.Model.from_config(model.get_config())
  assert clone.get_config() == model.get_config()
  clone.set_weights(model.get_weights())
  helpers.assert_outputs_close(clone(inputs), expected)


def test_saved_model_serves_without_thattn_classes(tmp_path):
  model = models.create_model("bert_tiny", attention="dynamic",
                              position_embedding="relative")
  inputs = helpers.bert_inputs(VOCAB)
  path = str(tmp_path)
  # With traced layers, plain TensorFlow serves the SavedModel.
  helpers.savedmodel_round_trip(model, inputs, path, save_traces=True)
  served = tf.saved_model.load(path).signatures["serving_default"](**inputs)
  helpers.assert_outputs_close(served, model(inputs))


def test_padding_and_the_pooler():
  model = models.create_model("bert_tiny", dropout_rate=0.0)
  inputs = helpers.bert_inputs(VOCAB)
  outputs = model(inputs)
  assert outputs["sequence_output"].shape == [2, 8, 32]
  assert outputs["pooled_output"].shape == [2, 32]
  # Padded positions (input_mask 0) are never attended: changing their
  # tokens leaves the real positions and the pooled output unchanged.
  changed = dict(inputs)
  changed["input_word_ids"] = tf.tensor_scatter_nd_update(
      inputs["input_word_ids"], [[1, 6], [1, 7]], [5, 9])
  again = model(changed)
  helpers.assert_outputs_close(again["sequence_output"][:, :6],
                               outputs["sequence_output"][:, :6])
  helpers.assert_outputs_close(again["pooled_output"],
                               outputs["pooled_output"])


def test_albert_shares_one_layer_and_factorizes_the_embedding():
  two = models.create_model("albert_tiny")
  four = models.create_model("albert_tiny", num_layers=4)
  assert two.count_params() == four.count_params()
  assert two.get_layer("word_embeddings").embeddings.shape == [VOCAB, 16]
  assert two.get_layer("embedding_projection").kernel.shape == [16, 32]
  unshared = models.create_model("albert_tiny", share_layers=False,
                                 num_layers=4)
  block = sum(weight.shape.num_elements() for weight in
              two.get_layer("shared_block").weights)
  assert unshared.count_params() - four.count_params() == 3 * block


def test_relative_positions_replace_the_position_table():
  absolute = models.create_model("bert_tiny")
  relative = models.create_model("bert_tiny", position_embedding="relative")
  names = [weight.name for weight in relative.weights]
  assert not any("position_embedding" in name for name in names)
  biases = [weight for weight in relative.weights
            if "relative_attention_bias" in weight.name]
  assert [bias.shape for bias in biases] == [[32, 4]]  # one for all layers
  assert relative.count_params() - absolute.count_params() == (
      32 * 4 - 64 * 32)


def test_weights_declare_logical_axes_but_norms_and_small_tables():
  model = models.create_model("albert_tiny", attention="talking_heads",
                              share_layers=False)
  declared = helpers.declared_logical_axes(model)
  undeclared = sorted(weight.name.split("/")[-2] for weight in model.weights
                      if weight.name not in declared)
  # LayerNorms, the type table and ALBERT's E -> d_model projection stay
  # replicated; everything else names its axes.
  assert set(undeclared) == {"embedding_norm", "attention_norm",
                             "feed_forward_norm", "type_embeddings",
                             "embedding_projection"}, undeclared
  assert declared["word_embeddings/embeddings:0"] == ("vocab", "d_model")
  assert declared["block_1/feed_forward/input/kernel:0"] == ("d_model", "d_ff")
