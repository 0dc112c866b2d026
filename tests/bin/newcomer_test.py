"""thattn-train as a new user meets it: help, a quiet start, run names.

Each case runs the binary without TF_CPP_MIN_LOG_LEVEL set (unless the case
sets it); what TensorFlow's start-up prints is checked on fresh processes,
as a user starts them, the rest on processes forked with TensorFlow already
imported (tests/forkserver.py).
"""

import os
import subprocess

import pytest

from tests import cli
from tests import forkserver


def _env(**extra):
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env.update(extra)
  return env


def _train(*flags, cwd=None, env=None, fresh=False):
  """The binary's run: in a fresh Python (`fresh`) or a forked one."""
  launcher = subprocess if fresh else forkserver
  return launcher.run(cli.command("train", *flags),
                      capture_output=True, text=True, timeout=300,
                      check=False, cwd=cwd, env=env or _env())


@pytest.mark.parametrize("help_flag", ["--help", "--helpshort"])
def test_help_lists_the_binarys_own_flags_with_defaults(help_flag):
  result = _train(help_flag)
  out = result.stdout
  assert "thattn-train: train a BERT, ALBERT, T5 or LM" in out
  for flag, default in (("--preset", None), ("--task", "'mlm'"),
                        ("--train_steps", "'1200'")):
    assert f"  {flag}:" in out, f"{flag} missing from {help_flag}:\n{out}"
    if default:
      section = out[out.index(f"  {flag}:"):][:400]
      assert f"(default: {default})" in section, section
  # Only thattn's flags: absl's and TensorFlow's own are in --helpfull.
  # (A count of lines stood here; the registry's variants, which
  # --attention lists, grow the help by right.)
  for foreign in ("--logtostderr", "--only_check_args", "--pdb",
                  "--test_tmpdir", "--tt_check_filter", "--hbm_oom_exit",
                  "--op_conversion_fallback_to_while_loop"):
    assert foreign not in out, foreign


def test_a_mistyped_flag_points_to_a_help_that_lists_the_flags():
  result = _train("--num_head=8")
  assert result.returncode != 0
  assert "Did you mean: num_heads" in result.stderr
  assert "--helpshort" in result.stderr  # which lists them (test above)


@pytest.fixture(scope="module")
def data_flags(tiny_bert_flags):
  return tiny_bert_flags + ["--train_steps=2"]


def test_runs_are_quiet_and_named_by_what_sets_them_apart(tmp_path,
                                                          data_flags):
  outputs = []
  for heads in (2, 4):
    result = _train(*data_flags, f"--num_heads={heads}", cwd=tmp_path,
                    fresh=heads == 2)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs.append(result.stdout + result.stderr)
  runs = sorted(os.listdir(tmp_path / "thattn_runs"))
  assert len(runs) == 2, runs
  assert runs[0].startswith("mlm_bert_tiny_talking_heads_h2")
  assert runs[1].startswith("mlm_bert_tiny_talking_heads_h4")
  # A fresh start says nothing of TensorFlow's own.
  assert "cuInit" not in outputs[0]
  assert "cuda drivers" not in outputs[0]
  assert "oneDNN" not in outputs[0]
  for output in outputs:
    # The model's parameters and the trained ones, each said plainly.
    assert "model parameters (backbone" in output
    assert "trained: " in output


def test_a_users_log_level_is_kept(tmp_path, data_flags):
  result = _train(*data_flags, cwd=tmp_path,
                  env=_env(TF_CPP_MIN_LOG_LEVEL="0"), fresh=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "oneDNN" in result.stderr  # TensorFlow's own start-up note
