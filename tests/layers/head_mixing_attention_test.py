"""thattn.layers.HeadMixingAttention: a variant registered outside thattn
by its head mixes (docs/examples/custom_variant.py) as a tf_keras layer,
against its NumPy reference, at its identity, and from its config."""

import numpy as np
import pytest
import tensorflow as tf

from tests.layers import custom_variant_reference as example
from tests.layers import numpy_reference as ref
from thattn import layers
from thattn.core import variants


@pytest.fixture(scope="module", autouse=True)
def registered():
  """The example's variant, registered for this file and removed after."""
  example.import_example()
  yield
  variants.unregister(example.NAME)


def _set_by_name(layer, weights):
  for variable in layer.weights:
    name = variable.name.split(":")[0].split("/", 1)[1]
    if name in weights:  # biases, where the layer has them, stay at zero
      variable.assign(weights[name].astype("float32"))


def _built(rng, memory, **kwargs):
  self_attention = memory == "self"
  n, m, d_x = 5, 5 if self_attention else 7, 8
  d_m = d_x if self_attention else 6
  x, mem = ref.make_inputs(rng, 2, n, m, d_x, d_m, self_attention)
  layer = layers.make_attention(example.NAME, 3, 4, value_dim=5, **kwargs)
  layer(x.astype("float32"), mem.astype("float32"))
  weights = example.random_weights(rng, d_x, d_m, 3, 4, 5, d_x)
  _set_by_name(layer, weights)
  return layer, x, mem, weights


@pytest.mark.parametrize("memory", ["self", "cross"])
def test_the_registered_variant_equals_its_reference(memory):
  rng = np.random.default_rng(3)
  layer, x, mem, weights = _built(rng, memory)
  assert type(layer) is layers.HeadMixingAttention
  layer_mask, causal, ref_mask = ref.make_masks(
      rng, "random_and_causal" if memory == "self" else "random", 2,
      x.shape[1], mem.shape[1])
  got, scores = layer(x.astype("float32"), mem.astype("float32"),
                      attention_mask=layer_mask, use_causal_mask=causal,
                      return_attention_scores=True)
  want, want_scores = example.reference(x, mem, weights, mask=ref_mask)
  ref.assert_close(got.numpy(), want)
  ref.assert_close(scores.numpy(), want_scores)


def test_zero_residuals_are_multi_head_attention():
  x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
  mixing = layers.make_attention(example.NAME, 3, 4)
  multi = layers.MultiHeadAttention(3, 4)
  mixing(x, x)
  multi(x, x)
  # A fresh layer starts its residuals at zero (the Weights' initializer).
  assert all(not np.any(v.numpy()) for v in mixing.variant_weights.values())
  multi.set_weights([v.numpy() for v in mixing.weights
                     if "residual" not in v.name])
  np.testing.assert_allclose(mixing(x, x, use_causal_mask=True).numpy(),
                             multi(x, x, use_causal_mask=True).numpy(),
                             rtol=1e-6, atol=1e-6)


def test_the_config_round_trips():
  rng = np.random.default_rng(1)
  layer, x, mem, _ = _built(rng, "cross", dropout=0.0, use_bias=True)
  config = layer.get_config()
  assert config["variant"] == example.NAME
  copy = layers.HeadMixingAttention.from_config(config)
  copy(x.astype("float32"), mem.astype("float32"))
  copy.set_weights(layer.get_weights())
  np.testing.assert_array_equal(copy(x, mem).numpy(), layer(x, mem).numpy())


@pytest.mark.parametrize("make_layer, message", [
    (lambda: layers.HeadMixingAttention(3, 4, variant="talking_heads"),
     "'talking_heads' is computed by its own layer"),
    (lambda: layers.HeadMixingAttention(3, 4, variant="no_such_variant"),
     "unknown attention variant 'no_such_variant'"),
    (lambda: layers.HeadMixingAttention(3, 4, variant=example.NAME,
                                        query_chunk_size=2),
     "query_chunk_size=2 is not supported"),
    (lambda: layers.HeadMixingAttention(3, 4, variant=example.NAME,
                                        num_key_heads=2),
     r"has no P_l\[h_k, h\], so num_key_heads=2 must equal num_heads=3"),
    (lambda: variants.Variant(name="x", source="s", summary="s",
                              layer="MultiHeadAttention",
                              mix_logits=lambda ops, w, j: j),
     "give either layer"),
    (lambda: variants.Weight("w", ("heads", "batch")),
     r"axes must be sizes from \['key_heads'"),
])
def test_bad_arguments_name_what_is_wrong(make_layer, message):
  with pytest.raises(ValueError, match=message):
    make_layer()


def test_a_model_trains_its_residuals():
  from thattn import models  # pylint: disable=g-import-not-at-top
  model = models.create_model("bert_tiny", attention=example.NAME)
  residuals = [w for w in model.trainable_weights if "residual" in w.name]
  assert len(residuals) == 2 * 2  # two layers of bert_tiny, two each
  ids = tf.constant([[5, 6, 7, 8], [9, 10, 11, 0]])
  inputs = {"input_word_ids": ids, "input_mask": tf.cast(ids > 0, tf.int32),
            "input_type_ids": tf.zeros_like(ids)}
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(inputs)["sequence_output"] ** 2)
  grads = tape.gradient(loss, residuals)
  assert all(g is not None and np.any(g.numpy()) for g in grads)
