"""thattn layers and models under DTensor on 4 and 8 logical CPU devices.

Logical devices can only be set before TensorFlow initializes its devices,
so each mesh runs `dtensor_script.py` in a fresh Python (once per module)
and these tests assert on the JSON it prints: every weight's layout (the
tables below are the specification), every gradient's layout, and outputs,
losses and gradients against the unsharded reference.
"""

import functools
import json
import os
import sys

import pytest

from tests import forkserver

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "dtensor_script.py")
# float32 rounding: |sharded - unsharded| / max|unsharded|. Measured values
# are 1e-7 to 2e-6; a wrong layout or a missing all-reduce gives O(1).
TOLERANCE = 1e-5
# The models sum over more terms, in an order that changes from run to run
# (DTensor's CPU collectives): measured 1e-5 to 3e-5 in layer-norm scales
# and embeddings after two blocks, and once, on 2 loaded cores, 1.06e-4.
MODEL_TOLERANCE = 3e-4
U, M = "unsharded", "model"

# Rules "A": key_heads and value_heads on model, heads whole.
LAYER_A = {
    "query/kernel": [U, M, U], "key/kernel": [U, M, U],
    "value/kernel": [U, M, U], "output/kernel": [M, U, U],
    "query/bias": [M, U], "key/bias": [M, U], "value/bias": [M, U],
    "output/bias": [U],
    "pre_softmax_projection": [M, U], "post_softmax_projection": [U, M],
    "x2l/kernel": [U, M, U], "m2l/kernel": [U, M, U],
    "x2w/kernel": [U, U, M], "m2w/kernel": [U, U, M],
}
# Rules "B": only the softmax heads on model.
LAYER_B = {
    **{name: [U] * len(specs) for name, specs in LAYER_A.items()},
    "pre_softmax_projection": [U, M], "post_softmax_projection": [M, U],
    "x2l/kernel": [U, U, M], "m2l/kernel": [U, U, M],
    "x2w/kernel": [U, M, U], "m2w/kernel": [U, M, U],
}
# Rules "G" on grouped talking heads with G = the model-axis size: the heads
# of every set and the blocks of every head projection on model.
GROUPED_G = {
    **LAYER_A,
    "pre_softmax_projection": [M, U, U], "post_softmax_projection": [M, U, U],
    "x2l/kernel": [U, M, U, U], "m2l/kernel": [U, M, U, U],
    "x2w/kernel": [U, M, U, U], "m2w/kernel": [U, M, U, U],
}
_REPLICATED = {"norm/gamma": [U], "norm/beta": [U], "head/kernel": [U, U],
               "head/bias": [U]}
FUNCTIONAL_A = {
    **{f"tha/{name}": specs for name, specs in LAYER_A.items()},
    "mha/query/kernel": [U, M, U], "mha/key/kernel": [U, M, U],
    "mha/value/kernel": [U, M, U], "mha/output/kernel": [M, U, U],
    "gba/bilinear_p": [U, U, U], "gba/bilinear_q": [U, U, U],
    **_REPLICATED,
}
FUNCTIONAL_B = {
    **{f"tha/{name}": specs for name, specs in LAYER_B.items()},
    "mha/query/kernel": [U, U, U], "mha/key/kernel": [U, U, U],
    "mha/value/kernel": [U, U, U], "mha/output/kernel": [U, U, U],
    "gba/bilinear_p": [U, U, M], "gba/bilinear_q": [U, U, M],
    **_REPLICATED,
}
EXPECTED = {"layer:A": {f"tha/{name}": specs for name, specs in LAYER_A.items()},
            "layer:B": {f"tha/{name}": specs for name, specs in LAYER_B.items()},
            "functional:A": FUNCTIONAL_A, "functional:B": FUNCTIONAL_B,
            "grouped:G": {f"tha/{name}": specs
                          for name, specs in GROUPED_G.items()}}
MESHES = {4: "batch:2,model:2", 8: "batch:2,model:4"}
CASES = {4: ["layer:A", "layer:B", "functional:A", "grouped:G", "error:heads",
             "error:batch", "error:mesh", "copy:weights"],
         8: ["layer:A", "layer:B", "functional:A", "functional:B",
             "grouped:G"]}


def _run(devices, cases):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(sys.path))
  command = [sys.executable, SCRIPT, "--devices", str(devices),
             "--mesh", MESHES[devices]]
  for case in cases:
    command += ["--case", case]
  return forkserver.run(command, capture_output=True, text=True, env=env,
                        timeout=600, check=False)


@functools.lru_cache(maxsize=None)
def _results(devices):
  """{case: result} from one subprocess per mesh, shared by the tests."""
  result = _run(devices, tuple(CASES[devices]))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = [json.loads(line) for line in result.stdout.splitlines()]
  return {line["case"]: line for line in lines}


