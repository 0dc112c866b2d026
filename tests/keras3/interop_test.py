"""thattn.keras3 beyond one backend's layers: weights to and from
thattn.layers, heads sharded on JAX devices, what importing loads, and
docs/keras3.md's training example on every backend (each in a process of
its own, see `processes.py`).
"""

import re

import pytest

from tests.keras3 import processes


def test_weights_move_between_tf_keras_and_keras3():
  processes.require("tensorflow")
  output = processes.run_pytest("tensorflow",
                                "tf_keras_transfer_checks.py")
  assert re.search(r"\d+ passed", output), output


@pytest.mark.parametrize("devices", [4, 8])
def test_heads_shard_on_jax_devices(devices):
  processes.require("jax")
  output = processes.run_pytest(
      "jax", "sharding_checks.py",
      XLA_FLAGS="--xla_force_host_platform_device_count=8",
      THATTN_MESH_DEVICES=str(devices))
  assert "8 passed" in output, output


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_import_needs_no_tensorflow_tf_keras_mtf_or_text(backend):
  processes.require(backend)
  output = processes.run(backend, ["-c", (
      "import sys, thattn.keras3\n"
      "print(sorted(m for m in ('tensorflow', 'tf_keras', 'mesh_tensorflow',"
      " 'tensorflow_text') if m in sys.modules))")])
  assert output.strip().splitlines()[-1] == "[]", output


@pytest.mark.parametrize("backend", processes.BACKENDS)
def test_the_docs_training_example(backend):
  processes.require(backend)
  docs = (processes.ROOT / "docs" / "keras3.md").read_text()
  example = re.findall(r"```python\n(.*?)```", docs, re.S)[0]
  output = processes.run(backend, ["-c", example])
  assert re.search(rf"{backend}: loss [\d.]+ -> [\d.]+", output), output
