"""What the Keras 3 models run on a GPU (cuDNN attention, no slow scatter,
the default talking-heads path), checked on a CPU in a JAX process; see
gpu_paths_checks.py."""

import re

from tests.keras3 import processes


def test_the_gpu_paths_on_jax():
  processes.require("jax")
  output = processes.run_pytest("jax", "gpu_paths_checks.py")
  assert re.search(r"\d+ passed", output), output
  assert not re.search(r"\d+ (failed|skipped|error)", output), output
