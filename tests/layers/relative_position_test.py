"""T5 relative position buckets and the shareable bias layer."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers

POSITIONS = [-200, -16, -1, 0, 1, 8, 127, 1000]


def test_bidirectional_buckets_match_known_t5_values():
  buckets = layers.relative_position_bucket(tf.constant(POSITIONS))
  np.testing.assert_array_equal(buckets, [15, 10, 1, 0, 17, 24, 31, 31])


def test_unidirectional_buckets_match_known_t5_values():
  buckets = layers.relative_position_bucket(tf.constant(POSITIONS),
                                            bidirectional=False)
  np.testing.assert_array_equal(buckets, [31, 16, 1, 0, 0, 0, 0, 0])


def _reference_bucket(relative, bidirectional, num_buckets, max_distance):
  """Scalar transcription of T5's bucketing rule, written from its description."""
  offset, distance = 0, -relative
  if bidirectional:
    num_buckets //= 2
    offset = num_buckets if distance < 0 else 0
    distance = abs(distance)
  else:
    distance = max(distance, 0)
  exact = num_buckets // 2
  if distance < exact:
    return offset + distance
  large = exact + int(np.log(distance / exact) / np.log(max_distance / exact)
                      * (num_buckets - exact))
  return offset + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20)])
def test_buckets_match_scalar_rule_over_a_range(bidirectional, num_buckets,
                                                max_distance):
  relative = np.arange(-300, 301)
  got = layers.relative_position_bucket(tf.constant(relative), bidirectional,
                                        num_buckets, max_distance).numpy()
  want = [_reference_bucket(int(r), bidirectional, num_buckets, max_distance)
          for r in relative]
  np.testing.assert_array_equal(got, want)
  assert got.min() >= 0 and got.max() < num_buckets


def test_bias_layer_is_shared_and_indexed_by_relative_position():
  bias_layer = layers.RelativePositionBias(num_heads=3, num_buckets=8,
                                           max_distance=16)
  full = bias_layer(5, 7)
  assert full.shape == (1, 3, 5, 7)
  # Decoding step 2 sees row 2 of the full bias.
  step = bias_layer(1, 7, query_offset=2)
  np.testing.assert_array_equal(step[0, :, 0], full[0, :, 2])
  # Entries depend only on memory - query position.
  np.testing.assert_array_equal(full[0, :, 1, 2], full[0, :, 3, 4])
  # Two attention layers sharing one bias layer share one weight.
  x = tf.random.normal([1, 5, 8])
  first = layers.TalkingHeadsAttention(3, 4)
  second = layers.TalkingHeadsAttention(3, 4)
  first(x, x, position_bias=bias_layer(5, 5))
  second(x, x, position_bias=bias_layer(5, 5))
  assert len(bias_layer.weights) == 1
  assert bias_layer.weights[0].shape == (8, 3)


def test_bias_changes_attention_as_an_additive_logit_term():
  layer = layers.MultiHeadAttention(2, 4)
  x = tf.random.normal([1, 4, 8])
  bias = tf.constant(np.random.RandomState(0).randn(1, 2, 4, 4), tf.float32)
  _, plain = layer(x, x, return_attention_scores=True)
  _, biased = layer(x, x, position_bias=bias, return_attention_scores=True)
  # softmax(L + B) == softmax(log(softmax(L)) + B)
  expected = tf.nn.softmax(tf.math.log(plain) + bias)
  np.testing.assert_allclose(biased, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs,message", [
    ({"num_buckets": 2}, "num_buckets=2"),
    ({"max_distance": 0}, "max_distance must be positive"),
])
def test_bad_bucket_settings_raise(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.RelativePositionBias(num_heads=2, **kwargs)
