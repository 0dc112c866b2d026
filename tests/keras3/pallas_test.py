"""The Pallas talking-heads kernel in interpret mode, in a JAX process.

`pallas_checks.py` runs with KERAS_BACKEND=jax and THATTN_PALLAS=interpret
(the layers then run the kernel where they would on a GPU); see its
docstring for what it checks. No GPU is needed or used.
"""

import re

from tests.keras3 import processes


def test_the_pallas_kernel_in_interpret_mode():
  processes.require("jax")
  output = processes.run_pytest("jax", "pallas_checks.py",
                                THATTN_PALLAS="interpret")
  assert re.search(r"\d+ passed", output), output
  assert not re.search(r"\d+ (failed|skipped|error)", output), output
