"""The training loop: learning, checkpoints, resume, and the binary."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from thattn.tasks import train_lib

TINY = dict(train_steps=20, batch_size=8, sequence_length=8, d_model=16,
            num_heads=2, num_layers=1, warmup_steps=5, log_every=5,
            checkpoint_every=10, eval_batches=2)


class _Crash(Exception):
  pass


def test_training_lowers_held_out_loss_and_writes_a_summary(tmp_path):
  lines = []
  summary = train_lib.train(model_dir=str(tmp_path), log=lines.append,
                            **dict(TINY, train_steps=60))
  assert summary["held_out_ln_ppl_after"] < summary["held_out_ln_ppl_before"]
  assert summary["steps"] == 60
  with open(tmp_path / "summary.json") as f:
    assert json.load(f) == summary
  assert any("tokens/s" in line and "ETA" in line for line in lines)


def test_resume_after_a_crash_continues_from_the_last_checkpoint(tmp_path):
  def crash_at_step_15(line):
    if line.startswith("step     15/"):
      raise _Crash()

  with pytest.raises(_Crash):
    train_lib.train(model_dir=str(tmp_path), log=crash_at_step_15, **TINY)
  resumed_lines = []
  resumed = train_lib.train(model_dir=str(tmp_path), log=resumed_lines.append,
                            **TINY)
  assert resumed["resumed_from_step"] == 10 and resumed["steps"] == 20
  assert any("Resumed from" in line for line in resumed_lines)
  # Steps 11..20 ran once each after the resume: no step is repeated.
  steps = [line.split()[1] for line in resumed_lines if line.startswith("step")]
  assert steps == ["15/20", "20/20"]


def _train_command(model_dir):
  flags = {"train_steps": 30, "batch_size": 8, "sequence_length": 8,
           "d_model": 16, "num_heads": 2, "num_layers": 1, "warmup_steps": 5,
           "log_every": 5, "checkpoint_every": 10}
  return ([sys.executable, "-m", "thattn.tasks.train_main", "--deterministic",
           f"--model_dir={model_dir}"] +
          [f"--{name}={value}" for name, value in flags.items()])


def test_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  straight = subprocess.run(_train_command(tmp_path / "straight"), env=env,
                            capture_output=True, text=True, timeout=300,
                            check=True)
  assert "Held-out after" in straight.stdout

  killed = tmp_path / "killed"
  process = subprocess.Popen(_train_command(killed), env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith("step     25/"):  # checkpoints 10 and 20 are saved
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  rerun = subprocess.run(_train_command(killed), env=env, capture_output=True,
                         text=True, timeout=300, check=True)
  assert "at step 20" in rerun.stdout

  def summary(directory):
    with open(directory / "summary.json") as f:
      return json.load(f)

  assert summary(killed)["steps"] == 30
  assert (summary(killed)["held_out_ln_ppl_after"] ==
          summary(tmp_path / "straight")["held_out_ln_ppl_after"])


@pytest.mark.parametrize("kwargs,message", [
    ({"task": "mlm"}, "Unknown task 'mlm'"),
    ({"train_steps": 0}, "train_steps must be positive, got 0"),
    ({"attention": "softmax"}, "Unknown attention variant 'softmax'"),
])
def test_bad_arguments(tmp_path, kwargs, message):
  with pytest.raises(ValueError, match=message):
    train_lib.train(model_dir=str(tmp_path), **dict(TINY, **kwargs))


def test_binary_runs_with_flags(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
      [sys.executable, "-m", "thattn.tasks.train_main", "--train_steps=10",
       "--batch_size=4", "--sequence_length=8", "--d_model=16",
       "--num_heads=2", "--num_layers=1", "--log_every=5",
       "--attention=dynamic", f"--model_dir={tmp_path}"],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Held-out after" in result.stdout
  assert os.path.exists(tmp_path / "summary.json")
