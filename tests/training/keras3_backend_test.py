"""thattn-train --backend=keras3: the run driver's Keras 3 backend on JAX.

The binary runs for real, in subprocesses (Keras 3 fixes its framework when
TensorFlow is imported, and a mesh needs JAX's host devices split before JAX
starts). The same tiny masked-LM job with --backend=keras and with
--backend=keras3 (no KERAS_BACKEND set: the binary picks JAX) starts from
the same weights (each draws them from the seed by weight name) and reads
the same batches, so the per-step losses must agree; then the run without
tf_keras on JAX, TensorFlow and PyTorch, exact resume after SIGKILL, the
export, loading in Keras 3 without TensorFlow, a T5 on a batch:2,model:2
mesh of 4 JAX host devices, and its conversion to Mesh TensorFlow.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import conftest
from tests import cli
from tests import forkserver
from tests.keras3 import processes
from tests.training import local_cluster
from thattn.io import checkpoint_reading
from thattn.training import run_lock

pytest.importorskip("jax")

_ENV = processes.train_environment()
_STEPS = 8
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _command(model_dir, flags, *extra):
  return cli.command("train", f"--model_dir={model_dir}", "--deterministic",
                     f"--train_steps={_STEPS}", "--checkpoint_every=4",
                     *flags, *extra)


def _train(model_dir, flags, *extra):
  return cli.run_ok(_command(model_dir, flags, *extra), _ENV)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_flags):
  """{backend: (model_dir, stdout)}: one tiny masked-LM job, exported."""
  root = tmp_path_factory.mktemp("keras3_runs")
  return {backend: (root / backend,
                    _train(root / backend, tiny_bert_flags, "--export",
                           f"--backend={backend}"))
          for backend in ("keras", "keras3")}


def test_keras3_equals_the_keras_backend_step_for_step(runs):
  keras_dir, _ = runs["keras"]
  keras3_dir, stdout = runs["keras3"]
  assert "Keras 3 on jax" in stdout  # the binary's default framework
  keras_losses = local_cluster.train_losses(str(keras_dir))
  keras3_losses = local_cluster.train_losses(str(keras3_dir))
  assert sorted(keras3_losses) == sorted(keras_losses) == list(
      range(1, _STEPS + 1))
  for step, loss in keras_losses.items():
    np.testing.assert_allclose(keras3_losses[step], loss, rtol=1e-4,
                               err_msg=f"step {step}")
  summaries = {backend: local_cluster.summary(str(folder))
               for backend, (folder, _) in runs.items()}
  # Training moved the model: the runs are not two untrained models alike.
  keras = summaries["keras"]
  assert (keras["held_out_ln_ppl_after"] <
          keras["held_out_ln_ppl_before"] - 0.01), keras
  assert set(summaries["keras"]) == set(summaries["keras3"])
  assert summaries["keras3"]["backend"] == "keras3"
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    np.testing.assert_allclose(summaries["keras3"][key],
                               summaries["keras"][key], rtol=1e-4)


# thattn-train with every task's tf_keras build refused, saying at exit
# whether tf_keras was imported: a keras3 run draws, trains, saves and
# restores its Keras 3 model alone.
_WITHOUT_THE_TWIN = """
import atexit
import sys
atexit.register(lambda: print("tf_keras imported:", "tf_keras" in sys.modules))
from thattn import tasks
def refuse(self):
  raise AssertionError("the keras3 run built the tf_keras model")
for name in tasks.names():
  tasks.get(name).build = refuse
