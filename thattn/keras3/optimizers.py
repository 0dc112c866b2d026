"""Adafactor and the inverse-square-root schedule in Keras 3 (keras.ops).

`thattn.optimizers.Adafactor` and `InverseSqrtSchedule` (tf_keras) for the
Keras 3 backends: the same step, in the same order, with the same
arguments (see `thattn.optimizers.Adafactor` for the formulas; the rules
that decide the slots and check the arguments are `thattn.
adafactor_rules`, shared).

Why not Keras 3's own `keras.optimizers.Adafactor`: it is a different
optimizer (read from Keras 3.15's source): it factors every variable of
rank >= 2 over its last two axes, with no minimum size, where Mesh
TensorFlow and the paper's runs factor the two largest axes only when both
have at least 128 elements (so the talking-heads projections P_l [h_k, h]
and T5's relative position bias stay unfactored); it always caps the step
size at min(lr, 1/sqrt(t)) (`relative_step=False` does not remove the
cap); it has no momentum; and it computes in the variable's dtype.
"""

import keras
from keras import ops

from thattn import adafactor_rules


@keras.saving.register_keras_serializable(package="thattn")
class InverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
  """T5's inverse-square-root schedule with a final linear decay:

      scale * rsqrt(max(s, w)) * min(1, (T - s) / (f * T)),  clamped at 0.
  """

  def __init__(self, warmup_steps, total_steps=None, decay_fraction=0.1,
               scale=1.0):
    adafactor_rules.check_schedule(warmup_steps, total_steps, decay_fraction)
    self.warmup_steps = warmup_steps
    self.total_steps = total_steps
    self.decay_fraction = decay_fraction
    self.scale = scale

  def __call__(self, step):
    step = ops.cast(step, "float32")
    rate = self.scale * ops.rsqrt(ops.maximum(step,
                                              float(self.warmup_steps)))
    if self.total_steps is not None:
      total = float(self.total_steps)
      decay = ops.minimum(1.0, (total - step) / (self.decay_fraction * total))
      rate = rate * ops.maximum(decay, 0.0)
    return rate

  def get_config(self):
    return {"warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "decay_fraction": self.decay_fraction, "scale": self.scale}


def _rms(x):
  return ops.sqrt(ops.mean(ops.square(x)))


def _slot_layout(variable, dropped_axis=None):
  """A slot's `keras.distribution.TensorLayout` under a distribution: its
  variable's, without `dropped_axis` for a factored row or column
  statistic; None without one. (Keras's own optimizers read the variable's
  layout from `_layout` too, in `add_variable_from_reference`.)"""
  layout = getattr(variable, "_layout", None)
  if layout is None or not hasattr(layout, "axes"):
    return None
  axes = list(layout.axes)
  if dropped_axis is not None:
    del axes[dropped_axis]
  return keras.distribution.TensorLayout(tuple(axes), layout.device_mesh)


def _compute_dtype(variable):
  # Slots and arithmetic in float32 (float64 stays float64), as in mtf.
  return "float64" if variable.dtype == "float64" else "float32"


@keras.saving.register_keras_serializable(package="thattn")
class Adafactor(keras.optimizers.Optimizer):
  """Adafactor (Shazeer & Stern, 2018) as Mesh TensorFlow implements it, in
  Keras 3: `thattn.optimizers.Adafactor`'s arguments and step.

  Slots per variable: `vr` and `vc` for a factored one (its two largest
  axes both >= `min_dim_size_to_factor`), else `v`; and `m` with
  `beta1 > 0`. `learning_rate` is a float or a Keras 3
  `LearningRateSchedule` (such as `InverseSqrtSchedule`), evaluated at
  `iterations` (t - 1) as Keras does.
  """

  def __init__(self, learning_rate, decay_rate=0.8, beta1=0.0,
               clipping_threshold=1.0, multiply_by_parameter_scale=True,
               min_dim_size_to_factor=128, epsilon1=1e-30, epsilon2=1e-3,
               name="adafactor", **kwargs):
    adafactor_rules.check_arguments(
        learning_rate=learning_rate, decay_rate=decay_rate, beta1=beta1,
        clipping_threshold=clipping_threshold,
        min_dim_size_to_factor=min_dim_size_to_factor, epsilon1=epsilon1,
        epsilon2=epsilon2)
    if isinstance(learning_rate, int):
      learning_rate = float(learning_rate)  # Keras 3 takes floats only
    super().__init__(learning_rate=learning_rate, name=name, **kwargs)
    self.decay_rate = decay_rate
    self.beta1 = beta1
    self.clipping_threshold = clipping_threshold
    self.multiply_by_parameter_scale = multiply_by_parameter_scale
    self.min_dim_size_to_factor = min_dim_size_to_factor
    self.epsilon1 = epsilon1
    self.epsilon2 = epsilon2

  def build(self, var_list):
    """Creates each variable's slots, in var_list order."""
    if self.built:
      return
    super().build(var_list)
    self._slots = []
    for variable in var_list:
      shape = list(variable.shape)
      dtype = _compute_dtype(variable)
      axes = adafactor_rules.factored_axes(shape, self.min_dim_size_to_factor)
      slot_shapes = {}
      if axes:
        largest, second = axes
        slot_shapes["vr"] = adafactor_rules.drop(shape, largest)
        slot_shapes["vc"] = adafactor_rules.drop(shape, second)
      else:
        slot_shapes["v"] = shape
      if self.beta1:
        slot_shapes["m"] = shape
      dropped = {"vr": axes[0], "vc": axes[1]} if axes else {}
      self._slots.append({
          slot: self.add_variable(
              tuple(slot_shape), dtype=dtype, name=f"{variable.name}_{slot}",
              layout=_slot_layout(variable, dropped.get(slot)))
          for slot, slot_shape in slot_shapes.items()})

  def update_step(self, gradient, variable, learning_rate):
    """One Adafactor step for one variable (thattn.optimizers' order)."""
    slots = self._slots[self._get_variable_index(variable)]
    dtype = _compute_dtype(variable)
    grad = ops.cast(gradient, dtype)
    old_value = ops.cast(variable, dtype)
    step = ops.cast(self.iterations, dtype) + 1.0  # t = 1 at the first step
    decay = 1.0 - ops.power(step, -self.decay_rate)
    mixing = 1.0 - decay
    update_scale = ops.cast(learning_rate, dtype)
    if self.multiply_by_parameter_scale:
      update_scale = ops.maximum(_rms(old_value), self.epsilon2) * update_scale
    grad_squared = ops.square(grad) + self.epsilon1
    axes = adafactor_rules.factored_axes(list(variable.shape),
                                         self.min_dim_size_to_factor)
    if axes:
      largest, second = axes
      new_vr = (slots["vr"] * decay +
                ops.mean(grad_squared, axis=largest) * mixing)
      new_vc = (slots["vc"] * decay +
                ops.mean(grad_squared, axis=second) * mixing)
      self.assign(slots["vr"], new_vr)
      self.assign(slots["vc"], new_vc)
      # v ~ vr * vc / mean_d1(vr); vr lacks `largest`, so d1 moves down one
      # place when it came after it.
      second_in_vr = second - 1 if second > largest else second
      vr_mean = ops.mean(new_vr, axis=second_in_vr, keepdims=True)
      update = (grad * ops.expand_dims(ops.rsqrt(new_vr / vr_mean), largest)
                * ops.expand_dims(ops.rsqrt(new_vc), second))
    else:
      new_v = slots["v"] * decay + grad_squared * mixing
      self.assign(slots["v"], new_v)
      update = grad * ops.rsqrt(new_v)
    if self.clipping_threshold is not None:
      update = update / ops.maximum(
          1.0, _rms(update) / self.clipping_threshold)
    subtrahend = update * update_scale
    if self.beta1:
      subtrahend = slots["m"] * self.beta1 + subtrahend * (1.0 - self.beta1)
      self.assign(slots["m"], subtrahend)
    self.assign_sub(variable, ops.cast(subtrahend, variable.dtype))

  def get_config(self):
    config = super().get_config()
    config.update({
        "decay_rate": self.decay_rate,
        "beta1": self.beta1,
        "clipping_threshold": self.clipping_threshold,
        "multiply_by_parameter_scale": self.multiply_by_parameter_scale,
        "min_dim_size_to_factor": self.min_dim_size_to_factor,
        "epsilon1": self.epsilon1,
        "epsilon2": self.epsilon2,
    })
    return config
