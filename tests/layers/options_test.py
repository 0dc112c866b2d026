"""Fixed head size, attention dropout, logical axes and initialization."""

import numpy as np
import tensorflow as tf

from thattn.core import dims
from thattn import layers


def test_fixed_head_size_uses_the_sequence_length():
  layer = layers.fixed_head_size_attention(num_heads=8, sequence_length=32,
                                           variant="talking_heads")
  x = tf.random.normal([2, 32, 16])  # d_model 16, h 8: d_model/h would be 2
  assert layer(x, x).shape == (2, 32, 16)
  assert layer.key_dim == layer.value_dim == 32
  query_kernel = [v for v in layer.weights if "query" in v.name][0]
  assert query_kernel.shape == (16, 8, 32)


def test_dropout_only_in_training_and_keeps_the_expectation():
  layer = layers.TalkingHeadsAttention(2, 4, dropout_rate=0.5)
  x = tf.random.normal([4, 6, 8])
  inference = layer(x, x, training=False)
  np.testing.assert_array_equal(inference, layer(x, x))
  tf.random.set_seed(7)  # the dropout masks; the check below is statistical
  samples = np.stack([layer(x, x, training=True) for _ in range(400)])
  assert not np.allclose(samples[0], inference)
  # Inverted dropout keeps the mean: each output's sample mean lies within
  # 5 of its own standard errors of the inference output.
  standard_error = samples.std(axis=0) / np.sqrt(len(samples))
  assert np.all(np.abs(samples.mean(axis=0) - inference) <=
                5 * standard_error + 1e-6)


def test_every_weight_declares_known_logical_axes_of_its_rank():
  layer = layers.TalkingHeadsAttention(
      4, 3, num_key_heads=2, num_value_heads=6, use_bias=True,
      dynamic_projections=layers.DYNAMIC_PROJECTIONS)
  x = tf.zeros([1, 3, 8])
  layer(x, x)
  bilinear = layers.GeneralBilinearAttention(2)
  bilinear(x, x)
  bias = layers.RelativePositionBias(4)
  bias(3, 3)
  for layer_ in (layer, bilinear, bias):
    axes = layer_.logical_axes
    assert sorted(axes) == sorted(v.name for v in layer_.weights)
    for variable in layer_.weights:
      assert len(axes[variable.name]) == variable.shape.rank
      assert set(axes[variable.name]) <= set(dims.LOGICAL_AXES)
  assert axes_of(layer, "pre_softmax_projection") == ("key_heads", "heads")
  assert axes_of(layer, "m2w") == ("d_model", "heads", "value_heads")
  assert axes_of(layer, "output/kernel") == ("value_heads", "d_v", "d_model")


def axes_of(layer, token):
  (name,) = [n for n in layer.logical_axes if token in n]
  return layer.logical_axes[name]


def test_initial_weights_are_distinct_and_query_is_scaled():
  layer = layers.MultiHeadAttention(4, 16)
  x = tf.zeros([1, 2, 64])
  layer(x, x)
  kernels = {v.name.split("/")[-2]: v.numpy() for v in layer.weights}
  assert not np.allclose(kernels["key"], kernels["value"])
  # Glorot on [64, 4, 16]: std sqrt(2 / (fan_in + fan_out)); the query's is
  # further scaled by d_k**-0.5 = 1/4 (the folded 1/sqrt(d_k)).
  ratio = kernels["query"].std() / kernels["key"].std()
  np.testing.assert_allclose(ratio, 0.25, rtol=0.1)


def test_dynamic_projections_start_small_as_in_appendix_a():
  layer = layers.TalkingHeadsAttention(
      4, 8, num_key_heads=2, dynamic_projections=["x2l", "m2w"])
  x = tf.zeros([1, 2, 256])
  layer(x, x)
  x2l = [v for v in layer.weights if "x2l" in v.name][0].numpy()
  m2w = [v for v in layer.weights if "m2w" in v.name][0].numpy()
  np.testing.assert_allclose(x2l.std(), 0.1 / np.sqrt(256 * 2), rtol=0.1)
  np.testing.assert_allclose(m2w.std(), 0.1 / np.sqrt(256 * 4), rtol=0.1)


def test_xla_compiles_every_variant_with_equal_results():
  x = tf.random.normal([2, 5, 8])
  mask = tf.constant(np.random.RandomState(2).rand(2, 5, 5) < 0.7)
  for layer in (layers.MultiHeadAttention(2, 4),
                layers.TalkingHeadsAttention(
                    3, 4, num_key_heads=2,
                    dynamic_projections=layers.DYNAMIC_PROJECTIONS),
                layers.TalkingHeadsAttention(
                    4, 4, num_key_heads=2, num_head_groups=2,
                    dynamic_projections=layers.DYNAMIC_PROJECTIONS),
                layers.GeneralBilinearAttention(2)):
    eager = layer(x, x, attention_mask=mask, use_causal_mask=True)
    compiled = tf.function(
        lambda x, layer=layer: layer(x, x, attention_mask=mask,
                                     use_causal_mask=True),
        jit_compile=True)
    np.testing.assert_allclose(compiled(x), eager, rtol=1e-5, atol=1e-6)


def test_weights_have_the_same_names_built_directly_or_by_a_call():
  called = layers.TalkingHeadsAttention(2, 4, name="attention")
  called(tf.zeros([1, 3, 8]), tf.zeros([1, 3, 8]))
  built = layers.TalkingHeadsAttention(2, 4, name="attention")
  built.build_from_shapes([None, None, 8], [None, None, 8])
  assert [v.name for v in built.weights] == [v.name for v in called.weights]
  assert all(v.name.startswith("attention/") for v in built.weights)


def test_numpy_inputs_are_accepted():
  layer = layers.TalkingHeadsAttention(2, 4)
  query = np.random.RandomState(0).randn(1, 3, 8).astype(np.float32)
  memory = np.random.RandomState(1).randn(1, 5, 8)  # float64: cast
  assert layer(query, memory).shape == (1, 3, 8)
