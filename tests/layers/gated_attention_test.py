"""The output gate of gated attention (Qiu et al., 2025) on the tf_keras
layers: `use_gate` (element-wise, Keras 3's argument) and `headwise_gate`
(one gate per head), against the NumPy reference, in decoding, through a
config, and beside the Keras 3 layers (their three backends are checked in
tests/keras3/conventions_checks.py)."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers
from thattn.core import variants
from thattn.layers import keras_interop

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

LAYERS = {
    "multi_head": (lambda **kw: layers.MultiHeadAttention(3, 4, value_dim=5,
                                                          **kw),
                   ref.multi_head_attention),
    "talking_heads": (lambda **kw: layers.TalkingHeadsAttention(
        3, 4, value_dim=5, num_key_heads=2, num_value_heads=4, **kw),
                      ref.talking_heads_attention),
    "general_bilinear": (lambda **kw: layers.GeneralBilinearAttention(
        3, **kw), ref.general_bilinear_attention),
}


def _inputs(rng, n=5):
  x, mem = ref.make_inputs(rng, 2, n, n, 8, 8, self_attention=True)
  return x.astype("float32"), mem.astype("float32")


@pytest.mark.parametrize("headwise", [False, True], ids=["element", "head"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_gate_equals_the_reference(name, headwise):
  make_layer, reference = LAYERS[name]
  rng = np.random.default_rng(7)
  x, mem = _inputs(rng)
  mask = rng.random((2, 5, 5)) < 0.7
  mask[:, np.arange(5), np.arange(5)] = True  # no fully masked row
  layer = make_layer(use_gate=True, headwise_gate=headwise)
  layer(x, mem)
  heads, width = layer.gate_shape()
  gate_shape = (8, heads) if headwise else (8, heads, width)
  assert tuple(layer.weights[-1].shape) == gate_shape  # made last
  ref.randomize_weights(layer, rng)
  weights = ref.reference_kwargs(layer)
  got = layer(x, mem, attention_mask=mask, use_causal_mask=True)
  want = reference(x, mem, mask=mask & ref.causal_mask(2, 5, 5), **weights)
  ref.assert_close(got.numpy(), want)
  ungated = reference(x, mem, mask=mask & ref.causal_mask(2, 5, 5),
                      **dict(weights, P_g=None))
  assert np.abs(want - ungated).max() > 0.1  # the gate counts


def test_gated_decoding_equals_the_causal_pass():
  layer = layers.TalkingHeadsAttention(3, 4, use_gate=True,
                                       headwise_gate=True)
  x = np.random.default_rng(8).normal(size=(2, 6, 8)).astype("float32")
  full = layer(x, x, use_causal_mask=True).numpy()
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(6):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache,
                     decode_step=t)
    steps.append(y.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5,
                             atol=1e-5)


def test_a_config_rebuilds_the_gated_layer():
  layer = layers.MultiHeadAttention(2, 4, use_bias=True, use_gate=True,
                                    headwise_gate=True)
  x = np.random.default_rng(9).normal(size=(1, 3, 8)).astype("float32")
  y = layer(x, x).numpy()
  config = layer.get_config()
  assert config["use_gate"] and config["headwise_gate"]
  again = layers.MultiHeadAttention.from_config(config)
  again.set_weights(layer.get_weights())
  np.testing.assert_array_equal(again(x, x).numpy(), y)
  assert [w.name.split("/", 1)[1] for w in again.weights][-2:] == [
      "gate/kernel:0", "gate/bias:0"]  # a bias per head


def test_the_registry_s_gated_variants_are_multi_head_with_a_gate():
  for name, headwise in (("gated", False), ("gated_headwise", True)):
    layer = variants.make_attention("tf_keras", name, 2, 4)
    assert isinstance(layer, layers.MultiHeadAttention)
    assert (layer.use_gate, layer.headwise_gate) == (True, headwise)


@pytest.mark.parametrize("kwargs, message", [
    (dict(headwise_gate=True), "headwise_gate=True .* needs use_gate=True"),
    (dict(use_gate=1), r"`use_gate` must be True or False. Received: "
                       r"use_gate=1"),
])
def test_bad_gate_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.MultiHeadAttention(2, 4, **kwargs)


def test_tf_keras_s_own_layers_have_no_gate_to_take():
  layer = layers.MultiHeadAttention(2, 4, use_gate=True)
  layer(tf.zeros([1, 2, 8]), tf.zeros([1, 2, 8]))
  with pytest.raises(ValueError, match="use_gate=True gates the heads' "
                     "outputs, which neither tf_keras's"):
    keras_interop.to_keras(layer)
