"""Incremental decoding with a cache equals the full causal pass."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers

BATCH, LENGTH, MEMORY_LENGTH, WIDTH, MEMORY_WIDTH = 2, 6, 4, 16, 12

VARIANTS = {
    "multi_head": lambda: layers.MultiHeadAttention(num_heads=2, key_dim=4),
    "talking_heads_non_square": lambda: layers.TalkingHeadsAttention(
        num_heads=4, key_dim=3, value_dim=5, num_key_heads=2,
        num_value_heads=3),
    "dynamic_all": lambda: layers.TalkingHeadsAttention(
        num_heads=3, key_dim=4, dynamic_projections=layers.DYNAMIC_PROJECTIONS),
    # Cached R_Ml and R_Mw are [b, m, G, heads/G, heads/G].
    "grouped_dynamic": lambda: layers.TalkingHeadsAttention(
        num_heads=4, key_dim=3, num_key_heads=2, num_value_heads=6,
        num_head_groups=2, dynamic_projections=layers.DYNAMIC_PROJECTIONS),
    "general_bilinear": lambda: layers.GeneralBilinearAttention(num_heads=3),
}


@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_self_attention_decoding_equals_full_causal_pass(make_layer,
                                                         steps_per_call):
  tf.random.set_seed(1)
  layer = make_layer()
  bias = layers.RelativePositionBias(layer.num_heads, bidirectional=False)
  x = tf.random.normal([BATCH, LENGTH, WIDTH])
  full = layer(x, x, use_causal_mask=True, position_bias=bias(LENGTH, LENGTH))

  cache = layer.initial_cache(BATCH, LENGTH)
  outputs = []
  for start in range(0, LENGTH, steps_per_call):
    x_t = x[:, start:start + steps_per_call]
    y_t, cache = layer(
        x_t, x_t, cache=cache, decode_step=start,
        position_bias=bias(steps_per_call, LENGTH, query_offset=start))
    outputs.append(y_t)
  np.testing.assert_allclose(tf.concat(outputs, axis=1), full,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
def test_cross_attention_cache_equals_full_pass(make_layer):
  tf.random.set_seed(2)
  layer = make_layer()
  x = tf.random.normal([BATCH, LENGTH, WIDTH])
  memory = tf.random.normal([BATCH, MEMORY_LENGTH, MEMORY_WIDTH])
  mask = tf.random.uniform([BATCH, 1, MEMORY_LENGTH]) < 0.7
  full = layer(x, memory, attention_mask=mask)

  cache = layer.memory_cache(memory)
  outputs = [layer(x[:, t:t + 1], None, cache=cache, attention_mask=mask)[0]
             for t in range(LENGTH)]
  np.testing.assert_allclose(tf.concat(outputs, axis=1), full,
                             rtol=1e-5, atol=1e-6)


def test_decoding_inside_tf_function_matches_eager():
  layer = VARIANTS["dynamic_all"]()
  x = tf.random.normal([BATCH, LENGTH, WIDTH])
  full = layer(x, x, use_causal_mask=True)

  @tf.function
  def decode(x):
    cache = layer.initial_cache(BATCH, LENGTH)
    outputs = tf.TensorArray(tf.float32, size=LENGTH)
    for t in tf.range(LENGTH):
      x_t = x[:, t:t + 1]
      y_t, cache = layer(x_t, x_t, cache=cache, decode_step=t)
      outputs = outputs.write(t, y_t[:, 0])
    return tf.transpose(outputs.stack(), [1, 0, 2])

  np.testing.assert_allclose(decode(x), full, rtol=1e-5, atol=1e-6)


def test_cache_before_build_is_a_clear_error():
  layer = layers.TalkingHeadsAttention(num_heads=2, key_dim=4)
  with pytest.raises(ValueError, match="build the layer"):
    layer.initial_cache(2, 8)
  with pytest.raises(ValueError, match="decode_step=3 needs a cache"):
    x = tf.zeros([1, 1, 8])
    layer(x, x, decode_step=3)
