"""The training loop: learning, checkpoints, resume, and the binary."""

import json
import os
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


def test_resume_after_a_crash_reaches_the_uninterrupted_result(tmp_path):
  straight = train_lib.train(model_dir=str(tmp_path / "straight"),
                             log=lambda line: None, **TINY)

  def crash_at_step_15(line):
    if line.startswith("step     15/"):
      raise _Crash()

  with pytest.raises(_Crash):
    train_lib.train(model_dir=str(tmp_path / "crashed"), log=crash_at_step_15,
                    **TINY)
  resumed_lines = []
  resumed = train_lib.train(model_dir=str(tmp_path / "crashed"),
                            log=resumed_lines.append, **TINY)
  assert resumed["resumed_from_step"] == 10
  assert any("Resumed from" in line for line in resumed_lines)
  np.testing.assert_allclose(resumed["held_out_ln_ppl_after"],
                             straight["held_out_ln_ppl_after"], rtol=1e-5)


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
