"""thattn-train, the binary: SIGKILL and rerun, flags, errors."""

import json
import os
import signal
import subprocess

import pytest

from tests import cli
from tests import forkserver

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def data_flags(tiny_bert_flags):
  return tiny_bert_flags[:2]  # the text file and its tokenizer


def _command(model_dir, data_flags, **extra):
  flags = dict(preset="bert_tiny", d_model=32, d_ff=64, num_layers=1,
               train_steps=30, batch_size=8, sequence_length=32,
               warmup_steps=5, log_every=5, checkpoint_every=10,
               eval_every=0, eval_steps=2, **extra)
  return (cli.command("train", f"--model_dir={model_dir}", "--noexport") +
          data_flags +
          [f"--{name}={value}" for name, value in flags.items()])


def _summary(directory):
  with open(directory / "summary.json") as f:
    return json.load(f)


def test_sigkill_then_rerun_matches_an_uninterrupted_run(tmp_path,
                                                         data_flags):
  """The default task's path (masked LM, Adafactor), killed for real."""
  deterministic = data_flags + ["--deterministic"]
  straight = forkserver.run(_command(tmp_path / "straight", deterministic),
                            env=_ENV, capture_output=True, text=True,
                            timeout=300, check=False)
  assert straight.returncode == 0, straight.stderr[-3000:]
  assert "Held-out ln_ppl after training" in straight.stdout

  killed = tmp_path / "killed"
  process = forkserver.Popen(_command(killed, deterministic), env=_ENV,
                             text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith("step     25/"):  # checkpoints 10 and 20 are saved
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  rerun = forkserver.run(_command(killed, deterministic), env=_ENV,
                         capture_output=True, text=True, timeout=300,
                         check=False)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "at step 20" in rerun.stdout
  steps = [line.split()[1] for line in rerun.stdout.splitlines()
           if line.startswith("step ")]
  assert steps == ["25/30", "30/30"]  # nothing repeated, nothing skipped
  assert _summary(killed)["steps"] == 30
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    assert _summary(killed)[key] == _summary(tmp_path / "straight")[key]


def test_bad_flags_give_a_clear_error(tmp_path, data_flags):
  result = forkserver.run(
      _command(tmp_path, data_flags, strategy="tpu"), env=_ENV,
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert "thattn-train: error: --strategy=tpu found no TPU" in result.stderr
  assert "Traceback" not in result.stderr
