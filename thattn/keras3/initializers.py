"""The Keras 3 layers' initializers: fresh copies, and P_q's scaled one."""

import keras


def fresh(initializer):
  """A new instance of `initializer`, so no two weights share one (an
  unseeded Keras initializer instance may return the same values twice)."""
  if initializer is None:
    return None
  initializer = keras.initializers.get(initializer)
  if isinstance(initializer, ScaledInitializer):
    # Not through get_config: Keras's serializer imports TensorFlow where
    # it is installed, even on JAX and PyTorch.
    return ScaledInitializer(fresh(initializer.initializer),
                             initializer.scale)
  return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="thattn")
class ScaledInitializer(keras.initializers.Initializer):
  """Another initializer's samples times a constant: P_q starts as
  `kernel_initializer * d_k**-0.5`, the 1/sqrt(d_k) never applied at run
  time (as `thattn.layers.ScaledInitializer`)."""

  def __init__(self, initializer, scale):
    self.initializer = keras.initializers.get(initializer)
    self.scale = float(scale)

  def __call__(self, shape, dtype=None):
    return fresh(self.initializer)(shape, dtype=dtype) * self.scale

  def get_config(self):
    return {"initializer":
                keras.saving.serialize_keras_object(self.initializer),
            "scale": self.scale}

  @classmethod
  def from_config(cls, config):
    return cls(keras.saving.deserialize_keras_object(config["initializer"]),
               config["scale"])
