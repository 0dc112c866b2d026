"""Adafactor and its schedule, written once for both front ends'
optimizers, in plain Python.

`thattn.optimizers` (tf_keras) and `thattn.keras3.optimizers` (Keras 3)
compute the same Adafactor step and learning rate: what decides a step's
structure (which axes a variable's second moments are factored over,
`factored_axes`, and so its slots, `AdafactorStep.slot_shapes`), which
arguments are valid, and the arithmetic of a step (`AdafactorStep.
adafactor_update`) and of the schedule (`InverseSqrtScheduleRules.rate`)
are here, once, over a namespace of NumPy-named tensor functions (cast,
power, sqrt, rsqrt, square, mean, maximum, minimum, expand_dims): `keras.
ops` in Keras 3, `thattn.ops.tf_ops.TF_OPS` in TensorFlow. Each front end
adds its framework's glue: slots as its optimizer's variables, and their
assignment. `thattn.optimizers.Adafactor` documents the step.
"""

import numbers

from thattn.core import validation


def factored_axes(shape, min_dim_size_to_factor):
  """The (largest, second largest) axes to factor over, or None.

  As Mesh TensorFlow chooses them: a stable sort of the axes by decreasing
  size, so on ties the earlier axis counts as the larger. Factor only when
  the second largest axis has at least `min_dim_size_to_factor` elements.
  """
  shape = list(shape)
  if len(shape) < 2:
    return None
  by_size = sorted(range(len(shape)), key=lambda axis: -shape[axis])
  largest, second = by_size[:2]
  if shape[second] < min_dim_size_to_factor:
    return None
  return largest, second


def drop(shape, axis):
  """`shape` (a list) without `axis`."""
  shape = list(shape)
  return shape[:axis] + shape[axis + 1:]


def check_arguments(*, learning_rate, decay_rate, beta1, clipping_threshold,
                    min_dim_size_to_factor, epsilon1, epsilon2,
                    multiply_by_parameter_scale=True):
  """Raises ValueError naming the first bad Adafactor argument."""
  del multiply_by_parameter_scale  # any truth value
  if isinstance(learning_rate, numbers.Real) and not learning_rate >= 0:
    raise ValueError(f"learning_rate must be >= 0, got {learning_rate}.")
  if not 0.0 < decay_rate <= 1.0:
    raise ValueError(f"decay_rate (the exponent c in beta2 = 1 - t**-c) must "
                     f"be in (0, 1], got {decay_rate}.")
  validation.rate("beta1", beta1)
  if clipping_threshold is not None and not clipping_threshold > 0:
    raise ValueError(f"clipping_threshold must be > 0 or None, got "
                     f"{clipping_threshold}.")
  validation.positive_int("min_dim_size_to_factor", min_dim_size_to_factor)
  if not epsilon1 > 0:
    raise ValueError(f"epsilon1 must be > 0, got {epsilon1}.")
  if not epsilon2 >= 0:
    raise ValueError(f"epsilon2 must be >= 0, got {epsilon2}.")


def check_schedule(warmup_steps, total_steps, decay_fraction):
  """The inverse-square-root schedule's arguments, or ValueError."""
  validation.positive_int("warmup_steps", warmup_steps)
  validation.positive_int("total_steps", total_steps, optional=True)
  if not 0.0 < decay_fraction <= 1.0:
    raise ValueError(f"decay_fraction must be in (0, 1], got "
                     f"{decay_fraction}.")


# Adafactor's hyperparameters besides the learning rate, in its signature's
# order (the optimizers' get_config lists them).
HYPERPARAMETERS = ("decay_rate", "beta1", "clipping_threshold",
                   "multiply_by_parameter_scale", "min_dim_size_to_factor",
                   "epsilon1", "epsilon2")


def _rms(ops, x):
  return ops.sqrt(ops.mean(ops.square(x)))