from thattn.bin import train
sys.argv = ["thattn-train", *sys.argv[1:]]
train.run()
"""


def _run_without_the_twin(flags, framework=None):
  """Its stdout, on the binary's default framework (JAX) or on
  `framework`. A process of its own, not the fork server's: that one has
  imported tf_keras already."""
  env = dict(_ENV, KERAS_BACKEND=framework) if framework else _ENV
  result = subprocess.run(
      [sys.executable, "-c", _WITHOUT_THE_TWIN, *flags], env=env,
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  assert "tf_keras imported: False" in result.stdout, result.stdout[-2000:]
  return result.stdout


def _trained_line(stdout):
  """What the run's description line says it trains, up to the devices
  (which each backend counts in its own unit)."""
  line = next(line for line in stdout.splitlines() if " trained: " in line)
  return line.split(" trained: ")[1].rsplit("; ", 1)[0]


def test_a_keras3_run_on_jax_never_imports_tf_keras(tiny_bert_flags,
                                                    tmp_path):
  """Nor builds a tf_keras model. The task's rule by name
  (`Task.trains_weight`) leaves the frozen embeddings and the unused pooler
  untrained, as the Keras backend does; the run resumes, and another
  starts from its backbone (--init_checkpoint), without the twin."""
  flags = [*tiny_bert_flags, "--freeze_embeddings"]
  keras = _train(tmp_path / "keras", flags, "--backend=keras")
  keras3_flags = _command(tmp_path / "keras3", flags, "--backend=keras3")[3:]
  keras3 = _run_without_the_twin(keras3_flags)
  assert "frozen or unused by the loss" in _trained_line(keras)
  assert _trained_line(keras3) == _trained_line(keras)
  want = local_cluster.train_losses(str(tmp_path / "keras"))
  got = local_cluster.train_losses(str(tmp_path / "keras3"))
  for step, loss in want.items():
    np.testing.assert_allclose(got[step], loss, rtol=1e-4,
                               err_msg=f"step {step}")
  # Resumed from its last checkpoint, still without the tf_keras model.
  resumed = _run_without_the_twin([
      flag if not flag.startswith("--train_steps") else
      f"--train_steps={_STEPS + 2}" for flag in keras3_flags])
  assert "Resumed from" in resumed and f"at step {_STEPS}." in resumed
  # A new run's backbone from that run's Orbax step, by weight name.
  started = _run_without_the_twin(
      _command(tmp_path / "from_keras3", flags, "--backend=keras3",
               f"--init_checkpoint={tmp_path / 'keras3'}")[3:])
  assert f"Backbone initialized from {tmp_path / 'keras3'}" in started


@pytest.fixture(scope="module")
def framework_run(tmp_path_factory, tiny_bert_flags):
  """framework -> (model_dir, stdout) of the masked-LM job on that Keras 3
  framework (KERAS_BACKEND), without the twin; each trained once, on first
  use, and skipped where the framework is not installed."""
  root = tmp_path_factory.mktemp("keras3_frameworks")
  made = {}

  def run(framework):
    pytest.importorskip(framework)
    if framework not in made:
      model_dir = root / framework
      made[framework] = (model_dir, _run_without_the_twin(
          _command(model_dir, tiny_bert_flags, "--backend=keras3")[3:],
          framework))
    return made[framework]
  return run


@pytest.mark.parametrize("framework", ["tensorflow", "torch"])
def test_keras3_on_tensorflow_and_pytorch_trains_the_same_steps(
    runs, framework_run, framework):
  """KERAS_BACKEND set by the user wins over the binary's JAX default; the
  run builds no tf_keras model and imports no tf_keras there either, and
  saves its Keras 3 values as safetensors steps 4 and 8."""
  model_dir, stdout = framework_run(framework)
  assert f"Keras 3 on {framework}" in stdout
  want = local_cluster.train_losses(str(runs["keras"][0]))
  got = local_cluster.train_losses(str(model_dir))
  assert sorted(got) == sorted(want)
  for step, loss in want.items():
    np.testing.assert_allclose(got[step], loss, rtol=1e-4,
                               err_msg=f"{framework}, step {step}")
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["4", "8"]
  for step in (4, 8):
    assert os.listdir(model_dir / "checkpoints" / str(step)) == [
        "state.safetensors"]
  # The same keys as the JAX run's Orbax step, and each weight's value to
  # within 1e-3 (the initial weights' scale is 0.02; weights the loss
  # barely reaches, the key biases that softmax cancels, take Adafactor's
  # normalized steps from rounding-level gradients and agree only to
  # ~1e-4 across frameworks).
  want, got = _saved(runs["keras3"][0]), _saved(model_dir)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    if key.startswith("weight."):
      np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-3,
                                 err_msg=key)


def test_a_keras3_run_on_pytorch_resumes_and_loads_without_tensorflow(
    runs, framework_run, tiny_bert_flags, tmp_path):
  """Its safetensors steps resume it (still without the twin), and
  thattn.keras3.models.load reads them where TensorFlow cannot be imported
  to the backbone thattn.models.load reads; a JAX run's Orbax steps are
  not resumed on PyTorch, and nothing of them changes."""
  from thattn import models  # pylint: disable=g-import-not-at-top
  model_dir = tmp_path / "torch"
  shutil.copytree(framework_run("torch")[0], model_dir)  # resumed below
  flags = _command(model_dir, tiny_bert_flags, "--backend=keras3")[3:]
  resumed = _run_without_the_twin(
      [flag if not flag.startswith("--train_steps") else
       f"--train_steps={_STEPS + 2}" for flag in flags], "torch")
  assert "Resumed from" in resumed and f"at step {_STEPS}." in resumed
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["10", "4", "8"]
  ids = np.random.default_rng(0).integers(5, 60, (2, 12)).astype(np.int32)
  np.save(tmp_path / "ids.npy", ids)
  result = _keras3_load(model_dir, tmp_path / "ids.npy", tmp_path / "out.npy",
                        without_tensorflow=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "tensorflow imported: False" in result.stdout, result.stdout
  want = models.load(str(model_dir))(
      {"input_word_ids": ids, "input_mask": np.ones_like(ids),
       "input_type_ids": np.zeros_like(ids)},
      training=False)["sequence_output"].numpy()
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=0,
                             atol=1e-5 * np.abs(want).max())
  jax_run = tmp_path / "jax_run"
  shutil.copytree(runs["keras3"][0], jax_run)
  before = conftest.snapshot(jax_run)
  result = forkserver.run(
      _command(jax_run, tiny_bert_flags, "--backend=keras3",
               f"--train_steps={_STEPS + 1}"),
      env=dict(_ENV, KERAS_BACKEND="torch"), capture_output=True, text=True,
      timeout=600, check=False)
  assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
  error = result.stderr.strip().splitlines()[-1]
  assert "holds Orbax checkpoints of a keras3 run on JAX" in error, error
  assert conftest.snapshot(jax_run) == before


def test_both_backends_print_the_same_progress_lines(runs):
  formats = {backend: local_cluster.line_formats(stdout)
             for backend, (_, stdout) in runs.items()}
  assert formats["keras3"] == formats["keras"]
  assert formats["keras3"][1] == "step #/# loss # lr # # tokens/s ETA #m#s"
  assert len(formats["keras3"]) == _STEPS + 2  # before, each step, after


def test_the_checkpoint_is_an_orbax_step_of_the_keras3_values(runs):
  """Orbax steps 4 and 8, nothing of TensorFlow's; as many weights as the
  Keras run's backbone and head hold, and the optimizer's iteration (the
  random state is the kill test's, with dropout)."""
  keras3_dir, _ = runs["keras3"]
  assert sorted(os.listdir(keras3_dir / "checkpoints")) == ["4", "8"]
  saved = _saved(keras3_dir)
  keras_run = tf.train.load_checkpoint(str(runs["keras"][0] / "checkpoints" /
                                           f"ckpt-{_STEPS}"))
  weights = {name.split("/.ATTRIBUTES")[0]
             for name in keras_run.get_variable_to_shape_map()
             if name.startswith(("backbone/", "head/")) and
             "/.OPTIMIZER_SLOT/" not in name}
  assert len({key for key in saved if key.startswith("weight.")}) == len(
      weights)
  iteration = [key for key in saved
               if key.startswith("optimizer.") and "iteration" in key]
  assert len(iteration) == 1 and saved[iteration[0]] == _STEPS
  with open(keras3_dir / "run_config.json") as f:
    assert json.load(f)["backend"] == "keras3"


def test_the_keras3_export_serves_text_as_the_keras_one(runs):
  text = tf.constant(["The function returns a list of names.", "Hello"])
  outputs = {}
  for backend, (folder, _) in runs.items():
    served = tf.saved_model.load(str(folder / "export"))
    outputs[backend] = served.signatures["serving_default"](text=text)
  got, want = outputs["keras3"], outputs["keras"]
  np.testing.assert_array_equal(got["input_word_ids"], want["input_word_ids"])
  scale = np.abs(want["sequence_output"].numpy()).max()
  np.testing.assert_allclose(got["sequence_output"], want["sequence_output"],
                             rtol=0, atol=1e-3 * scale)


def _keras3_load(model_dir, ids_path, out_path, without_tensorflow):
  """tests/keras3/load_backbone.py in a fresh Python on JAX; where
  `without_tensorflow`, one in which TensorFlow cannot be imported
  (tests/gpu_machine)."""
  env = dict(_ENV, KERAS_BACKEND="jax")
  if without_tensorflow:
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [
        os.path.join(_ROOT, "tests", "gpu_machine"),
        env.get("PYTHONPATH")]))
  script = os.path.join(_ROOT, "tests", "keras3", "load_backbone.py")
  return subprocess.run(
      [sys.executable, script, str(model_dir), str(ids_path), str(out_path)],
      capture_output=True, text=True, timeout=300, check=False, env=env,
      cwd=_ROOT)


