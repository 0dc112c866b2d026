"""T5's relative position bias (Raffel et al., 2019), shareable across blocks.

Each relative position `memory_position - query_position` falls into one of
`num_buckets` buckets: exact buckets for small distances, then buckets of
logarithmically growing width up to `max_distance`, beyond which all
distances share the last bucket. Bidirectional attention spends half of the
buckets on each sign. A learned scalar per (bucket, softmax head) is added to
the logits L[b, h, n, m] after the pre-softmax projection, so the bias lives
in the h (softmax) heads, not in h_k.
"""

import math

import tensorflow as tf
import tf_keras

from thattn.core import attention_spec
from thattn.core import validation
from thattn.ops import autograph


def relative_position_bucket(relative_position, bidirectional=True,
                             num_buckets=32, max_distance=128):
  """Maps relative positions (memory - query) to bucket ids in [0, num_buckets).

  Args:
    relative_position: integer tensor of `memory_position - query_position`.
    bidirectional: if False, positive relative positions (the future) all go
      to bucket 0, as in causal self-attention.
    num_buckets: number of buckets.
    max_distance: distances at or beyond this share the last bucket.

  Returns:
    int32 tensor of the same shape.
  """
  attention_spec.check_relative_buckets(bidirectional, num_buckets,
                                        max_distance)
  relative_position = tf.cast(relative_position, tf.int32)
  bucket_offset = tf.zeros_like(relative_position)
  # Distances are measured backwards: n = query - memory = -relative.
  distance = -relative_position
  if bidirectional:
    num_buckets //= 2
    # The upper half of the buckets is for memory after the query.
    bucket_offset += tf.cast(distance < 0, tf.int32) * num_buckets
    distance = tf.abs(distance)
  else:
    distance = tf.maximum(distance, 0)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  # Log-spaced buckets from max_exact to max_distance. The small-distance
  # branch is computed separately, so guard the log against zero.
  log_ratio = (tf.math.log(tf.cast(tf.maximum(distance, 1), tf.float32) /
                           max_exact) /
               math.log(max_distance / max_exact))
  large = max_exact + tf.cast(log_ratio * (num_buckets - max_exact), tf.int32)
  large = tf.minimum(large, num_buckets - 1)
  return bucket_offset + tf.where(is_small, distance, large)


@tf_keras.utils.register_keras_serializable(package="thattn")
class RelativePositionBias(tf_keras.layers.Layer):
  """Learned T5 bias B[1, h, n, m], one scalar per (bucket, head).

  Create one per stack and call it from every block, as T5 does, so all
  blocks share the weight `relative_attention_bias[num_buckets, h]`.

  Call: `bias_layer(query_length, memory_length, query_offset=0)`, where
  `query_offset` is the position of the first query (for decoding step t,
  pass t). Returns float32 `[1, h, n, m]` to pass as `position_bias=`.

  Args:
    num_heads: h.
    bidirectional: False gives every future position (memory after query)
      bucket 0, as T5's decoder self-attention does.
    num_buckets, max_distance: T5's bucketing (`relative_position_bucket`).
    embeddings_initializer: of the weight; N(0, 1/h) by default.
  """

  def __init__(self, num_heads, bidirectional=True, num_buckets=32,
               max_distance=128, embeddings_initializer=None, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = validation.layer_int("num_heads", num_heads)
    attention_spec.check_relative_buckets(bidirectional, num_buckets,
                                          max_distance)
    self.bidirectional = bidirectional
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.embeddings_initializer = tf_keras.initializers.get(
        embeddings_initializer or
        tf_keras.initializers.RandomNormal(stddev=num_heads ** -0.5))
    self.logical_axes_by_name = {}

  def build(self, input_shape=None):
    self.embeddings = self.add_weight(
        "relative_attention_bias", [self.num_buckets, self.num_heads],
        initializer=self.embeddings_initializer)
    self.logical_axes_by_name[self.embeddings.name] = (
        attention_spec.RELATIVE_BIAS_AXES)
    super().build(input_shape)

  @property
  def logical_axes(self):
    return dict(self.logical_axes_by_name)

  @autograph.unconverted
  def call(self, query_length, memory_length, query_offset=0):
    query_positions = tf.range(query_length) + query_offset
    memory_positions = tf.range(memory_length)
    relative = (tf.expand_dims(memory_positions, 0) -
                tf.expand_dims(query_positions, 1))
    buckets = relative_position_bucket(relative, self.bidirectional,
                                       self.num_buckets, self.max_distance)
    bias = tf.gather(tf.cast(self.embeddings, tf.float32), buckets)  # [n,m,h]
    return tf.expand_dims(tf.transpose(bias, [2, 0, 1]), 0)

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                bidirectional=self.bidirectional,
                num_buckets=self.num_buckets, max_distance=self.max_distance,
                embeddings_initializer=tf_keras.initializers.serialize(
                    self.embeddings_initializer))
