"""thattn.core.initial_weights: Keras's distributions, drawn with NumPy from
a seed and a weight's name, checked against their formulas."""

import math

import numpy as np
import pytest

from thattn.core import initial_weights

# Keras's fans of a kernel: fan_in 8 * 64 = 512, fan_out 32 * 64 = 2048.
SHAPE = (64, 8, 32)
N = math.prod(SHAPE)


def _sample(class_name, shape=SHAPE, name="block_0/attention/query/kernel",
            seed=3, **config):
  return initial_weights.sample({"class_name": class_name, "config": config},
                                shape, seed, name)


def _close(value, want, relative=0.03):
  assert abs(value - want) <= relative * abs(want), (value, want)


def test_normal_and_truncated_normal_have_their_stddevs():
  values = _sample("RandomNormal", mean=0.5, stddev=0.02)
  assert values.dtype == np.float32 and values.shape == SHAPE
  _close(values.mean(), 0.5, 0.01)
  _close(values.std(), 0.02)
  truncated = _sample("TruncatedNormal", stddev=0.02)
  assert np.abs(truncated).max() <= 0.04
  # A unit normal cut at +-2 has stddev 0.8796.
  _close(truncated.std(), 0.02 * 0.87962566103423978)


def test_uniform_fills_its_interval():
  values = _sample("RandomUniform", minval=-0.1, maxval=0.3)
  assert values.min() >= -0.1 and values.max() < 0.3
  _close(values.mean(), 0.1, 0.02)
  # "uniform", Keras's Embedding default: [-0.05, 0.05).
  embedding = initial_weights.sample("uniform", (1000,), 0, "embeddings")
  assert -0.05 <= embedding.min() and embedding.max() < 0.05


@pytest.mark.parametrize("class_name,variance", [
    ("GlorotUniform", 2.0 / (512 + 2048)), ("GlorotNormal", 2.0 / (512 + 2048)),
    ("HeNormal", 2.0 / 512), ("LecunUniform", 1.0 / 512)])
def test_variance_scaling_forms_have_keras_s_variances(class_name, variance):
  values = _sample(class_name)
  _close(values.var(), variance, 0.05)
  if class_name.endswith("Uniform"):
    assert np.abs(values).max() <= math.sqrt(3 * variance)


def test_variance_scaling_reads_scale_mode_and_distribution():
  values = _sample("VarianceScaling", scale=2.0, mode="fan_out",
                   distribution="untruncated_normal")
  _close(values.var(), 2.0 / 2048, 0.05)
  truncated = _sample("VarianceScaling", scale=1.0, mode="fan_in",
                      distribution="truncated_normal")
  _close(truncated.var(), 1.0 / 512, 0.05)  # the truncation made up for
  with pytest.raises(ValueError, match="mode 'fan_max'"):
    _sample("VarianceScaling", mode="fan_max")


def test_constants_and_thattn_s_scaled_initializer():
  np.testing.assert_array_equal(_sample("Zeros", (3,)), np.zeros(3))
  np.testing.assert_array_equal(_sample("Ones", (3,)), np.ones(3))
  np.testing.assert_array_equal(_sample("Constant", (2,), value=0.5),
                                [0.5, 0.5])
  base = {"class_name": "RandomNormal", "config": {"stddev": 1.0}}
  scaled = initial_weights.sample(
      {"class_name": "thattn>ScaledInitializer",
       "config": {"initializer": base, "scale": 0.125}}, SHAPE, 3, "q")
  # The same draw as the base initializer's, times the scale.
  np.testing.assert_allclose(scaled,
                             0.125 * initial_weights.sample(base, SHAPE, 3,
                                                            "q"),
                             rtol=1e-6)


def test_a_draw_depends_on_the_seed_and_the_shared_name_only():
  first = _sample("RandomNormal", name="block_0/attention/attention/key:0")
  # tf_keras's name and Keras 3's path of one weight draw the same values.
  np.testing.assert_array_equal(
      first, _sample("RandomNormal", name="block_0/attention/key"))
  assert not np.array_equal(first, _sample("RandomNormal",
                                           name="block_0/attention/value"))
  assert not np.array_equal(first, _sample("RandomNormal", seed=4,
                                           name="block_0/attention/key"))


def test_unknown_initializers_are_refused_by_name():
  with pytest.raises(ValueError, match="Orthogonal is not one thattn draws"):
    _sample("Orthogonal")
  with pytest.raises(ValueError, match="'identity' is not one thattn draws"):
    initial_weights.sample("identity", (2, 2), 0, "w")
  with pytest.raises(ValueError, match="class_name"):
    initial_weights.sample({"config": {}}, (2,), 0, "w")