def _check_sharded_run(result, expected, tolerance=TOLERANCE):
  if expected is not None:
    layouts = {name.split(":")[0]: specs
               for name, specs in result["layouts"].items()}
    assert layouts == expected
  assert result["grad_layouts"] == {
      name: specs for name, specs in result["layouts"].items()
      if name in result["grad_layouts"]}
  assert len(result["grad_layouts"]) == len(result["layouts"])
  assert result["output_layout"] == result["batch_layout"] == ["batch", U, U]
  assert result["same_initial_weights"]
  errors = result["errors"]
  assert errors["output"] < tolerance, errors
  assert errors["loss"] < tolerance, errors
  assert max(errors["grads"].values()) < tolerance, errors


@pytest.mark.parametrize("devices,case", [
    (devices, case) for devices, cases in CASES.items() for case in cases
    if case in EXPECTED])
def test_sharded_weights_and_gradients_match_the_unsharded_run(devices,
                                                                case):
  result = _results(devices)[case]
  assert result["mesh"] == MESHES[devices]
  _check_sharded_run(result, EXPECTED[case])


@pytest.mark.parametrize("devices", sorted(MESHES))
def test_grouped_talking_heads_have_one_group_per_model_shard(devices):
  shapes = _results(devices)["grouped:G"]["shapes"]
  model_size = int(MESHES[devices].split("model:")[1])
  # P_l[G, h_k/G, h/G] and P_w[G, h/G, h_v/G] with h_k = h_v = 8, h = 4.
  assert shapes["tha/pre_softmax_projection:0"] == [
      model_size, 8 // model_size, 4 // model_size]
  assert shapes["tha/post_softmax_projection:0"] == [
      model_size, 4 // model_size, 8 // model_size]


def test_bad_heads_fail_after_the_probe_before_any_sharded_weight():
  result = _results(4)["error:heads"]
  assert result["builds"] == 1  # the unsharded probe only
  assert ("tensor 'tha/pre_softmax_projection:0' [3, 4] (key_heads, heads) "
          "and 2 more (tha/query/kernel:0, tha/key/kernel:0): key_heads=3 is "
          "not divisible by model=2") in result["error"]


def test_a_batch_the_batch_axis_does_not_divide_fails_before_the_step():
  assert ("tensor 'query' [3, 5, 16] (batch, None, None): batch=3 on "
          "batch:2: use a batch size that is a multiple of 2 (e.g. 4)"
          ) in _results(4)["error:batch"]["error"]


def test_weights_copy_between_sharded_and_unsharded_models():
  assert _results(4)["copy:weights"]["copied"]


def test_a_mesh_larger_than_the_devices_fails_when_made():
  assert ("mesh batch:2,model:4 needs 8 devices but only 4 CPU devices are "
          "available: use a smaller mesh such as batch:2,model:2"
          ) in _results(4)["error:mesh"]["error"]


# TF 2.21 DTensor cannot lay out `x[:, tf.newaxis]` inside a tf.function
# (SIGSEGV, or "'tf.StridedSlice' op ComputeLayoutForward error"); thattn's
# layers and models use tf.expand_dims instead, and these tests would catch a
# slice that creeps back in.


def _run_cases(devices, cases):
  result = _run(devices, cases)
  assert result.returncode == 0, result.stderr[-3000:]
  return {line["case"]: line for line in map(json.loads,
                                             result.stdout.splitlines())}


def test_masked_attention_under_dtensor():
  result = _run_cases(4, ("layer_masked:A",))["layer_masked:A"]
  _check_sharded_run(result, EXPECTED["layer:A"])


def _expected_model_specs(name, rank):
  """Rules M on a talking-heads BERT or T5: the specification by weight."""
  for suffix, specs in (
      ("attention/query/kernel", [U, M, U]),
      ("attention/key/kernel", [U, M, U]),
      ("attention/value/kernel", [U, M, U]),
      ("attention/output/kernel", [M, U, U]),
      ("attention/query/bias", [M, U]), ("attention/key/bias", [M, U]),
      ("attention/value/bias", [M, U]),
      ("attention/pre_softmax_projection", [M, U]),
      ("attention/post_softmax_projection", [U, M]),
      ("feed_forward/input/kernel", [U, M]), ("feed_forward/input/bias", [M]),
      ("feed_forward/gate/kernel", [U, M]), ("feed_forward/gate/bias", [M]),
      ("feed_forward/output/kernel", [M, U])):
    if name.split(":")[0].endswith(suffix):
      return specs
  return [U] * rank  # embeddings, norms, biases on d_model, pooler


@pytest.mark.parametrize("devices", sorted(MESHES))
def test_talking_heads_bert_and_t5_match_unsharded(devices):
  results = _run_cases(devices, ("bert:M", "t5:M"))
  # 2 layers x (4 attention kernels, 3 biases, P_l, P_w, 3 feed-forward);
  # T5 has no biases, and its decoder blocks have two attention layers.
  for case, sharded_count in (("bert:M", 24), ("t5:M", 16 + 28)):
    result = results[case]
    layouts = result["layouts"]
    assert layouts == {name: _expected_model_specs(name, len(specs))
                       for name, specs in layouts.items()}
    assert sum(M in specs for specs in layouts.values()) == sharded_count
    _check_sharded_run(result, None, tolerance=MODEL_TOLERANCE)
