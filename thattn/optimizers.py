"""Adafactor and the inverse-square-root schedule for thattn's trainers.

The step's and the schedule's arithmetic are written once for both front
ends in `thattn.ops.adafactor` (Keras 3's optimizers: `thattn.keras3.
optimizers`); this module adds tf_keras's glue: slots made from their
variables (colocated under a distribution strategy, laid out under
DTensor) and assigned.
"""

from thattn.core import requirements  # pylint: disable=g-bad-import-order

# Before the first TensorFlow import: names the pip extra if it is missing.
requirements.require("thattn.optimizers", ("tensorflow", "tf_keras"))

import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tf_keras  # pylint: disable=g-import-not-at-top

from thattn.ops import adafactor  # pylint: disable=g-import-not-at-top
from thattn.ops import tf_ops  # pylint: disable=g-import-not-at-top


@tf_keras.utils.register_keras_serializable(package="thattn")
class InverseSqrtSchedule(adafactor.InverseSqrtScheduleRules,
                          tf_keras.optimizers.schedules.LearningRateSchedule):
  """T5's inverse-square-root schedule with a final linear decay.

  At step s, with warmup w, total T and decay fraction f:

      scale * rsqrt(max(s, w)) * min(1, (T - s) / (f * T)),  clamped at 0.

  The rate is constant for the first w steps, falls as 1/sqrt(s), and over
  the final f*T steps decays linearly to 0, as the talking-heads paper's T5
  runs do ("we also decay the learning rate linearly for the final 10
  percent of the training steps"). With `total_steps=None` there is no final
  decay. (The computation: `thattn.ops.adafactor.
  InverseSqrtScheduleRules`.)
  """

  def __call__(self, step):
    return self.rate(tf_ops.TF_OPS, step)


def _true_dtype(variable):
  # Under a mixed precision policy a variable reports its cast dtype.
  return tf.as_dtype(getattr(variable, "true_dtype", variable.dtype))


def _compute_dtype(variable):
  # Mesh TF does the arithmetic and keeps the slots in float32, whatever the
  # variable's dtype. We do the same, except that float64 stays float64.
  return tf.float64 if _true_dtype(variable) == tf.float64 else tf.float32


