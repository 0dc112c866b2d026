"""thattn.keras3 on the TensorFlow, JAX and PyTorch backends.

Keras 3 fixes its backend at import, so each backend runs in a process of
its own: this file starts them (pytest on `backend_checks.py` and friends,
with KERAS_BACKEND set) and checks what can only be seen from outside:
what importing `thattn.keras3` loads, a `.keras` file written on one
backend loading on the others, and docs/keras3.md's training example.
Each backend skips when its package is not installed (the `[jax]` and
`[torch]` extras; CI installs both).
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
BACKENDS = ("tensorflow", "jax", "torch")


def _require(backend):
  if importlib.util.find_spec(backend) is None:
    pytest.skip(f"{backend} is not installed (pip install -e '.[{backend}]')")


def _run(backend, args, timeout=600, **env):
  environment = {**os.environ, "KERAS_BACKEND": backend,
                 "TF_CPP_MIN_LOG_LEVEL": "3", **env}
  result = subprocess.run([sys.executable, *args], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=timeout,
                          check=False)
  assert result.returncode == 0, (
      f"{backend}: {' '.join(args)} failed:\n{result.stdout[-6000:]}\n"
      f"{result.stderr[-3000:]}")
  return result.stdout


def _pytest(backend, checks, **env):
  # --noconftest: tests/conftest.py imports TensorFlow and tensorflow-text
  # for the other tests, which the JAX and PyTorch processes must not need.
  return _run(backend, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--noconftest", str(HERE / checks)], **env)


@pytest.fixture(scope="module")
def exchange(tmp_path_factory):
  """A folder where each backend leaves a saved model for the others."""
  return tmp_path_factory.mktemp("keras3_exchange")


@pytest.mark.parametrize("backend", BACKENDS)
def test_layers_on_each_backend(backend, exchange):
  _require(backend)
  output = _pytest(backend, "backend_checks.py",
                   THATTN_KERAS3_EXCHANGE=str(exchange))
  assert re.search(r"\d+ passed", output), output


def test_models_saved_on_one_backend_load_on_the_others(exchange):
  for backend in BACKENDS:
    _require(backend)
  # test_layers_on_each_backend left a model per backend; load each on all.
  saved = sorted(path.stem for path in exchange.glob("*.keras"))
  if saved != sorted(BACKENDS):
    for backend in BACKENDS:
      _pytest(backend, "backend_checks.py::test_save_for_other_backends",
              THATTN_KERAS3_EXCHANGE=str(exchange))
  for backend in BACKENDS:
    output = _pytest(backend,
                     "backend_checks.py::test_load_from_other_backends",
                     THATTN_KERAS3_EXCHANGE=str(exchange))
    assert "1 passed" in output, output


def test_weights_move_between_tf_keras_and_keras3():
  _require("tensorflow")
  output = _pytest("tensorflow", "tf_keras_transfer_checks.py")
  assert re.search(r"\d+ passed", output), output


@pytest.mark.parametrize("devices", [4, 8])
def test_heads_shard_on_jax_devices(devices):
  _require("jax")
  output = _pytest("jax", "sharding_checks.py",
                   XLA_FLAGS="--xla_force_host_platform_device_count=8",
                   THATTN_MESH_DEVICES=str(devices))
  assert "5 passed" in output, output


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_import_needs_no_tensorflow_tf_keras_mtf_or_text(backend):
  _require(backend)
  output = _run(backend, ["-c", (
      "import sys, thattn.keras3\n"
      "print(sorted(m for m in ('tensorflow', 'tf_keras', 'mesh_tensorflow',"
      " 'tensorflow_text') if m in sys.modules))")])
  assert output.strip().splitlines()[-1] == "[]", output


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_docs_training_example(backend):
  _require(backend)
  docs = (ROOT / "docs" / "keras3.md").read_text()
  example = re.findall(r"```python\n(.*?)```", docs, re.S)[0]
  output = _run(backend, ["-c", example])
  assert re.search(rf"{backend}: loss [\d.]+ -> [\d.]+", output), output
