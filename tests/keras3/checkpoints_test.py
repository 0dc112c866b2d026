"""Orbax checkpoints of a Keras 3 run's values on JAX (see
checkpoints_checks.py), in a process of its own with 4 CPU devices."""

import re

from tests.keras3 import processes


def test_orbax_checkpoints_on_jax_devices():
  processes.require("jax")
  processes.require("orbax")
  output = processes.run_pytest(
      "jax", "checkpoints_checks.py",
      XLA_FLAGS="--xla_force_host_platform_device_count=4")
  assert re.search(r"\b6 passed", output), output
