"""A run's initial weights, drawn with NumPy from its seed and each weight's
name, so that both Keras front ends start from the same values without one
building the other.

Plain Python and NumPy. A front end walks its model for (weight, its
initializer) pairs (`thattn.models.initial_weights` on tf_keras,
`thattn.keras3.models.initial_weights` on Keras 3) and assigns
`sample(initializer config, shape, seed, name)` to each. The draw of one
weight depends only on the seed, the weight's shared name
(`weight_names.checkpoint_key`) and its shape: the order in which a front
end makes its weights (which differs between the fronts' talking heads) and
the frameworks' random number generators play no part.

The distributions are Keras's, read from an initializer's class name and
config (the same on tf_keras and Keras 3): RandomNormal, TruncatedNormal
(redrawn beyond two standard deviations, as TensorFlow's and JAX's truncated
normals are), RandomUniform, VarianceScaling and its named forms (Glorot,
He, LeCun), Zeros, Ones, Constant, and thattn's ScaledInitializer. An
initializer it does not know is a ValueError naming it.
"""

import hashlib
import math

import numpy as np

from thattn.core import weight_names

# stddev of a unit normal truncated to [-2, 2]: VarianceScaling's
# truncated_normal divides by it, so the truncated draw keeps its variance.
_TRUNCATED_STDDEV = 0.87962566103423978

# The named VarianceScaling forms: (scale, mode, distribution).
_VARIANCE_SCALING_FORMS = {
    "GlorotUniform": (1.0, "fan_avg", "uniform"),
    "GlorotNormal": (1.0, "fan_avg", "truncated_normal"),
    "HeUniform": (2.0, "fan_in", "uniform"),
    "HeNormal": (2.0, "fan_in", "truncated_normal"),
    "LecunUniform": (1.0, "fan_in", "uniform"),
    "LecunNormal": (1.0, "fan_in", "truncated_normal"),
}

# The Keras names of string initializers ("zeros", "glorot_uniform", ...).
_STRING_FORMS = {
    "zeros": "Zeros", "ones": "Ones", "uniform": "RandomUniform",
    "random_uniform": "RandomUniform", "normal": "RandomNormal",
    "random_normal": "RandomNormal", "truncated_normal": "TruncatedNormal",
    "glorot_uniform": "GlorotUniform", "glorot_normal": "GlorotNormal",
    "he_uniform": "HeUniform", "he_normal": "HeNormal",
    "lecun_uniform": "LecunUniform", "lecun_normal": "LecunNormal",
}


def generator(seed, name):
  """The NumPy generator of the weight `name` (a tf_keras name or Keras 3
  path) in a run seeded `seed`: the same on both front ends."""
  key = weight_names.checkpoint_key(name)
  digest = hashlib.sha256(key.encode("utf-8")).digest()
  words = [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]
  return np.random.default_rng(np.random.SeedSequence([int(seed), *words]))


def sample(config, shape, seed, name):
  """float32 NumPy [shape] of the initializer `config`, for the weight
  `name` in a run seeded `seed`.

  Args:
    config: an initializer as Keras serializes it, a dict with
      `class_name` and `config` (either front end's form; a registered
      name such as 'thattn>ScaledInitializer' is read by its last part),
      or a string Keras accepts ('zeros', 'glorot_uniform').
    shape: the weight's shape.
    seed: the run's seed (an int).
    name: the weight's name or path (`weight_names.checkpoint_key` keys it).
  Raises:
    ValueError naming an initializer this module does not draw.
  """
  shape = tuple(int(size) for size in shape)
  values = _draw(_parsed(config), shape, generator(seed, name))
  return np.asarray(values, dtype=np.float32).reshape(shape)


def _parsed(config):
  """(class name, config dict) of a serialized initializer."""
  if isinstance(config, str):
    if config not in _STRING_FORMS:
      raise ValueError(f"Initializer {config!r} is not one thattn draws; "
                       f"expected one of {', '.join(sorted(_STRING_FORMS))} "
                       "or a serialized initializer.")
    return _STRING_FORMS[config], {}
  if not isinstance(config, dict) or "class_name" not in config:
    raise ValueError(f"An initializer must be serialized as a dict with a "
                     f"class_name, or a string; got {config!r}.")
  class_name = config["class_name"].split(">")[-1]
  return class_name, dict(config.get("config") or {})


def _fans(shape):
  """(fan_in, fan_out) as Keras's VarianceScaling computes them."""
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive_field = math.prod(shape[:-2])
  return shape[-2] * receptive_field, shape[-1] * receptive_field


def _truncated_normal(rng, shape, stddev):
  """Unit normals redrawn until every value lies within two standard
  deviations, times `stddev`."""
  values = rng.standard_normal(shape)
  outside = np.abs(values) > 2.0
  while outside.any():
    values[outside] = rng.standard_normal(int(outside.sum()))
    outside = np.abs(values) > 2.0
  return values * stddev


def _draw(parsed, shape, rng):
  class_name, config = parsed
  if class_name == "Zeros":
    return np.zeros(shape)
  if class_name == "Ones":
    return np.ones(shape)
  if class_name == "Constant":
    return np.full(shape, float(config.get("value", 0.0)))
  if class_name == "RandomNormal":
    return (float(config.get("mean", 0.0)) +
            float(config.get("stddev", 0.05)) * rng.standard_normal(shape))
  if class_name == "TruncatedNormal":
    return float(config.get("mean", 0.0)) + _truncated_normal(
        rng, shape, float(config.get("stddev", 0.05)))
  if class_name == "RandomUniform":
    return rng.uniform(float(config.get("minval", -0.05)),
                       float(config.get("maxval", 0.05)), shape)
  if class_name in _VARIANCE_SCALING_FORMS:
    scale, mode, distribution = _VARIANCE_SCALING_FORMS[class_name]
    return _variance_scaling(rng, shape, scale, mode, distribution)
  if class_name == "VarianceScaling":
    return _variance_scaling(
        rng, shape, float(config.get("scale", 1.0)),
        config.get("mode", "fan_in"),
        config.get("distribution", "truncated_normal"))
  if class_name == "ScaledInitializer":  # thattn's, on either front end
    return float(config["scale"]) * _draw(_parsed(config["initializer"]),
                                          shape, rng)
  raise ValueError(
      f"Initializer {class_name} is not one thattn draws a run's initial "
      f"weights from; expected one of Zeros, Ones, Constant, RandomNormal, "
      f"TruncatedNormal, RandomUniform, VarianceScaling, "
      f"{', '.join(_VARIANCE_SCALING_FORMS)} or ScaledInitializer.")


def _variance_scaling(rng, shape, scale, mode, distribution):
  fan_in, fan_out = _fans(shape)
  fans = {"fan_in": fan_in, "fan_out": fan_out,
          "fan_avg": (fan_in + fan_out) / 2.0}
  if mode not in fans:
    raise ValueError(f"VarianceScaling mode {mode!r}; expected one of "
                     f"{', '.join(fans)}.")
  variance = scale / max(1.0, fans[mode])
  if distribution == "truncated_normal":
    return _truncated_normal(rng, shape,
                             math.sqrt(variance) / _TRUNCATED_STDDEV)
  if distribution in ("untruncated_normal", "normal"):
    return math.sqrt(variance) * rng.standard_normal(shape)
  if distribution == "uniform":
    limit = math.sqrt(3.0 * variance)
    return rng.uniform(-limit, limit, shape)
  raise ValueError(f"VarianceScaling distribution {distribution!r}; "
                   "expected truncated_normal, untruncated_normal or "
                   "uniform.")
