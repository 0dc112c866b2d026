"""The optimizer factory: Adafactor (the paper's) or Adam, and the schedule.

Both use `thattn.optimizers.InverseSqrtSchedule`: a flat peak for
`warmup_steps`, then decay with the inverse square root of the step, the
last `decay_fraction` of the steps falling linearly to zero.
"""

import math

from thattn.core import requirements

# The tf_keras optimizers load on first use: a keras3 run takes only the
# schedule's arguments from here (`schedule_arguments`).
with requirements.lazy_imports("thattn.training.optimizer"):
  import tf_keras  # pylint: disable=g-import-not-at-top
  from thattn import optimizers  # pylint: disable=g-import-not-at-top

OPTIMIZERS = ("adafactor", "adam")
# The peak learning rate when none is given. T5's Adafactor peaks at 0.01
# (1 / sqrt(10^4)) after 10^4 warmup steps; our runs are short, with 100
# warmup steps, and peak higher: on the default job's model, 600 steps gave
# held-out ln(PPL) 6.10, 5.96 and 6.04 at peaks 0.01, 0.03 and 0.1 (and 6.16
# with Adam at 1e-3).
DEFAULT_LEARNING_RATES = {"adafactor": 0.03, "adam": 1e-3}


def schedule_arguments(options):
  """The arguments of the run's `InverseSqrtSchedule` (tf_keras's, or
  thattn.keras3.optimizers' for --backend=keras3): the peak at the end of
  warmup, the last `decay_fraction` of the steps decayed to 0."""
  return {"warmup_steps": options.warmup_steps,
          "total_steps": options.train_steps,
          "decay_fraction": options.decay_fraction,
          "scale": options.peak_learning_rate *
                   math.sqrt(options.warmup_steps)}


def make_schedule(options):
  """The run's learning-rate schedule: inverse square root, peak at the
  end of warmup, the last `decay_fraction` of the steps decayed to 0."""
  return optimizers.InverseSqrtSchedule(**schedule_arguments(options))


def make_optimizer(options, mesh=None):
  """(optimizer, schedule) for `options` (a `TrainOptions`).

  mesh: a DTensor mesh to keep the optimizer's state on (tf-keras
  optimizers take `mesh=` to make their slots DVariables).
  """
  on_mesh = {"mesh": mesh} if mesh is not None else {}
  schedule = make_schedule(options)
  if options.optimizer == "adafactor":
    optimizer = optimizers.Adafactor(schedule, **on_mesh)
  else:
    optimizer = tf_keras.optimizers.Adam(schedule, **on_mesh)
  if options.mixed_precision == "float16":
    optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
  return optimizer, schedule
