"""The query-chunked core equals the plain path: outputs and gradients."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers

BATCH, LENGTH, MEMORY_LENGTH, WIDTH, MEMORY_WIDTH = 2, 7, 9, 12, 10

VARIANTS = {
    "multi_head": lambda **kw: layers.MultiHeadAttention(3, 4, **kw),
    "talking_heads_non_square": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=3, **kw),
    "logits_only": lambda **kw: layers.TalkingHeadsAttention(
        3, 4, project_weights=False, **kw),
    "weights_only": lambda **kw: layers.TalkingHeadsAttention(
        3, 4, project_logits=False, num_value_heads=2, **kw),
    # Block-diagonal P_l[2, 1, 2] and P_w[2, 2, 3]: batched matmuls per group.
    "grouped": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=6,
        num_head_groups=2, **kw),
}


def _pair(make_layer, chunk_size):
  """A plain and a chunked layer with identical weights."""
  plain, chunked = make_layer(), make_layer(query_chunk_size=chunk_size)
  return plain, chunked


def _grads(layer, query, memory, **kwargs):
  bias = kwargs.pop("bias", None)
  with tf.GradientTape() as tape:
    tape.watch([query, memory])
    if bias is not None:
      tape.watch(bias)
      kwargs["position_bias"] = bias
    output = layer(query, memory, **kwargs)
    loss = tf.reduce_sum(output * tf.sin(output))
  sources = [query, memory] + layer.trainable_variables
  sources += [bias] if bias is not None else []
  return output, tape.gradient(loss, sources)


@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("chunk_size", [3, 16])
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both"])
def test_chunked_equals_plain_outputs_and_gradients(make_layer, chunk_size,
                                                    masking):
  tf.random.set_seed(4)
  plain, chunked = _pair(make_layer, chunk_size)
  cross = masking in ("none", "padding")
  query = tf.random.normal([BATCH, LENGTH, WIDTH])
  memory = (tf.random.normal([BATCH, MEMORY_LENGTH, MEMORY_WIDTH]) if cross
            else query)
  kwargs = {}
  if masking in ("padding", "both"):
    kwargs["attention_mask"] = tf.random.uniform(
        [BATCH, LENGTH, memory.shape[1]]) < 0.7
  if masking in ("causal", "both"):
    kwargs["use_causal_mask"] = True
  plain(query, memory)
  chunked(query, memory)
  chunked.set_weights(plain.get_weights())
  bias = tf.random.normal([1, plain.num_heads, LENGTH, memory.shape[1]])
  expected, expected_grads = _grads(plain, query, memory, bias=bias, **kwargs)
  got, got_grads = _grads(chunked, query, memory, bias=bias, **kwargs)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  for g, e in zip(got_grads, expected_grads):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def _peak_step_bytes(layer, x):
  """Peak allocator bytes of a forward+backward step, after a warm-up."""

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(layer(x, x, use_causal_mask=True))
    return tape.gradient(loss, [x] + layer.trainable_variables)

  step(x)
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  step(x)
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def test_chunked_step_keeps_no_full_score_tensors():
  # One [b, h, n, m] float32 score tensor here is 4 MiB; the plain path
  # keeps several for the backward pass, the chunked one keeps none. (The
  # plain peak is 4 of them on a quiet machine, 3 seen under load: it
  # depends on how the executor's threads overlap the backward ops.)
  x = tf.random.normal([1, 512, 16])
  plain = layers.TalkingHeadsAttention(4, 4)
  chunked = layers.TalkingHeadsAttention(4, 4, query_chunk_size=32)
  score_bytes = 4 * 512 * 512 * 4
  assert _peak_step_bytes(plain, x) >= 2 * score_bytes
  assert _peak_step_bytes(chunked, x) < score_bytes


def test_fully_masked_rows_get_no_logit_gradient():
  x = tf.random.normal([1, 4, 8])
  mask = tf.constant([[[False] * 4, [True] * 4, [True, False, True, False],
                       [True] * 4]])
  bias = tf.random.normal([1, 2, 4, 4])
  plain = layers.TalkingHeadsAttention(2, 4)
  chunked = layers.TalkingHeadsAttention(2, 4, query_chunk_size=1)
  plain(x, x)
  chunked(x, x)
  chunked.set_weights(plain.get_weights())
  _, expected = _grads(plain, x, x, attention_mask=mask, bias=bias)
  _, got = _grads(chunked, x, x, attention_mask=mask, bias=bias)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(got[-1][0, :, 0], 0.0)  # bias, masked row


def test_dropout_training_falls_back_to_the_plain_path():
  layer = layers.TalkingHeadsAttention(2, 4, dropout_rate=0.5,
                                       query_chunk_size=2)
  x = tf.random.normal([2, 6, 8])
  inference = layer(x, x, training=False)
  assert not np.allclose(layer(x, x, training=True), inference)


def test_unknown_shapes_in_a_functional_model_fit():
  tokens = tf_keras.Input([None], dtype=tf.int32)
  x = tf_keras.layers.Embedding(11, 8)(tokens)
  y = layers.TalkingHeadsAttention(2, 4, query_chunk_size=3)(
      x, x, use_causal_mask=True)
  model = tf_keras.Model(tokens, tf_keras.layers.Dense(11)(y))
  model.compile("adam", tf_keras.losses.SparseCategoricalCrossentropy(
      from_logits=True))
  data = np.random.RandomState(0).randint(0, 11, [16, 10])
  history = model.fit(data, data, epochs=3, batch_size=8, verbose=0)
  assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_matches_float32(policy):
  x = tf.random.normal([2, 6, 8])
  mask = tf.constant(np.random.RandomState(1).rand(2, 6, 6) < 0.6)
  reference = layers.TalkingHeadsAttention(2, 4, query_chunk_size=4)
  expected = reference(x, x, attention_mask=mask)
  layer = layers.TalkingHeadsAttention(
      2, 4, query_chunk_size=4, dtype=tf_keras.mixed_precision.Policy(policy))
  layer(x, x)
  layer.set_weights(reference.get_weights())
  got = layer(x, x, attention_mask=mask)
  assert got.dtype != tf.float32
  np.testing.assert_allclose(tf.cast(got, tf.float32), expected, atol=5e-2,
                             rtol=5e-2)


def test_xla_compiled_step_matches_eager():
  layer = layers.TalkingHeadsAttention(2, 4, query_chunk_size=4)
  x = tf.random.normal([2, 6, 8])
  _, eager_grads = _grads(layer, x, x, use_causal_mask=True)

  @tf.function(jit_compile=True)
  def compiled(x):
    return _grads(layer, x, x, use_causal_mask=True)[1]

  for g, e in zip(compiled(x), eager_grads):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_bad_chunk_size():
  with pytest.raises(ValueError, match="query_chunk_size must be a positive "
                     "integer, got 0"):
    layers.TalkingHeadsAttention(2, 4, query_chunk_size=0)