def test_keras3_models_load_reads_either_run_as_thattn_models_load(
    runs, tmp_path):
  """thattn.keras3.models.load gives the backbone thattn.models.load gives
  (the same sequence output): of the keras3 run (Orbax steps) in a Python
  where TensorFlow cannot be imported, of the Keras run (tf.train
  checkpoints) where it can; without it, the Keras run's checkpoint is
  refused with the pip command."""
  from thattn import models  # pylint: disable=g-import-not-at-top
  ids = np.random.default_rng(0).integers(5, 60, (2, 12)).astype(np.int32)
  ids_path = tmp_path / "ids.npy"
  np.save(ids_path, ids)
  for backend, without_tensorflow in (("keras3", True), ("keras", False)):
    model_dir = runs[backend][0]
    out_path = tmp_path / f"{backend}.npy"
    result = _keras3_load(model_dir, ids_path, out_path, without_tensorflow)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"tensorflow imported: {not without_tensorflow}"
            in result.stdout), result.stdout
    want = models.load(str(model_dir))(
        {"input_word_ids": ids, "input_mask": np.ones_like(ids),
         "input_type_ids": np.zeros_like(ids)},
        training=False)["sequence_output"].numpy()
    np.testing.assert_allclose(np.load(out_path), want, rtol=0,
                               atol=1e-5 * np.abs(want).max())
  refused = _keras3_load(runs["keras"][0], ids_path, tmp_path / "no.npy",
                         without_tensorflow=True)
  assert refused.returncode != 0
  assert "pip install -e '.[tensorflow]' in a thattn checkout" in (
      refused.stderr), refused.stderr[-2000:]


