"""thattn-train --strategy=dtensor on 4 and 8 logical CPU devices.

Logical devices must be configured before TensorFlow initializes, so the
runs happen in fresh Pythons (`dtensor_train_script.py`, and the binary),
started together when the first test needs them (they share the 2 cores)
and asserted on here:

- 4 devices, batch:2,model:2, Adafactor on a talking-heads BERT wide enough
  to factor: the sharded run's losses equal the unsharded run's; checkpoints
  cross between sharded and unsharded runs both ways, bit for bit; every
  weight and slot has the layout the rules give.
- 8 devices, batch:2,model:4, Adam: the same against an unsharded Adam run,
  continued after a stop on another mesh (batch:2,model:2).
- Layouts that do not fit, and flags that do not go together, stop the run
  before any step with a message that says what to change.
- The binary: a sharded run that exports, and a flag error.
"""

import functools
import json
import os
import sys

import pytest

from tests import cli
from tests import forkserver
from thattn.data import corpus
from thattn.data import tokenizers
from thattn.training import options as options_lib
from thattn.training import strategies

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "dtensor_train_script.py")
MESH_4 = "batch:2,model:2"
MESH_8 = "batch:2,model:4"
# |sharded - unsharded| / |unsharded| of a step's loss: float32 rounding
# (measured: at most 1.4e-7); a wrong layout or a lost update gives > 1e-3.
LOSS_TOLERANCE = 1e-5
# Weights and slots after 8 steps, relative to each tensor's largest value
# (measured: Adafactor 8e-6, Adam 4e-5).
WEIGHT_TOLERANCE = 1e-3
# The attention's key bias gets a zero gradient in exact arithmetic (q.b is
# the same for every memory position, so softmax ignores it), and both
# optimizers normalize its rounding noise into full-size steps: its value
# and slots are noise in either run and are not compared.
NOISE = "attention/key/bias"
# The same under --mixed_precision=bfloat16: bfloat16 activations reduced in
# another order on the mesh (measured: at most 1.4e-5).
BF16_TOLERANCE = 1e-3
U, M = "unsharded", "model"
ERRORS = ("heads", "batch", "dropout", "devices", "rule_axis")
_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=os.pathsep.join(sys.path))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, corpus_cache, sentencepiece_model):
  folder = tmp_path_factory.mktemp("dtensor_data")
  documents = corpus.documents("heldout", corpus_cache)
  (folder / "train.txt").write_text("\n\n".join(documents[:40]))
  tokenizers.SentencepieceTokenizer(
      sentencepiece_model, num_sentinels=100).save(str(folder / "tokenizer"))
  return folder


