"""thattn.keras3's layers on the TensorFlow, JAX and PyTorch backends.

Each backend runs `backend_checks.py` (the layers against the paper),
`conventions_checks.py` (keras.layers.MultiHeadAttention's conventions:
gate, window, masks, LoRA, quantization, flash attention, from_keras) and
`keras_suite_checks.py` (Keras 3.15's own MultiHeadAttention tests on
thattn's layer) and `custom_variant_checks.py` (the variant of
docs/examples/custom_variant.py, registered from outside the package) in a process of its own (see `processes.py`); this file
also checks a `.keras` file written on one backend loading on the others. A backend whose package is missing skips
(the `[jax]` and `[torch]` extras; CI installs both).
"""

import re

import pytest

from tests.keras3 import processes


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  """A folder where each backend leaves a saved model for the others."""
  return tmp_path_factory.mktemp("keras3_exchange")


@pytest.mark.parametrize("backend", processes.BACKENDS)
def test_layers_on_each_backend(backend, exchange):
  processes.require(backend)
  output = processes.run_pytest(
      backend, ["backend_checks.py", "conventions_checks.py",
                "keras_suite_checks.py", "custom_variant_checks.py"],
      THATTN_KERAS3_EXCHANGE=str(exchange))
  assert re.search(r"\d+ passed", output), output


def test_models_saved_on_one_backend_load_on_the_others(exchange):
  for backend in processes.BACKENDS:
    processes.require(backend)
  # test_layers_on_each_backend left a model per backend; load each on all.
  saved = sorted(path.stem for path in exchange.glob("*.keras"))
  if saved != sorted(processes.BACKENDS):
    for backend in processes.BACKENDS:
      processes.run_pytest(
          backend, "backend_checks.py::test_save_for_other_backends",
          THATTN_KERAS3_EXCHANGE=str(exchange))
  for backend in processes.BACKENDS:
    output = processes.run_pytest(
        backend, "backend_checks.py::test_load_from_other_backends",
        THATTN_KERAS3_EXCHANGE=str(exchange))
    assert "1 passed" in output, output