# Keras 3.15.1 has no test of a mixed-precision run's losses against
# float32's; the closest is keras/src/metrics/metric_test.py
# (test_dtype_arg): a mean under DTypePolicy("mixed_float16") against its
# float NumPy value, atol=1e-3. A step's loss is such a mean (over the
# masked positions), so its tolerance (measured here: at most 1.6e-4).
MIXED_PRECISION_ATOL = 1e-3


def test_keras3_in_bfloat16_tracks_the_float32_run(runs, tiny_bert_flags,
                                                   tmp_path):
  """--mixed_precision=bfloat16: the same seed's run, computing in bfloat16
  on float32 weights, takes the float32 run's steps within Keras 3's
  mixed-precision tolerance, but not bit for bit."""
  stdout = _train(tmp_path / "bf16", tiny_bert_flags, "--backend=keras3",
                  "--mixed_precision=bfloat16")
  # The run's own description, read from the Keras 3 model it trains.
  assert ("Keras 3 on jax, mixed_bfloat16 (bfloat16 compute, float32 "
          "weights)") in stdout, stdout
  want = local_cluster.train_losses(str(runs["keras3"][0]))
  got = local_cluster.train_losses(str(tmp_path / "bf16"))
  assert sorted(got) == sorted(want) == list(range(1, _STEPS + 1))
  for step, loss in want.items():
    np.testing.assert_allclose(got[step], loss, rtol=0,
                               atol=MIXED_PRECISION_ATOL,
                               err_msg=f"step {step}")
  assert [got[step] for step in want] != list(want.values())
  after = "held_out_ln_ppl_after"
  np.testing.assert_allclose(local_cluster.summary(str(tmp_path / "bf16"))[
      after], local_cluster.summary(str(runs["keras3"][0]))[after], rtol=0,
                             atol=MIXED_PRECISION_ATOL)
  # Weights and optimizer state are kept (and saved) in float32.
  saved = _saved(tmp_path / "bf16")
  assert {value.dtype for value in saved.values()
          if np.issubdtype(value.dtype, np.floating)} == {np.dtype("float32")}
  assert any(key.startswith("optimizer.") and value.dtype == np.float32
             for key, value in saved.items())


