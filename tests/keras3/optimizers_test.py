"""Adafactor in Keras 3 takes the tf_keras Adafactor's steps, on every backend.

thattn.optimizers.Adafactor (tf_keras; itself checked against Mesh
TensorFlow's AdafactorOptimizer in tests/adafactor_test.py) runs a few
steps here on variables that are factored (rank 2 and 3, the two largest
axes >= 128) and not (a small matrix, a vector), with and without momentum,
clipping, parameter scale and the inverse-square-root schedule; each Keras
3 backend (`optimizers_checks.py`, a process per backend) must end with
the same values (1e-5 relative).
"""

import json
import re

import numpy as np
import pytest

from tests.keras3 import processes

SHAPES = ((256, 130), (3, 200, 150), (4, 5), (7,))
CASES = {
    "defaults_with_schedule": dict(
        schedule=dict(warmup_steps=2, total_steps=6, decay_fraction=0.5,
                      scale=0.05)),
    "momentum_no_clipping_no_scale": dict(
        learning_rate=0.01, beta1=0.5, clipping_threshold=None,
        multiply_by_parameter_scale=False, min_dim_size_to_factor=4,
        decay_rate=0.6),
}
STEPS = 5


def _tf_keras_optimizer(arguments):
  from thattn import optimizers  # pylint: disable=g-import-not-at-top
  arguments = dict(arguments)
  schedule = arguments.pop("schedule", None)
  if schedule is not None:
    arguments["learning_rate"] = optimizers.InverseSqrtSchedule(**schedule)
  return optimizers.Adafactor(**arguments)


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from thattn import optimizers  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("keras3_optimizers")
  rng = np.random.default_rng(0)
  for case, arguments in CASES.items():
    initial = [rng.normal(size=shape).astype("float32") for shape in SHAPES]
    gradients = [[rng.normal(size=shape).astype("float32") * (step + 1)
                  for shape in SHAPES] for step in range(STEPS)]
    variables = [tf.Variable(value) for value in initial]
    optimizer = _tf_keras_optimizer(arguments)
    for step in range(STEPS):
      optimizer.apply_gradients(zip(gradients[step], variables))
    np.savez(folder / f"{case}.npz", count=len(SHAPES), steps=STEPS,
             **{f"initial_{i}": value for i, value in enumerate(initial)},
             **{f"gradient_{s}_{i}": value for s, step in enumerate(gradients)
                for i, value in enumerate(step)},
             **{f"final_{i}": v.numpy() for i, v in enumerate(variables)})
    (folder / f"{case}.json").write_text(json.dumps(arguments))
  schedule = dict(warmup_steps=3, total_steps=20, decay_fraction=0.25,
                  scale=0.5)
  values = [float(optimizers.InverseSqrtSchedule(**schedule)(step))
            for step in range(22)]
  (folder / "schedule.values").write_text(json.dumps(
      {"arguments": schedule, "values": values}))
  return folder


@pytest.mark.parametrize("backend", processes.BACKENDS)
def test_keras3_adafactor_takes_the_tf_keras_steps(backend, exchange):
  processes.require(backend)
  output = processes.run_pytest(backend, "optimizers_checks.py",
                                THATTN_OPTIMIZER_EXCHANGE=str(exchange))
  assert re.search(rf"{len(CASES) + 2} passed", output), output
