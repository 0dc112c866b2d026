"""The same mtf layer on 1 device and on meshes of 4 logical CPUs.

Logical devices can only be set before TensorFlow initializes its devices,
so `mesh_script.py` runs in a fresh Python (once per module) and these
tests assert on the JSON it prints: outputs and gradients on batch:2,
model:2 and batch:2,model:2 equal the one-device run, and the lowered
variable slices show the heads dims really split over `model`, with the
rules of `thattn.sharding` (the ones the DTensor path uses).
"""

import functools
import json
import os
import sys

import pytest

from tests import forkserver

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "mesh_script.py")
# float32 rounding relative to the largest magnitude; measured <= 3e-7. A
# wrong layout or a missing all-reduce gives O(1).
TOLERANCE = 1e-5
MESHES = ("batch:2", "model:2", "batch:2,model:2")


def _run_script():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(sys.path))
  # faulthandler: a native crash prints the Python stack it happened under.
  return forkserver.run([sys.executable, "-X", "faulthandler", SCRIPT],
                        capture_output=True, text=True, env=env, timeout=600,
                        check=False)


@functools.lru_cache(maxsize=None)
def _results():
  result = _run_script()
  if result.returncode < 0:
    # Killed by a signal: once in a CI run (of dozens of clean runs here,
    # 16 of them two at a time) glibc aborted the script with "corrupted
    # double-linked list" inside TensorFlow's graph runtime, which thattn
    # adds no native code to on this path (its fused kernel is not loaded).
    # A second crash fails the test; a wrong number never gets a rerun.
    first = result
    result = _run_script()
    assert result.returncode == 0, (
        f"crashed twice; first: {first.stderr[-1500:]}\n"
        f"second: {result.stderr[-1500:]}")
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines()]
  return {line["case"]: line for line in lines}


CASES = ("multi_head", "talking_heads:kv_heads", "talking_heads:heads",
         "talking_heads_enc_dec:kv_heads", "general_bilinear", "grouped")


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("case", CASES)
def test_meshes_give_the_one_device_outputs_and_gradients(case, mesh):
  errors = _results()[case]["meshes"][mesh]["errors"]
  assert max(errors.values()) <= TOLERANCE, errors


def _expected_slice(shape, dims, rules, mesh):
  """Each dim divided by the size of the mesh axis its name's rule names."""
  sizes = dict(item.split(":") for item in mesh.split(","))
  axes = dict(item.split(":") for item in rules.split(";") if item)
  return [size // int(sizes.get(axes.get(dim), 1))
          for size, dim in zip(shape, dims)]


@pytest.mark.parametrize("case", CASES)
def test_every_variable_is_sliced_by_the_rules_on_every_device(case):
  result = _results()[case]
  for mesh, run in result["meshes"].items():
    devices = 4 if "," in mesh else 2
    for name, slices in run["slice_shapes"].items():
      assert len(slices) == devices
      expected = _expected_slice(result["shapes"][name],
                                 result["variable_dims"][name], run["rules"],
                                 mesh)
      assert slices == [expected] * devices, (mesh, name)


# The heads really are split: spelled out for model:2 (the same slices on
# batch:2,model:2; batch:2 alone replicates every variable).
SPLIT = {
    # SelfAttention's combined [d_model, heads * d_kv] kernels, heads-major.
    "multi_head": {"q": [8, 4], "o": [4, 8]},
    # h_k=2, h=4, h_v=6 with key_heads and value_heads on model.
    "talking_heads:kv_heads": {
        "q/kernel": [8, 1, 4], "v/kernel": [8, 3, 3],
        "logits/kernel": [1, 4], "weights/kernel": [4, 3],
        "logits/logits_dynamic_0/kernel": [8, 1, 4],
        "weights/weights_dynamic_1/kernel": [8, 4, 3],
        "y/kernel": [3, 3, 8]},
    # The softmax heads on model: only the head projections are split.
    "talking_heads:heads": {
        "q/kernel": [8, 2, 4], "logits/kernel": [2, 2],
        "weights/kernel": [2, 6], "logits/logits_dynamic_1/kernel": [8, 2, 2],
        "weights/weights_dynamic_0/kernel": [8, 2, 6]},
    "general_bilinear": {"q/kernel": [8, 1, 8], "y/kernel": [1, 8, 8]},
    # G=2 groups on model:2: one whole group per device, blocks included.
    "grouped": {"q/kernel": [8, 1, 2, 4], "v/kernel": [8, 1, 3, 3],
                "logits/kernel": [1, 2, 1], "weights/kernel": [1, 1, 3],
                "logits/logits_dynamic_0/kernel": [8, 1, 2, 1],
                "y/kernel": [1, 3, 3, 8]},
}


@pytest.mark.parametrize("case", sorted(SPLIT))
def test_heads_dims_are_split_over_model(case):
  meshes = _results()[case]["meshes"]
  for name, shape in SPLIT[case].items():
    assert meshes["model:2"]["slice_shapes"][name] == [shape] * 2, name
    assert meshes["batch:2,model:2"]["slice_shapes"][name] == [shape] * 4
    full = _results()[case]["shapes"][name]
    assert meshes["batch:2"]["slice_shapes"][name] == [full] * 2


def test_rules_are_thattn_rules_as_mtf_layout_strings():
  result = _results()["grouped"]
  assert result["meshes"]["batch:2,model:2"]["rules"] == (
      "batch:batch;head_groups:model;key_heads:model;value_heads:model")
  assert result["meshes"]["batch:2"]["rules"] == "batch:batch"