def _tiny_task_loss(mixed_precision):
  """A tiny BERT's TaskLoss and Steps (thattn.keras3, on this process's
  Keras 3 framework), made as the backend makes them for
  `mixed_precision`, and a batch."""
  from thattn import models  # pylint: disable=g-import-not-at-top
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.training import keras3_backend  # pylint: disable=g-import-not-at-top
  from thattn.training import keras3_steps  # pylint: disable=g-import-not-at-top
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  options = options_lib.TrainOptions(backend="keras3", warmup_steps=1,
                                     mixed_precision=mixed_precision)
  config = models.model_config("bert_tiny", vocab_size=64, d_model=16,
                               d_ff=32, num_layers=1, dropout_rate=0.0)
  with keras3_steps.dtype_policy(mixed_precision):
    layer = keras3_steps.TaskLoss(tasks.get("mlm"), config)
    for weight in layer.backbone.get_layer("pooler").weights:
      weight.trainable = False  # as the backend leaves it: MLM never reads it
    steps = keras3_steps.Steps(layer, keras3_backend.make_optimizer(options))
  rng = np.random.default_rng(0)
  batch = {"input_word_ids": rng.integers(0, 64, (2, 8)),
           "input_mask": np.ones((2, 8)), "input_type_ids": np.zeros((2, 8)),
           "masked_lm_positions": rng.integers(0, 8, (2, 3)),
           "masked_lm_ids": rng.integers(0, 64, (2, 3)),
           "masked_lm_weights": np.ones((2, 3))}
  return layer, steps, batch


@pytest.mark.parametrize("mixed_precision", ["bfloat16", "float16"])
def test_mixed_precision_computes_in_half_on_float32_weights(
    mixed_precision):
  import keras  # pylint: disable=g-import-not-at-top
  before = keras.config.dtype_policy().name
  layer, _, _ = _tiny_task_loss(mixed_precision)
  model = layer.backbone
  assert model.dtype_policy.name == f"mixed_{mixed_precision}"
  assert model.get_layer("block_0").attention.compute_dtype == mixed_precision
  assert layer.head.compute_dtype == mixed_precision
  assert {output.dtype for output in model.outputs} == {mixed_precision}
  assert {v.dtype for v in layer.trainable_variables} == {"float32"}
  assert layer.dtype_policy.name == "float32"  # the loss itself
  assert keras.config.dtype_policy().name == before == "float32"


def test_a_float16_step_whose_gradients_overflow_is_skipped_and_counted():
  """Keras 3's LossScaleOptimizer skips such a step but leaves its step
  count behind; the run counts it, as tf_keras's does, so the step stays
  the data's and the schedule's."""
  import keras  # pylint: disable=g-import-not-at-top
  layer, steps, batch = _tiny_task_loss("float16")
  optimizer = steps.optimizer
  assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
  numpy = lambda: [keras.ops.convert_to_numpy(v.value)
                   for v in layer.trainable_variables]
  initial = numpy()
  optimizer.dynamic_scale.assign(float("inf"))  # every gradient overflows
  steps.reload()
  losses = [steps.train_step(batch) for _ in range(2)]
  steps.sync()
  assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 2
  for got, want in zip(numpy(), initial):
    np.testing.assert_array_equal(got, want)
  optimizer.dynamic_scale.assign(2.0**15)  # tf_keras's initial scale
  steps.reload()
  losses.append(steps.train_step(batch))
  steps.sync()
  assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 3
  assert float(keras.ops.convert_to_numpy(optimizer.dynamic_scale)) == 2.0**15
  assert any(not np.array_equal(got, want)
             for got, want in zip(numpy(), initial))
  assert np.isfinite(losses).all() and losses[0] == losses[1] == losses[2]


