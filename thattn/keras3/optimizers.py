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

from thattn.ops import adafactor


@keras.saving.register_keras_serializable(package="thattn")
class InverseSqrtSchedule(adafactor.InverseSqrtScheduleRules,
                          keras.optimizers.schedules.LearningRateSchedule):
  """T5's inverse-square-root schedule with a final linear decay (`thattn.
  adafactor.InverseSqrtScheduleRules` in `keras.ops`):

      scale * rsqrt(max(s, w)) * min(1, (T - s) / (f * T)),  clamped at 0.
  """

  def __call__(self, step):
    return self.rate(ops, step)


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
class Adafactor(adafactor.AdafactorStep, keras.optimizers.Optimizer):
  """Adafactor (Shazeer & Stern, 2018) as Mesh TensorFlow implements it, in
  Keras 3: `thattn.optimizers.Adafactor`'s arguments and step (the step's
  arithmetic is `thattn.ops.adafactor.AdafactorStep`'s, in `keras.ops`).

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
    # Keras 3 wants its __init__ first; it takes a rate of any sign, so
    # the checks after it still come before any use.
    super().__init__(
        learning_rate=(float(learning_rate) if isinstance(learning_rate, int)
                       else learning_rate),  # Keras 3 takes floats only
        name=name, **kwargs)
    self.set_hyperparameters(  # in adafactor.HYPERPARAMETERS' order
        learning_rate, decay_rate, beta1, clipping_threshold,
        multiply_by_parameter_scale, min_dim_size_to_factor, epsilon1,
        epsilon2)

  def build(self, var_list):
    """Creates each variable's slots, in var_list order."""
    if self.built:
      return
    super().build(var_list)
    self._slots = []
    for variable in var_list:
      axes = adafactor.factored_axes(list(variable.shape),
                                           self.min_dim_size_to_factor)
      dropped = {"vr": axes[0], "vc": axes[1]} if axes else {}
      self._slots.append({
          slot: self.add_variable(
              tuple(shape), dtype=_compute_dtype(variable),
              name=f"{variable.name}_{slot}",
              layout=_slot_layout(variable, dropped.get(slot)))
          for slot, shape in self.slot_shapes(variable.shape).items()})

  def update_step(self, gradient, variable, learning_rate):
    """One Adafactor step for one variable (thattn.optimizers' order)."""
    slots = self._slots[self._get_variable_index(variable)]
    dtype = _compute_dtype(variable)
    subtrahend, new_slots = self.adafactor_update(
        ops, ops.cast(gradient, dtype), ops.cast(variable, dtype),
        ops.cast(self.iterations, dtype) + 1.0,  # t = 1 at the first step
        ops.cast(learning_rate, dtype), {name: slot.value for name, slot
                                         in slots.items()})
    for name, value in new_slots.items():
      self.assign(slots[name], value)
    self.assign_sub(variable, ops.cast(subtrahend, variable.dtype))

  def get_config(self):
    return dict(super().get_config(), **self.hyperparameters_config())