class AdafactorStep:
  """Mixin for a front end's Adafactor optimizer: its hyperparameters, its
  slots' shapes and one step's arithmetic (see the module)."""

  def set_hyperparameters(self, learning_rate, *values):
    """Checks the arguments, the hyperparameters' `values` in
    `HYPERPARAMETERS`' order (ValueError naming the first bad one), and
    keeps the hyperparameters as attributes."""
    hyperparameters = dict(zip(HYPERPARAMETERS, values, strict=True))
    check_arguments(learning_rate=learning_rate, **hyperparameters)
    for name, value in hyperparameters.items():
      setattr(self, name, value)

  def hyperparameters_config(self):
    return {name: getattr(self, name) for name in HYPERPARAMETERS}

  def slot_shapes(self, shape):
    """{slot: shape} of a variable of `shape`: `vr` (without the largest
    axis) and `vc` (without the second) if factored, else `v`; and `m`
    with momentum."""
    shape = list(shape)
    axes = factored_axes(shape, self.min_dim_size_to_factor)
    if axes:
      shapes = {"vr": drop(shape, axes[0]), "vc": drop(shape, axes[1])}
    else:
      shapes = {"v": shape}
    if self.beta1:
      shapes["m"] = shape
    return shapes

  def adafactor_update(self, ops, grad, old_value, step, learning_rate,
                       slots):
    """One step for one variable, in the compute dtype: the `subtrahend` to
    take from the variable and each slot's new value, `(subtrahend,
    {slot: value})`. `step` is t (1 at the first step), `old_value` the
    variable before the step, `slots` the current slot values."""
    decay = 1.0 - ops.power(step, -self.decay_rate)
    mixing = 1.0 - decay
    update_scale = learning_rate
    if self.multiply_by_parameter_scale:
      update_scale = ops.maximum(_rms(ops, old_value),
                                 self.epsilon2) * learning_rate
    grad_squared = ops.square(grad) + self.epsilon1
    axes = factored_axes(list(old_value.shape), self.min_dim_size_to_factor)
    new = {}
    if axes:
      largest, second = axes
      new["vr"] = (slots["vr"] * decay +
                   ops.mean(grad_squared, axis=largest) * mixing)
      new["vc"] = (slots["vc"] * decay +
                   ops.mean(grad_squared, axis=second) * mixing)
      # v ~ vr * vc / mean_d1(vr): mean_d1(vr) is the mean of g2 over both
      # factored axes. `second` indexes the full shape; vr lacks `largest`.
      second_in_vr = second - 1 if second > largest else second
      vr_mean = ops.mean(new["vr"], axis=second_in_vr, keepdims=True)
      update = (grad *
                ops.expand_dims(ops.rsqrt(new["vr"] / vr_mean), largest) *
                ops.expand_dims(ops.rsqrt(new["vc"]), second))
    else:
      new["v"] = slots["v"] * decay + grad_squared * mixing
      update = grad * ops.rsqrt(new["v"])
    if self.clipping_threshold is not None:
      update = update / ops.maximum(
          1.0, _rms(ops, update) / self.clipping_threshold)
    subtrahend = update * update_scale
    if self.beta1:
      subtrahend = slots["m"] * self.beta1 + subtrahend * (1.0 - self.beta1)
      new["m"] = subtrahend
    return subtrahend, new


class InverseSqrtScheduleRules:
  """Mixin for a front end's `LearningRateSchedule`: T5's inverse-square-
  root schedule with a final linear decay. At step s, with warmup w, total
  T and decay fraction f:

      scale * rsqrt(max(s, w)) * min(1, (T - s) / (f * T)),  clamped at 0.
  """

  def __init__(self, warmup_steps, total_steps=None, decay_fraction=0.1,
               scale=1.0):
    super().__init__()
    check_schedule(warmup_steps, total_steps, decay_fraction)
    self.warmup_steps = warmup_steps
    self.total_steps = total_steps
    self.decay_fraction = decay_fraction
    self.scale = scale

  def rate(self, ops, step):
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