@tf_keras.utils.register_keras_serializable(package="thattn")
class Adafactor(adafactor.AdafactorStep, tf_keras.optimizers.Optimizer):
  """Adafactor (Shazeer & Stern, 2018), as Mesh TensorFlow implements it.

  Factored second moments: for a variable of rank >= 2 whose two largest axes
  (d0 the largest, d1 the second; ties go to the earlier axis) both have at
  least `min_dim_size_to_factor` elements, the optimizer keeps two slots
  instead of a full second-moment estimate. `vr` has the variable's shape
  without d0 and `vc` the shape without d1, so an n x m kernel costs n + m
  floats. Other variables keep a full slot `v`. With `beta1 > 0` every
  variable also keeps a full momentum slot `m`. Slots and arithmetic are
  float32 (float64 for float64 variables), as in mtf. (tf-keras's own
  Adafactor keeps a full-size `v` for every variable and factors only the
  last two axes, so it saves no memory.)

  One step, in Mesh TensorFlow's order (t = iterations + 1, so t = 1 at the
  first step; g the gradient; w the variable before the step; means and RMS
  over all elements unless axes are named):

      g2       = g**2 + epsilon1
      beta2    = 1 - t**(-decay_rate)            # 0 at t = 1: v starts at g2
      scale    = lr * max(epsilon2, RMS(w))      # just lr without
                                                 # multiply_by_parameter_scale
      factored:   vr = beta2 * vr + (1 - beta2) * mean_d0(g2)
                  vc = beta2 * vc + (1 - beta2) * mean_d1(g2)
                  u  = g * rsqrt(vr / mean_d1(vr)) * rsqrt(vc)
      otherwise:  v  = beta2 * v + (1 - beta2) * g2
                  u  = g * rsqrt(v)
      u        = u / max(1, RMS(u) / clipping_threshold)
      delta    = u * scale
      if beta1:   m = beta1 * m + (1 - beta1) * delta;  delta = m
      w        = w - delta

  Like Mesh TensorFlow (and unlike Adam), the momentum averages the update
  after the learning rate and parameter scale are applied, and the parameter
  scale is the RMS of the variable before this step.

  Departures from `mesh_tensorflow.optimize.AdafactorOptimizer`:
  - `decay_rate` is the exponent c of mtf's `adafactor_decay_rate_pow`
    (beta2 = 1 - t**-c), which is mtf's default schedule; mtf's own
    `decay_rate` argument takes the resulting tensor.
  - `learning_rate` is required: a float or a
    `tf_keras.optimizers.schedules.LearningRateSchedule` (such as
    `InverseSqrtSchedule`), evaluated at `iterations` as tf-keras does. mtf's
    default with parameter scaling, min(0.01, rsqrt(t)), is
    `InverseSqrtSchedule(warmup_steps=10**4)` one step later.
  - mtf's `factored`, `stacked_dim_names` and `exclude_from_parameter_scale`
    are not offered; a large `min_dim_size_to_factor` turns factoring off.
  - Sparse gradients are made dense first; the update is dense, as in mtf.

  Args:
    learning_rate: a float >= 0 or a `LearningRateSchedule`.
    decay_rate: the exponent c in beta2 = 1 - t**-c, in (0, 1].
    beta1: momentum coefficient in [0, 1); 0 means no momentum slot.
    clipping_threshold: the update clipping threshold d > 0, or None for no
      clipping.
    multiply_by_parameter_scale: scale the step by max(epsilon2, RMS(w)).
    min_dim_size_to_factor: factor only when the two largest axes are at
      least this size.
    epsilon1: added to the squared gradient (> 0).
    epsilon2: the smallest parameter scale (>= 0), so that zero-initialized
      variables can move.
    name, **kwargs: passed to `tf_keras.optimizers.Optimizer` (`clipnorm`,
      `weight_decay`, `use_ema`, `jit_compile`, ...).
  """

  def __init__(self, learning_rate, decay_rate=0.8, beta1=0.0,
               clipping_threshold=1.0, multiply_by_parameter_scale=True,
               min_dim_size_to_factor=128, epsilon1=1e-30, epsilon2=1e-3,
               name="Adafactor", **kwargs):
    self.set_hyperparameters(  # in adafactor.HYPERPARAMETERS' order
        learning_rate, decay_rate, beta1, clipping_threshold,
        multiply_by_parameter_scale, min_dim_size_to_factor, epsilon1,
        epsilon2)
    super().__init__(name=name, **kwargs)
    self._learning_rate = self._build_learning_rate(learning_rate)

  def build(self, var_list):
    """Creates each variable's slots: `vr` and `vc`, or `v`; and `m`."""
    super().build(var_list)
    if getattr(self, "_built", False):
      return
    self._built = True
    # One dict of slots per variable, in var_list order (the base class's
    # index); also tracked for checkpoints under `_slots/<index>/<slot>`.
    self._slots = [
        {slot: self._add_slot(variable, slot, shape) for slot, shape in
         self.slot_shapes(variable.shape.as_list()).items()}
        for variable in var_list]

  def _add_slot(self, variable, slot_name, shape):
    dtype = _compute_dtype(variable)
    if _true_dtype(variable) != dtype:
      name = f"{slot_name}/{variable.name.split(':')[0]}"
      return self.add_variable(shape, dtype=dtype, name=name)
    # From the reference: colocated with the variable under a distribution
    # strategy. A full-size slot also takes the variable's DTensor layout; a
    # factored one is given its own zeros (replicated under DTensor).
    if shape == variable.shape.as_list():
      return self.add_variable_from_reference(variable, slot_name)
    return self.add_variable_from_reference(
        variable, slot_name, initial_value=tf.zeros(shape, dtype))

  def update_step(self, gradient, variable):
    """One Adafactor step for one variable, in the order the class documents
    (the arithmetic: `thattn.ops.adafactor.AdafactorStep`)."""
    slots = self._slots[self._index_dict[self._var_key(variable)]]
    dtype = _compute_dtype(variable)
    subtrahend, new_slots = self.adafactor_update(
        tf_ops.TF_OPS, tf.cast(tf.convert_to_tensor(gradient), dtype),
        tf.cast(tf.convert_to_tensor(variable), dtype),
        tf.cast(self.iterations, dtype) + 1.0,  # t = 1 at the first step
        tf.cast(self.learning_rate, dtype),
        {name: tf.convert_to_tensor(slot) for name, slot in slots.items()})
    for name, value in new_slots.items():
      slots[name].assign(value)
    variable.assign_sub(tf.cast(subtrahend, _true_dtype(variable)))

  def get_config(self):
    config = super().get_config()
    config.update(
        learning_rate=self._serialize_hyperparameter(self._learning_rate),
        **self.hyperparameters_config())
    return config
