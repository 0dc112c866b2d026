"""T5's relative position bias as a Keras 3 layer (see thattn.layers)."""

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.core import validation
from thattn.keras3 import attention_math
from thattn.keras3 import lookups


@keras.saving.register_keras_serializable(package="thattn")
class RelativePositionBias(keras.layers.Layer):
  """Learned T5 bias B[1, h, n, m], one scalar per (bucket, softmax head).

  The weight `relative_attention_bias [num_buckets, h]`, as in
  `thattn.layers.RelativePositionBias`; share one per stack.
  Call: `bias_layer(query_length=n, memory_length=m, query_offset=0)` ->
  float32 [1, h, n, m], to pass as `position_bias=`. Keyword arguments,
  where thattn.layers also takes them positionally: Keras 3 takes only
  tensors as positional arguments.

  Args:
    num_heads: h.
    bidirectional: False gives every future position bucket 0 (T5's
      decoder self-attention).
    num_buckets, max_distance: T5's bucketing.
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
    self.embeddings_initializer = keras.initializers.get(
        embeddings_initializer or
        keras.initializers.RandomNormal(stddev=num_heads ** -0.5))
    self.logical_axes = {}

  def build(self, *args, **kwargs):
    del args, kwargs  # the weight's shape does not depend on the inputs
    self.embeddings = self.add_weight(
        name="relative_attention_bias",
        shape=(self.num_buckets, self.num_heads),
        initializer=self.embeddings_initializer,
        # float32 under a mixed policy too: the bias is computed in float32
        # (models.embeddings.TokenEmbedding says why tables are not
        # autocast).
        autocast=False)
    self.logical_axes[self.embeddings.path] = attention_spec.RELATIVE_BIAS_AXES

  def call(self, query_length, memory_length, query_offset=0):
    # B[0, :, i, j] depends on j - i only, so the bias is a Toeplitz matrix
    # of the n + m - 1 distances' rows: look those up (by selection, whose
    # gradient is a reduction) and lay them out by reshapes. A gather of
    # the n * m buckets would have a scatter-add of n * m rows into
    # num_buckets as its gradient (thattn.keras3.lookups says why not).
    span = query_length + memory_length  # n + m - 1 distances, 1 padding
    # distance[k] = j - (i + query_offset) for k = j - i + n - 1.
    distance = (ops.arange(span, dtype="int32") - (query_length - 1) -
                query_offset)
    buckets = attention_math.relative_position_bucket(
        distance, self.bidirectional, self.num_buckets, self.max_distance)
    per_distance = ops.transpose(lookups.select_rows(
        ops.cast(self.embeddings, "float32"), buckets))  # [h, n + m]
    return ops.expand_dims(
        toeplitz(per_distance, query_length, memory_length), 0)

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                bidirectional=self.bidirectional,
                num_buckets=self.num_buckets, max_distance=self.max_distance,
                embeddings_initializer=keras.saving.serialize_keras_object(
                    self.embeddings_initializer))


def toeplitz(rows, query_length, memory_length):
  """T[h, i, j] = rows[h, j - i + n - 1] for rows [h, n + m], n =
  query_length, m = memory_length (rows' last entry unused).

  By reshapes and slices only: row i of T starts at rows' n - 1 - i, so in
  the rows repeated n times and flattened, T's entries lie at n - 1 + i *
  (n + m - 1) + j, rows of stride n + m - 1 >= m.
  """
  heads = rows.shape[0]
  span = query_length + memory_length
  stride = span - 1
  flat = ops.reshape(
      ops.tile(ops.expand_dims(rows, 1), (1, query_length, 1)),
      (heads, query_length * span))
  start = query_length - 1
  laid_out = ops.reshape(flat[:, start:start + query_length * stride],
                         (heads, query_length, stride))
  return laid_out[:, :, :memory_length]
