"""DCMHA (Xiao et al., 2024) on the tf_keras layers, against the NumPy
transcription of the DCFormer authors' compose (family_reference.py):
self- and cross-attention, shared key and value heads, the static mix;
its identity start at multi-head attention, cached decoding with the
per-key mixing matrices, the sliding window, configs and bad arguments.
The Keras 3 layer on its three backends: tests/keras3/backend_checks.py;
against the authors' own module: tests/converters/dcformer_test.py."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers

try:
  from . import family_reference
except ImportError:  # tests/layers is not a package
  import family_reference


def _named(layer):
  """{short name: array} of the layer's weights (`query` for
  query/kernel)."""
  return {w.name.split("/")[-2 if w.name.endswith("kernel:0") else -1]
          .split(":")[0]: w.numpy() for w in layer.weights}


def _randomized(layer, rng, x, memory, scale=0.3):
  layer(x, memory)
  layer.set_weights([rng.normal(size=w.shape).astype("float32") * scale
                     for w in layer.weights])
  return _named(layer)


def _reference(weights, x, memory, mask=None):
  return family_reference.dcmha_attention(
      x, memory, weights["query"], weights["key"], weights["value"],
      weights["output"], weights["dynamic_hidden"],
      weights["dynamic_factors"], weights["dynamic_gates"], mask=mask,
      static=weights.get("static_mix"))


@pytest.mark.parametrize("kv_heads, memory, static_mix", [
    (None, "self", False), (2, "self", True), (1, "cross", False)])
def test_the_layer_equals_the_reference(kv_heads, memory, static_mix):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 12)).astype("float32")
  mem = x if memory == "self" else rng.normal(size=(2, 7, 12)).astype(
      "float32")
  mask = rng.random((2, 5, mem.shape[1])) < 0.7
  mask[:, :, 0] = True  # no fully masked row
  layer = layers.DynamicallyComposableAttention(
      4, 3, num_key_value_heads=kv_heads, static_mix=static_mix)
  weights = _randomized(layer, rng, x, mem)
  assert weights["dynamic_factors"].shape == (4, 16, 4, 4)  # C = 2 R h
  got = layer(x, mem, attention_mask=mask).numpy()
  want = _reference(weights, x, mem, mask)
  np.testing.assert_allclose(got, want, rtol=1e-4,
                             atol=1e-5 * np.abs(want).max())


def test_zero_second_factors_and_gates_are_multi_head_attention():
  """The identity start: with Q_kw's w_2 rows and D_d at zero (D_1 and
  w_1's rows anything), DCMHA is multi-head attention on the same P_q,
  P_k, P_v, P_o, exactly."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 6, 8)).astype("float32")
  layer = layers.DynamicallyComposableAttention(2, 4, dynamic_rank=3)
  weights = _randomized(layer, rng, x, x)
  factors = weights["dynamic_factors"].copy()
  factors[:, :, 3:] = 0.0
  for variable in layer.weights:
    name = variable.name.split("/")[-1].split(":")[0]
    if name == "dynamic_factors":
      variable.assign(factors)
    elif name == "dynamic_gates":
      variable.assign(tf.zeros_like(variable))
  multi_head = layers.MultiHeadAttention(2, 4)
  multi_head(x, x)
  multi_head.set_weights([weights[name] for name in
                          ("query", "key", "value", "output")])
  np.testing.assert_allclose(layer(x, x, use_causal_mask=True).numpy(),
                             multi_head(x, x, use_causal_mask=True).numpy(),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3])
def test_cached_decoding_keeps_mixing_matrices_and_equals_the_causal_pass(
    window):
  layer = layers.DynamicallyComposableAttention(
      4, 4, num_key_value_heads=2, rotary_base=10000.0,
      query_key_norm_epsilon=1e-6, static_mix=True, sliding_window=window)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(2, 7, 8)).astype("float32")
  _randomized(layer, rng, x, x)
  whole = layer(x, x, use_causal_mask=True).numpy()
  cache = layer.initial_cache(2, 7)
  # K and V as projected (h_kv heads), and one [2, h, h] matrix per key.
  assert {name: tuple(t.shape) for name, t in cache.items()} == {
      "key": (2, 7, 2, 4), "value": (2, 7, 2, 4), "key_mix": (2, 7, 2, 4, 4)}
  steps = []
  for start, stop in ((0, 3), (3, 4), (4, 7)):
    y, cache = layer(x[:, start:stop], x[:, start:stop], cache=cache,
                     decode_step=start)
    steps.append(y.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-4, atol=1e-4 * np.abs(whole).max())


