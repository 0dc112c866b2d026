"""T5's relative position bias as a Keras 3 layer (see thattn.layers)."""

import keras
from keras import ops

from thattn import attention_spec
from thattn import validation
from thattn.keras3 import attention_math


@keras.saving.register_keras_serializable(package="thattn")
class RelativePositionBias(keras.layers.Layer):
  """Learned T5 bias B[1, h, n, m], one scalar per (bucket, softmax head).

  The weight `relative_attention_bias [num_buckets, h]`, as in
  `thattn.layers.RelativePositionBias`; share one per stack.
  Call: `bias_layer(query_length=n, memory_length=m, query_offset=0)` ->
  float32 [1, h, n, m], to pass as `position_bias=`. Keyword arguments,
  where thattn.layers also takes them positionally: Keras 3 takes only
  tensors as positional arguments.
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
    self.embeddings_initializer = keras.initializers.get(
        embeddings_initializer or
        keras.initializers.RandomNormal(stddev=num_heads ** -0.5))
    self.logical_axes = {}

  def build(self, *args, **kwargs):
    del args, kwargs  # the weight's shape does not depend on the inputs
    self.embeddings = self.add_weight(
        name="relative_attention_bias",
        shape=(self.num_buckets, self.num_heads),
        initializer=self.embeddings_initializer)
    self.logical_axes[self.embeddings.path] = attention_spec.RELATIVE_BIAS_AXES

  def call(self, query_length, memory_length, query_offset=0):
    query_positions = ops.arange(query_length, dtype="int32") + query_offset
    relative = (ops.expand_dims(ops.arange(memory_length, dtype="int32"), 0)
                - ops.expand_dims(query_positions, 1))
    buckets = attention_math.relative_position_bucket(
        relative, self.bidirectional, self.num_buckets, self.max_distance)
    bias = ops.take(ops.cast(self.embeddings, "float32"), buckets, axis=0)
    return ops.expand_dims(ops.transpose(bias, (2, 0, 1)), 0)  # [1,h,n,m]

  def get_config(self):
    config = super().get_config()
    config.update({
        "num_heads": self.num_heads,
        "bidirectional": self.bidirectional,
        "num_buckets": self.num_buckets,
        "max_distance": self.max_distance,
        "embeddings_initializer":
            keras.saving.serialize_keras_object(self.embeddings_initializer),
    })
    return config
