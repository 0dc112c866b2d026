"""Learning-rate schedules (and, later, Adafactor) for thattn's trainers."""

import tensorflow as tf
import tf_keras


@tf_keras.utils.register_keras_serializable(package="thattn")
class InverseSqrtSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
  """T5's inverse-square-root schedule with a final linear decay.

  At step s, with warmup w, total T and decay fraction f:

      scale * rsqrt(max(s, w)) * min(1, (T - s) / (f * T)),  clamped at 0.

  The rate is constant for the first w steps, falls as 1/sqrt(s), and over
  the final f*T steps decays linearly to 0, as the talking-heads paper's T5
  runs do ("we also decay the learning rate linearly for the final 10
  percent of the training steps"). With `total_steps=None` there is no final
  decay.
  """

  def __init__(self, warmup_steps, total_steps=None, decay_fraction=0.1,
               scale=1.0):
    if warmup_steps <= 0:
      raise ValueError(f"warmup_steps must be positive, got {warmup_steps}.")
    if total_steps is not None and total_steps <= 0:
      raise ValueError(f"total_steps must be positive or None, got "
                       f"{total_steps}.")
    if not 0.0 < decay_fraction <= 1.0:
      raise ValueError(f"decay_fraction must be in (0, 1], got "
                       f"{decay_fraction}.")
    self.warmup_steps = warmup_steps
    self.total_steps = total_steps
    self.decay_fraction = decay_fraction
    self.scale = scale

  def __call__(self, step):
    step = tf.cast(step, tf.float32)
    rate = self.scale * tf.math.rsqrt(tf.maximum(step, self.warmup_steps))
    if self.total_steps is not None:
      total = float(self.total_steps)
      decay = tf.minimum(1.0, (total - step) / (self.decay_fraction * total))
      rate *= tf.maximum(decay, 0.0)
    return rate

  def get_config(self):
    return {"warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay_fraction": self.decay_fraction, "scale": self.scale}