def test_the_sliding_window_is_keras_s_band():
  """`sliding_window=w` with the causal mask: each query sees its last w
  keys, its own included (keras.layers.MultiHeadAttention's band)."""
  rng = np.random.default_rng(3)
  x = rng.normal(size=(1, 6, 8)).astype("float32")
  layer = layers.DynamicallyComposableAttention(2, 4, sliding_window=3)
  weights = _randomized(layer, rng, x, x)
  band = np.tril(np.ones((6, 6), bool)) & ~np.tril(np.ones((6, 6), bool), -3)
  want = _reference(weights, x, x, band[None])
  np.testing.assert_allclose(layer(x, x, use_causal_mask=True).numpy(), want,
                             rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_a_config_rebuilds_the_layer():
  layer = layers.DynamicallyComposableAttention(
      4, 4, dynamic_rank=1, dynamic_hidden_dim=6, static_mix=True,
      use_gate=True, sliding_window=2)
  x = np.random.default_rng(4).normal(size=(1, 3, 8)).astype("float32")
  y = layer(x, x).numpy()
  again = layers.DynamicallyComposableAttention.from_config(
      layer.get_config())
  again.set_weights(layer.get_weights())
  np.testing.assert_array_equal(again(x, x).numpy(), y)
  assert _named(again)["dynamic_factors"].shape == (4, 6, 2, 4)
  _, scores = layer(x, x, return_attention_scores=True)
  assert scores.shape == (1, 4, 3, 3)  # U, the composed probabilities


@pytest.mark.parametrize("kwargs, message", [
    (dict(dynamic_rank=0), "dynamic_rank must be a positive integer, got 0"),
    (dict(dynamic_hidden_dim=2.5),
     "dynamic_hidden_dim must be a positive integer, got 2.5"),
    (dict(query_chunk_size=2), "query_chunk_size=2 is not supported"),
    (dict(sliding_window=0), "sliding_window must be a positive integer"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.DynamicallyComposableAttention(4, 4, **kwargs)


def test_different_query_and_key_widths_are_refused():
  layer = layers.DynamicallyComposableAttention(2, 4)
  with pytest.raises(ValueError, match=r"query \(width 8\) and the keys' "
                                       r"from the key input \(width 6\)"):
    layer(np.zeros((1, 2, 8), "float32"), np.zeros((1, 3, 6), "float32"))


def test_the_converters_identity_start_is_multi_head_and_trains():
  """`weight_maps.identity_start` (what a multi-head checkpoint converts
  with): the compose is the identity, and the loss's gradient reaches
  Q_kw's w_2 rows (zero with w_1's, they would stay there)."""
  from thattn.core import weight_maps  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  x = rng.normal(size=(2, 5, 8)).astype("float32")
  layer = layers.DynamicallyComposableAttention(2, 4)
  weights = _randomized(layer, rng, x, x)
  start = weight_maps.identity_start(
      {w.name.split(":")[0]: tuple(w.shape) for w in layer.weights
       if "dynamic" in w.name})
  assert len(start) == 3
  for variable in layer.weights:
    name = variable.name.split(":")[0]
    if name in start:
      variable.assign(start[name])
  multi_head = layers.MultiHeadAttention(2, 4)
  multi_head(x, x)
  multi_head.set_weights([weights[name] for name in
                          ("query", "key", "value", "output")])
  np.testing.assert_allclose(layer(x, x).numpy(), multi_head(x, x).numpy(),
                             rtol=1e-6, atol=1e-6)
  factors = next(w for w in layer.weights if "dynamic_factors" in w.name)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.square(layer(x, x)))
  gradient = tape.gradient(loss, factors).numpy()
  assert np.abs(gradient[:, :, 2:]).max() > 0  # w_2's rows move
