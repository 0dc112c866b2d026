"""InverseSqrtSchedule against the values the contract lists."""

import math

import numpy as np
import pytest
import tf_keras

from thattn import optimizers


@pytest.mark.parametrize("step,value", [
    (0, 0.1), (100, 0.1), (400, 0.05), (900, 1 / 30),
    (950, 0.5 / math.sqrt(950)), (1000, 0.0), (1200, 0.0),
])
def test_inverse_sqrt_schedule_values(step, value):
  schedule = optimizers.InverseSqrtSchedule(warmup_steps=100, total_steps=1000)
  np.testing.assert_allclose(float(schedule(step)), value, rtol=1e-6,
                             atol=1e-9)


def test_without_total_steps_there_is_no_final_decay():
  schedule = optimizers.InverseSqrtSchedule(warmup_steps=4, scale=2.0)
  np.testing.assert_allclose(float(schedule(10**6)), 2.0 / 1000, rtol=1e-6)


def test_schedule_serializes():
  schedule = optimizers.InverseSqrtSchedule(10, 50, decay_fraction=0.2,
                                            scale=3.0)
  clone = tf_keras.optimizers.schedules.deserialize(
      tf_keras.optimizers.schedules.serialize(schedule))
  assert clone.get_config() == schedule.get_config()


@pytest.mark.parametrize("kwargs,message", [
    ({"warmup_steps": 0}, "warmup_steps must be a positive integer, got 0"),
    ({"warmup_steps": 5, "total_steps": -1},
     "total_steps must be a positive integer"),
    ({"warmup_steps": 5, "decay_fraction": 0.0}, r"decay_fraction must be in"),
])
def test_bad_schedule_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optimizers.InverseSqrtSchedule(**kwargs)