def _kill_after_step_6_and_rerun(model_dir, flags, *extra):
  """Trains into model_dir, SIGKILLed after step 6 (checkpoint 4 saved);
  reruns the same command; returns the rerun's stdout."""
  process = forkserver.Popen(
      _command(model_dir, flags, "--backend=keras3", "--log_every=1", *extra),
      env=_ENV, text=True, stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith(f"step      6/{_STEPS}"):
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  rerun = _train(model_dir, flags, "--backend=keras3", *extra)
  assert "at step 4" in rerun
  return rerun


def _saved(model_dir, step=_STEPS):
  """{key: array} of a keras3 run's step folder."""
  return checkpoint_reading.read_step(
      str(model_dir / "checkpoints" / str(step)))


def _assert_same_checkpoints(got_dir, want_dir):
  want, got = _saved(want_dir), _saved(got_dir)
  assert sorted(want) == sorted(got)
  for key, value in want.items():
    assert np.array_equal(got[key], value), key


def test_a_killed_run_resumes_to_the_uninterrupted_weights(tiny_bert_flags,
                                                           tmp_path):
  """SIGKILL after step 6 (checkpoint 4 saved), rerun: every weight and
  optimizer slot bit for bit. With dropout, so the checkpoint must also
  hold dropout's random state for the rerun to draw the uninterrupted
  run's masks (without dropout the same holds with less to restore)."""
  dropout = ("--dropout_rate=0.3",)
  _train(tmp_path / "straight", tiny_bert_flags, "--backend=keras3", *dropout)
  _kill_after_step_6_and_rerun(tmp_path / "killed", tiny_bert_flags, *dropout)
  _assert_same_checkpoints(tmp_path / "killed", tmp_path / "straight")
  assert any(key.startswith("random.")
             for key in _saved(tmp_path / "killed"))


def _refused(model_dir, flags, *extra):
  """A keras3 rerun that must fail: its error line (no traceback)."""
  result = forkserver.run(_command(model_dir, flags, "--backend=keras3",
                                   *extra), env=_ENV, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def test_the_keras3_run_keeps_the_drivers_promises(runs, tiny_bert_flags,
                                                    tmp_path):
  """Issue 33's surfaces for this backend: a changed flag, a damaged
  checkpoint and a held lock are named, and change nothing."""
  run = tmp_path / "run"
  shutil.copytree(runs["keras3"][0], run)
  before = conftest.snapshot(run)
  error = _refused(run, tiny_bert_flags, "--learning_rate=0.001")
  assert "learning_rate: 0.03 -> 0.001" in error, error
  with run_lock.hold(str(run), log=lambda _: None):
    error = _refused(run, tiny_bert_flags, f"--train_steps={_STEPS + 1}")
  assert "is in use by another run" in error, error
  assert conftest.snapshot(run) == before
  # The largest file of the newest step: its values.
  data = max((path for path in (run / "checkpoints" / str(_STEPS)).rglob("*")
              if path.is_file()), key=lambda path: path.stat().st_size)
  with open(data, "r+b") as f:
    f.truncate(data.stat().st_size // 2)
  error = _refused(run, tiny_bert_flags, f"--train_steps={_STEPS + 1}")
  for fragment in (f"checkpoints/{_STEPS} (", "cannot be restored",
                   "checkpoints/4", "--resume_from=latest_intact"):
    assert fragment in error, error
  resumed = _train(run, tiny_bert_flags, "--backend=keras3",
                   f"--train_steps={_STEPS + 1}",
                   "--resume_from=latest_intact")
  assert "at step 4." in resumed


def test_a_keras3_model_dir_of_tensorflow_checkpoints_is_refused(
    runs, tiny_bert_flags, tmp_path):
  """A keras3 run of thattn 0.2 saved TensorFlow checkpoints (the twin's):
  a run on JAX now says how to go on from it and changes nothing; the
  tools that read a run still read it."""
  run = tmp_path / "old"
  shutil.copytree(runs["keras"][0], run)
  config = json.loads((run / "run_config.json").read_text())
  (run / "run_config.json").write_text(json.dumps(dict(config,
                                                       backend="keras3")))
  before = conftest.snapshot(run)
  error = _refused(run, tiny_bert_flags, f"--train_steps={_STEPS + 1}")
  assert "TensorFlow checkpoints of a keras3 run" in error, error
  assert f"--init_checkpoint={run}" in error, error
  assert conftest.snapshot(run) == before


@pytest.fixture(scope="module")
def t5_runs(tmp_path_factory, tiny_bert_flags):
  """Span corruption on a tiny T5: {name: model_dir}, one device and a
  batch:2,model:2 mesh of 4 JAX host devices."""
  root = tmp_path_factory.mktemp("keras3_t5")
  flags = list(tiny_bert_flags[:2]) + [
      "--task=span_corruption", "--preset=t5_tiny", "--batch_size=4",
      "--sequence_length=32", "--eval_steps=1", "--warmup_steps=1",
      "--log_every=4", "--noexport", "--backend=keras3"]
  stdout = {name: _train(root / name, flags, *extra)
            for name, extra in (("one", ()),
                                ("mesh", ("--mesh_shape=batch:2,model:2",)))}
  assert "mesh batch:2,model:2 on 4 JAX devices" in stdout["mesh"]
  return {name: root / name for name in stdout}


def test_a_sharded_t5_run_equals_the_unsharded_one(t5_runs):
  one = local_cluster.train_losses(str(t5_runs["one"]))
  mesh = local_cluster.train_losses(str(t5_runs["mesh"]))
  assert sorted(one) == sorted(mesh) == [4, 8]
  for step, loss in one.items():
    np.testing.assert_allclose(mesh[step], loss, rtol=1e-4)


def test_the_mesh_splits_the_heads_d_ff_vocab_and_their_slots():
  result = forkserver.run(
      [sys.executable, os.path.join(_HERE, "keras3_mesh_script.py"),
       "batch:2,model:2"], env=dict(_ENV, KERAS_BACKEND="jax"),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  layout = json.loads(result.stdout.strip().splitlines()[-1])
  assert layout["devices"] == 4
  weights = layout["weights"]
  for path, axes in weights.items():
    kind = "/".join(path.split("/")[-2:])
    want = {"query/kernel": [None, "model", None],
            "key/kernel": [None, "model", None],
            "value/kernel": [None, "model", None],
            "output/kernel": (["model", None] if "feed_forward" in path else
                              ["model", None, None]),
            "input/kernel": [None, "model"],
            "token_embedding/embeddings": ["model", None]}.get(kind)
    if want is not None:
      assert axes == want, path
  assert sum("query/kernel" in path for path in weights) == 6  # 2+2+2 layers
  # Adafactor's second moments (unfactored at these sizes) lie like their
  # weights.
  for path, slots in layout["slots"].items():
    assert slots["v"] == weights[path], path


def test_a_keras3_t5_run_converts_to_mesh_tensorflow(t5_runs, tmp_path):
  from thattn import models  # pylint: disable=g-import-not-at-top
  from thattn.mtf import convert  # pylint: disable=g-import-not-at-top
  from thattn.mtf import models as mtf_models  # pylint: disable=g-import-not-at-top
  written = convert.thattn_to_mtf(model_dir=str(t5_runs["one"]),
                                  mtf_model_dir=str(tmp_path / "mtf"),
                                  log=lambda _: None)
  variables = mtf_models.read_checkpoint(
      mtf_models.latest_checkpoint(str(tmp_path / "mtf")))
  model = models.load(str(t5_runs["one"]))
  vocab_size = model.get_layer("token_embedding").vocab_size
  rng = np.random.default_rng(0)
  inputs = rng.integers(2, vocab_size, size=(2, 7)).astype(np.int32)
  targets = rng.integers(2, vocab_size, size=(2, 5)).astype(np.int32)
  expected = mtf_models.logits(gin_text=written, vocab_size=vocab_size,
                               variables=variables, inputs=inputs,
                               targets=targets)
  got = model({"encoder_input_tokens": inputs,
               "decoder_input_tokens": np.pad(targets, [(0, 0), (1, 0)])[
                   :, :-1]}).numpy()
  np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("options, message", [
    (dict(strategy="mirrored"),
     "--strategy=mirrored does not apply with --backend=keras3"),
    (dict(tpu="grpc://tpu"), "--tpu=grpc://tpu does not apply"),
    (dict(layout_rules="key_heads:model"),
     "needs --mesh_shape with --backend=keras3"),
    (dict(mesh_shape="batch:2,model:2", layout_rules="key_heads:data"),
     "data"),
])
def test_options_keras3_cannot_train_are_refused(options, message):
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=message):
    options_lib.TrainOptions(backend="keras3", **options)


def test_every_built_in_task_trains_on_keras3_and_others_are_refused():
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.training import backend as backend_lib  # pylint: disable=g-import-not-at-top
  keras3 = backend_lib.get("keras3")
  built_in = ("mlm", "span_corruption", "causal_lm", "prefix_lm",
              "classification", "squad", "recall")
  for name in built_in:
    keras3.check_task(tasks.get(name), None)

  class Unknown(tasks.Task):  # a user's task, not registered: no Keras 3 loss
    name = "my_task"

  # After the built-in ones, any a test registered with Keras 3 parts
  # (tests/tasks/toy_task_test.py's, when it ran in this process).
  with pytest.raises(ValueError, match="--backend=keras3 trains the tasks "
                     f"{', '.join(built_in)}(, \\w+)*; --task=my_task "
                     "trains with --backend=keras"):
    keras3.check_task(Unknown, None)
