"""Grouped-query attention (`num_key_value_heads`) in thattn.layers.

P_k and P_v project to h_kv heads, each read by a group of consecutive key
and value heads. The reference is the float64 NumPy transcription with
each of those heads' projections repeated (K head i // (h_k / h_kv) for key
head i): the grouped layer must equal multi-head and talking-heads
attention whose P_k and P_v hold those copies. Decoding caches hold the
h_kv projected heads, and cached steps equal the whole sequence.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers
from thattn.core import complexity

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref


def _repeated(kernel, heads):
  """P_k[d, h_kv, d_k] -> [d, heads, d_k], each head `heads / h_kv`
  times in a row."""
  return np.repeat(kernel, heads // kernel.shape[1], axis=1)


def _inputs(rng, batch=2, n=5, m=7, width=12):
  return (rng.normal(size=(batch, n, width)),
          rng.normal(size=(batch, m, width)))


def _call(layer, x, memory, **kwargs):
  out, scores = layer(tf.constant(x, tf.float32),
                      tf.constant(memory, tf.float32),
                      return_attention_scores=True, **kwargs)
  return out.numpy(), scores.numpy()


def test_multi_head_with_shared_heads_is_the_reference_with_repeats():
  rng = np.random.default_rng(0)
  x, memory = _inputs(rng)
  layer = layers.MultiHeadAttention(num_heads=6, key_dim=4, value_dim=3,
                                    num_key_value_heads=2)
  _call(layer, x, memory)
  ref.randomize_weights(layer, rng)
  weights = ref.reference_kwargs(layer)
  assert weights["P_k"].shape == (12, 2, 4)
  assert weights["P_v"].shape == (12, 2, 3)
  assert weights["P_q"].shape == (12, 6, 4)
  assert weights["P_o"].shape == (6, 3, 12)
  got, got_scores = _call(layer, x, memory, use_causal_mask=True)
  want, want_scores = ref.multi_head_attention(
      x, memory, weights["P_q"], _repeated(weights["P_k"], 6),
      _repeated(weights["P_v"], 6), weights["P_o"],
      mask=ref.causal_mask(2, 5, 7), return_weights=True)
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)


def test_talking_heads_with_shared_heads_is_the_reference_with_repeats():
  rng = np.random.default_rng(1)
  x, memory = _inputs(rng)
  layer = layers.TalkingHeadsAttention(
      num_heads=3, key_dim=4, num_key_heads=4, num_value_heads=6,
      num_key_value_heads=2, dynamic_projections=["x2l", "m2w"])
  _call(layer, x, memory)
  ref.randomize_weights(layer, rng)
  weights = ref.reference_kwargs(layer)
  assert weights["P_k"].shape == (12, 2, 4)
  assert weights["P_v"].shape == (12, 2, 4)
  got, _ = _call(layer, x, memory)
  want = ref.talking_heads_attention_with_dynamic_projections(
      x, memory, **dict(weights, P_k=_repeated(weights["P_k"], 4),
                        P_v=_repeated(weights["P_v"], 6)))
  ref.assert_close(got, want)


def test_the_cache_holds_the_shared_heads_and_decodes_as_the_sequence():
  rng = np.random.default_rng(2)
  x, _ = _inputs(rng, n=6, m=6)
  layer = layers.MultiHeadAttention(num_heads=4, key_dim=5,
                                    num_key_value_heads=1)
  whole, _ = _call(layer, x, x, use_causal_mask=True)
  cache = layer.initial_cache(2, 6)
  assert cache["key"].shape == (2, 6, 1, 5) == cache["value"].shape
  steps = []
  for step in range(6):
    x_t = tf.constant(x[:, step:step + 1], tf.float32)
    y_t, cache = layer(x_t, x_t, cache=cache, decode_step=step)
    steps.append(y_t.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-5, atol=1e-5)


def test_the_config_round_trips_and_others_are_unchanged():
  layer = layers.TalkingHeadsAttention(num_heads=4, key_dim=2,
                                       num_key_value_heads=2)
  config = layer.get_config()
  assert config["num_key_value_heads"] == 2
  again = layers.TalkingHeadsAttention.from_config(config)
  assert again.num_key_value_heads == 2
  assert "num_key_value_heads" not in layers.MultiHeadAttention(
      2, 4).get_config()
  model_input = tf_keras.Input((3, 8))
  outputs = again(model_input, model_input)
  assert outputs.shape.as_list() == [None, 3, 8]


@pytest.mark.parametrize("make, message", [
    (lambda: layers.MultiHeadAttention(6, 4, num_key_value_heads=4),
     "num_key_value_heads=4 must divide num_key_heads=6"),
    (lambda: layers.TalkingHeadsAttention(
        4, 4, num_value_heads=6, num_key_value_heads=4),
     "not a multiple of 4: num_value_heads"),
    (lambda: layers.MultiHeadAttention(6, 4, num_key_value_heads=0),
     "num_key_value_heads"),
])
def test_heads_that_do_not_divide_are_named(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_to_keras_refuses_shared_heads():
  layer = layers.MultiHeadAttention(4, 2, num_key_value_heads=2)
  layer(tf.zeros([1, 3, 8]), tf.zeros([1, 3, 8]))
  with pytest.raises(ValueError, match="num_key_value_heads=2 shares key"):
    layers.to_keras(layer)


@pytest.mark.parametrize("make, shape", [
    (lambda: layers.MultiHeadAttention(6, 4, value_dim=3, use_bias=True,
                                       num_key_value_heads=3),
     dict(variant="multi_head", num_heads=6, key_dim=4, value_dim=3,
          use_bias=True, num_key_value_heads=3)),
    (lambda: layers.TalkingHeadsAttention(
        3, 4, num_key_heads=4, num_value_heads=6, num_key_value_heads=2,
        use_bias=True, dynamic_projections=["x2l", "m2w"]),
     dict(variant="talking_heads", num_heads=3, key_dim=4, num_key_heads=4,
          num_value_heads=6, num_key_value_heads=2, use_bias=True,
          dynamic_projections=("x2l", "m2w"))),
])
def test_thattn_complexity_counts_the_built_layers_weights(make, shape):
  layer = make()
  layer(tf.zeros([1, 3, 12]), tf.zeros([1, 3, 12]))
  assert layer.count_params() == complexity.parameters(
      complexity.AttentionShape(d_model=12, **shape))


def test_llama_3_2_1bs_attention_layer_has_its_published_size():
  """32 query heads of 64 over 8 KV heads at width 2,048: P_q and P_o
  2,048 x 2,048 each, P_k and P_v 2,048 x 512 (transformers' Llama 3.2 1B
  q_proj, k_proj, v_proj, o_proj); the repeats multiply nothing."""
  shape = complexity.AttentionShape("multi_head", num_heads=32, key_dim=64,
                                    num_key_value_heads=8, d_model=2048)
  assert complexity.parameters(shape) == 2 * 2048 * 2048 + 2 * 2048 * 512
  full = complexity.AttentionShape("multi_head", num_heads=32, key_dim=64,
                                   d_model=2048)
  m = 512  # the memory positions the K and V projections read
  assert complexity.multiplies(full) - complexity.multiplies(shape) == (
      2 * m * 2048 * 64 * (32 - 8))
  assert complexity.describe(shape) == "multi_head (h_kv=8)"