def _binary(model_dir, data_dir, **flags):
  settings = dict(preset="bert_tiny", d_model=32, d_ff=64, num_layers=1,
                  train_steps=2, batch_size=8, sequence_length=32,
                  warmup_steps=1, log_every=1, eval_every=0, eval_steps=1,
                  train_files=data_dir / "train.txt",
                  tokenizer=data_dir / "tokenizer", model_dir=model_dir)
  return cli.command("train") + [
      f"--{name}={value}" for name, value in dict(settings, **flags).items()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
  """Starts every subprocess at once; {name: function returning its output}."""
  root = tmp_path_factory.mktemp("dtensor_runs")
  commands = {
      "script_4": [sys.executable, SCRIPT, "--devices", "4",
                   "--data_dir", str(data_dir), "--out_dir", str(root / "4"),
                   "--case", f"cross:{MESH_4}", "--case",
                   f"bfloat16:{MESH_4}"],
      "script_8": [sys.executable, SCRIPT, "--devices", "8",
                   "--data_dir", str(data_dir), "--out_dir", str(root / "8"),
                   "--case", f"mesh_change:{MESH_8}/{MESH_4}"] + [
                       f"--case=error:{name}" for name in ERRORS],
      "binary": _binary(root / "binary", data_dir, strategy="dtensor",
                        mesh_shape=MESH_4),
      "binary_error": _binary(root / "binary_error", data_dir,
                              mesh_shape=MESH_4),
  }
  processes = {}
  for name, command in commands.items():
    with open(root / f"{name}.out", "w") as out, \
        open(root / f"{name}.err", "w") as err:
      processes[name] = forkserver.Popen(command, stdout=out, stderr=err,
                                         env=_ENV, text=True)

  @functools.lru_cache(maxsize=None)
  def output(name):
    returncode = processes[name].wait(timeout=900)
    return (returncode, (root / f"{name}.out").read_text(),
            (root / f"{name}.err").read_text())

  output.root = root
  yield output
  for process in processes.values():
    if process.poll() is None:
      process.kill()
      process.wait()


def _cases(runs, name):
  returncode, stdout, stderr = runs(name)
  assert returncode == 0, stderr[-3000:]
  return {case["case"]: case for case in map(json.loads,
                                              stdout.splitlines())}


def _relative(a, b):
  return abs(a - b) / abs(b)


def _assert_same_losses(losses, reference, steps):
  for step in steps:
    assert _relative(losses[str(step)], reference[str(step)]) < (
        LOSS_TOLERANCE), (step, losses, reference)


def _assert_close_weights(differences):
  compared = {name: value for name, value in differences.items()
              if NOISE not in name}
  assert len(compared) >= len(differences) - 3  # the bias and its slots
  assert max(compared.values()) < WEIGHT_TOLERANCE, sorted(
      compared.items(), key=lambda item: -item[1])[:5]


def _expected_specs(name, rank):
  """The default rules on a talking-heads BERT with its MLM head."""
  for suffix, specs in (
      ("attention/query/kernel", [U, M, U]),
      ("attention/key/kernel", [U, M, U]),
      ("attention/value/kernel", [U, M, U]),
      ("attention/output/kernel", [M, U, U]),
      ("attention/query/bias", [M, U]), ("attention/key/bias", [M, U]),
      ("attention/value/bias", [M, U]),
      # P_l [key_heads, heads] and P_w [heads, value_heads].
      ("attention/pre_softmax_projection", [M, U]),
      ("attention/post_softmax_projection", [U, M]),
      ("feed_forward/input/kernel", [U, M]), ("feed_forward/input/bias", [M]),
      ("feed_forward/output/kernel", [M, U]),
      ("word_embeddings/embeddings", [M, U]),  # vocab
      ("masked_lm/output_bias", [M])):  # vocab
    if name.split(":")[0].endswith(suffix):
      return specs
  return [U] * rank  # norms, d_model biases, positions, types, pooler


def _assert_weight_layouts(layouts, mesh):
  assert layouts["mesh"] == mesh
  assert layouts["layout_rules"] == (
      "batch:batch;key_heads:model;value_heads:model;d_ff:model;vocab:model")
  weights = layouts["weights"]
  assert len(weights) == 30
  assert weights == {name: _expected_specs(name, len(specs))
                     for name, specs in weights.items()}
  # 9 attention tensors, 3 feed-forward ones, the table and the MLM bias.
  assert sum(M in specs for specs in weights.values()) == 14


def _slots(layouts, prefix):
  return {name[len(prefix):]: specs
          for name, specs in layouts["optimizer"].items()
          if name.startswith(prefix)}


# ---- 4 devices: Adafactor, both directions through checkpoints ---------------
def test_sharded_training_matches_unsharded_on_4_devices(runs):
  case = _cases(runs, "script_4")[f"cross:{MESH_4}"]
  losses = case["losses"]
  # Steps 1-5 from scratch, sharded and not.
  _assert_same_losses(losses["sharded_first"], losses["unsharded_first"],
                      range(1, 6))
  # Steps 1-8 of the two runs that crossed over at checkpoint 4.
  _assert_same_losses(losses["sharded_then_unsharded"],
                      losses["unsharded_then_sharded"], range(1, 9))
  held_out = case["held_out"]
  for key, value in held_out["sharded_then_unsharded"].items():
    assert _relative(value, held_out["unsharded_then_sharded"][key]) < (
        LOSS_TOLERANCE)
  assert losses["sharded_first"]["5"] < losses["sharded_first"]["1"]
  assert all(f"DTensor mesh {MESH_4} on CPU devices" in line and
             "14 of 30 weights sharded" in line
             for line in case["describe_lines"])


def test_weights_and_adafactor_slots_take_the_rules_layouts(runs):
  layouts = _cases(runs, "script_4")[f"cross:{MESH_4}"]["layouts"]
  _assert_weight_layouts(layouts, MESH_4)
  weights = layouts["weights"]
  full = _slots(layouts, "v/")
  # A full-size slot takes its weight's layout.
  assert full and all(specs == weights[name] for name, specs in full.items())
  assert any(M in specs for specs in full.values())
  # Factored slots (the two largest axes >= 128) are replicated vectors.
  factored = {"word_embeddings/embeddings:0",
              "block_0/feed_forward/input/kernel:0",
              "block_0/feed_forward/output/kernel:0",
              "masked_lm/transform/kernel:0"}
  for prefix in ("vr/", "vc/"):
    assert _slots(layouts, prefix) == {name: [U] for name in factored}
  assert set(full) | factored == set(weights) - {
      "pooler/dense/kernel:0", "pooler/dense/bias:0"}  # MLM trains no pooler
  assert layouts["optimizer"]["iteration:0"] == []


def test_checkpoints_cross_between_sharded_and_unsharded(runs):
  case = _cases(runs, "script_4")[f"cross:{MESH_4}"]
  # Checkpoint 4 of each run, restored into the other kind and saved again:
  # the same bits for every weight, slot and step (66 tensors).
  for round_trip in case["round_trips"].values():
    assert round_trip == {"source": "ckpt-4", "tensors": 66,
                          "bitwise_equal": True}
  assert case["resumed_from"] == [4, 4]
  assert [line.split("/")[-3] for line in case["resume_lines"]] == [
      "sharded_first", "unsharded_first"]
  # The two crossed runs end with the same weights and slots.
  _assert_close_weights(case["final_difference"])


def test_mixed_bfloat16_under_dtensor_matches_unsharded(runs):
  case = _cases(runs, "script_4")[f"bfloat16:{MESH_4}"]
  losses = case["losses"]
  assert sorted(losses["sharded"]) == ["1", "2", "3"]
  for step, loss in losses["sharded"].items():
    assert _relative(loss, losses["unsharded"][step]) < BF16_TOLERANCE, (
        step, losses)
  for key, value in case["held_out"]["sharded"].items():
    assert _relative(value, case["held_out"]["unsharded"][key]) < (
        BF16_TOLERANCE)
  # The policy wraps each weight in an AutoCastVariable; the DVariables
  # inside still take the rules' layouts (they were once built replicated).
  _assert_weight_layouts(case["layouts"], MESH_4)


# ---- 8 devices: Adam, and a different mesh on resume -------------------------
def test_adam_on_8_devices_then_another_mesh_matches_unsharded(runs):
  case = _cases(runs, "script_8")[f"mesh_change:{MESH_8}/{MESH_4}"]
  _assert_same_losses(case["losses"]["sharded"], case["losses"]["reference"],
                      range(1, 9))
  assert case["resumed_from"] == 4
  assert f"DTensor mesh {MESH_4}" in case["describe_lines"][0]
  _assert_close_weights(case["final_difference"])
  for layouts, mesh in zip(case["layouts"], (MESH_8, MESH_4)):
    _assert_weight_layouts(layouts, mesh)
    trained = set(layouts["weights"]) - {"pooler/dense/kernel:0",
                                         "pooler/dense/bias:0"}
    for prefix in ("m/", "v/"):  # Adam's slots take their weight's layout
      assert _slots(layouts, prefix) == {
          name: layouts["weights"][name] for name in trained}


@pytest.mark.parametrize("name,message", [
    ("heads", "on mesh 'batch:1,model:8' do not fit:\ntensor "
              "'block_0/attention/attention/post_softmax_projection:0' "
              "[12, 12] (heads, value_heads) and 3 more"),
    ("heads", "key_heads=12 is not divisible by model=8: use a mesh with "
              "model in {1,2,4}, or pad/choose key_heads divisible by 8, or "
              "leave key_heads unsharded (drop 'key_heads:model')"),
    ("heads", "value_heads=12 is not divisible by model=8"),
    ("batch", "tensor 'batch of --batch_size=6' [6] (batch): batch=6 on "
              "batch:4: use a batch size that is a multiple of 4 (e.g. 8)"),
    ("dropout", "--task=mlm with dropout cannot run under "
                "--strategy=dtensor: dropout in embedding_dropout (0.1)"),
    ("dropout", "pass --dropout_rate=0"),
    ("devices", "mesh batch:4,model:4 needs 16 devices but only 8 CPU "
                "devices are available: use a smaller mesh such as "
                "batch:2,model:4"),
    ("rule_axis", "layout rule 'heads:modle' names mesh axis 'modle', which "
                  "mesh batch:2,model:2 does not have (axes: batch, model). "
                  "Did you mean 'model'?"),
])
def test_layouts_that_do_not_fit_stop_before_any_step(runs, name, message):
  case = _cases(runs, "script_8")[f"error:{name}"]
  assert message in case["error"]
  assert case["checkpoints"] == []


# ---- flags -------------------------------------------------------------------
@pytest.mark.parametrize("options,message", [
    (dict(mesh_shape=MESH_4), "--mesh_shape='batch:2,model:2' applies only "
     "with --strategy=dtensor, got --strategy=default"),
    (dict(mesh_shape=MESH_4, layout_rules="heads:model", strategy="mirrored"),
     "--mesh_shape='batch:2,model:2' and --layout_rules='heads:model' apply "
     "only with --strategy=dtensor, got --strategy=mirrored"),
    (dict(strategy="dtensor"), "--strategy=dtensor needs --mesh_shape"),
    (dict(strategy="dtensor", mesh_shape="batch:2,model"),
     "mesh spec 'batch:2,model': cannot read 'model'"),
    (dict(strategy="dtensor", mesh_shape=MESH_4, layout_rules="head:model"),
     "unknown logical axis 'head' in 'head:model'. Did you mean 'heads'?"),
    (dict(strategy="dtensor", mesh_shape=MESH_4, tpu="grpc://x"),
     "--strategy=dtensor runs on local CPUs or GPUs only"),
])
def test_flags_that_do_not_go_together(options, message):
  with pytest.raises(ValueError) as error:
    options_lib.TrainOptions(**options)
  assert message in str(error.value)


def test_dtensor_is_not_a_tf_distribute_strategy():
  with pytest.raises(ValueError, match="DTensor is not a tf.distribute"):
    strategies.make_strategy("dtensor")


def test_the_binary_splits_the_cpu_trains_sharded_and_exports(runs):
  returncode, stdout, stderr = runs("binary")
  assert returncode == 0, stderr[-3000:]
  assert ("No GPU: the CPU runs the mesh as 4 logical devices" in stdout)
  assert f"DTensor mesh {MESH_4}" in stdout
  assert "Held-out ln_ppl after training" in stdout
  # The export rebuilds the model unsharded from the sharded checkpoint.
  assert "Exported mlm model (ckpt-2)" in stdout
  model_dir = runs.root / "binary"
  assert os.path.exists(os.path.join(model_dir, "export", "saved_model.pb"))
  with open(os.path.join(model_dir, "dtensor_layouts.json")) as f:
    assert json.load(f)["mesh"] == MESH_4


def test_the_binary_refuses_a_mesh_without_dtensor(runs):
  returncode, _, stderr = runs("binary_error")
  assert returncode != 0
  assert ("thattn-train: error: --mesh_shape='batch:2,model:2' applies only "
          "with --strategy=dtensor") in stderr
  assert "Traceback" not in stderr
