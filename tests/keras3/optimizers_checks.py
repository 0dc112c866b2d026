"""thattn.keras3.optimizers on one Keras 3 backend: tf_keras Adafactor's steps.

Run by `optimizers_test.py` in a process per backend, with
THATTN_OPTIMIZER_EXCHANGE naming a folder where the parent left, per case,
the variables' initial values, a gradient per step, the arguments and the
values `thattn.optimizers.Adafactor` (tf_keras) ended with.
"""

import json
import os
import pathlib

import keras
from keras import ops
import numpy as np
import pytest

from thattn.keras3 import optimizers

EXCHANGE = pathlib.Path(os.environ.get("THATTN_OPTIMIZER_EXCHANGE", "."))


def cases():
  return sorted(path.stem for path in EXCHANGE.glob("*.npz"))


def make_optimizer(arguments):
  arguments = dict(arguments)
  schedule = arguments.pop("schedule", None)
  if schedule is not None:
    arguments["learning_rate"] = optimizers.InverseSqrtSchedule(**schedule)
  return optimizers.Adafactor(**arguments)


@pytest.mark.parametrize("case", cases())
def test_the_same_steps_as_tf_keras_adafactor(case):
  saved = np.load(EXCHANGE / f"{case}.npz")
  arguments = json.loads((EXCHANGE / f"{case}.json").read_text())
  count, steps = int(saved["count"]), int(saved["steps"])
  variables = [keras.Variable(saved[f"initial_{index}"])
               for index in range(count)]
  optimizer = make_optimizer(arguments)
  for step in range(steps):
    optimizer.apply_gradients(
        [(saved[f"gradient_{step}_{index}"], variable)
         for index, variable in enumerate(variables)])
  for index, variable in enumerate(variables):
    np.testing.assert_allclose(
        ops.convert_to_numpy(variable), saved[f"final_{index}"], rtol=1e-5,
        atol=1e-7, err_msg=f"{case}: variable {index}")


def test_the_schedule_equals_tf_keras_s():
  saved = json.loads((EXCHANGE / "schedule.values").read_text())
  schedule = optimizers.InverseSqrtSchedule(**saved["arguments"])
  got = [float(ops.convert_to_numpy(schedule(step)))
         for step in range(len(saved["values"]))]
  np.testing.assert_allclose(got, saved["values"], rtol=1e-6)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match=r"decay_rate .* must be in \(0, 1\], "
                     r"got 1.5"):
    optimizers.Adafactor(0.1, decay_rate=1.5)
  with pytest.raises(ValueError, match=r"warmup_steps"):
    optimizers.InverseSqrtSchedule(0)
