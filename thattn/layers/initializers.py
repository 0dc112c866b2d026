"""Initializers that the paper's parameterization needs."""

import tf_keras


@tf_keras.utils.register_keras_serializable(package="thattn")
class ScaledInitializer(tf_keras.initializers.Initializer):
  """Multiplies another initializer's samples by a constant.

  thattn never scales the logits at run time. As in the paper (Section 3.3),
  Mesh TensorFlow and T5, the 1/sqrt(d_k) factor of Vaswani et al. is folded
  into the query kernel: P_q starts as `kernel_initializer * d_k**-0.5`, so
  the initial logits have the same scale as in scaled dot-product attention.
  """

  def __init__(self, initializer, scale):
    self.initializer = tf_keras.initializers.get(initializer)
    self.scale = float(scale)

  def __call__(self, shape, dtype=None, **kwargs):
    return fresh(self.initializer)(shape, dtype=dtype, **kwargs) * self.scale

  def get_config(self):
    return {"initializer": tf_keras.initializers.serialize(self.initializer),
            "scale": self.scale}

  @classmethod
  def from_config(cls, config):
    return cls(tf_keras.initializers.deserialize(config["initializer"]),
               config["scale"])


def fresh(initializer):
  """A new instance of `initializer`.

  tf-keras initializers without a seed return the same values every time the
  same instance is called, so one instance shared by P_k and P_v would start
  them equal. Every weight therefore gets its own copy.
  """
  initializer = tf_keras.initializers.get(initializer)
  return initializer.__class__.from_config(initializer.get_config())


def fan_in_normal(fan_in, scale=1.0):
  """Normal initializer with stddev `scale / sqrt(fan_in)`."""
  return tf_keras.initializers.RandomNormal(stddev=scale * fan_in ** -0.5)
