"""Issue 33: a full disk, for real: a small tmpfs the test mounts and fills.

CI runs as root, so the test mounts a tmpfs of a few MB; where mounting is
not allowed it skips, printing why. On it:

- a training run (a tiny BERT, `--deterministic`) killed after its step-4
  checkpoint, then rerun on a disk filled to the last byte: it stops with
  one line naming the folder and the full disk, no traceback, and keeps its
  last complete checkpoint, which restores; with the space freed, the rerun
  resumes from it and ends with the weights of an uninterrupted run;
- an export and a conversion into the full disk: one line each, the target
  as it was (absent), no staging folder left;
- thattn's cache (`$THATTN_CACHE_DIR`) on the full disk: the default
  corpus cannot be built, and the run says so in one line naming the cache
  and leaves no model_dir and no temporary file; a run that needs only the
  compiled kernel from the cache trains on TensorFlow ops, saying why,
  without first spending a compile on a library it cannot write.
"""

import os
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from tests import forkserver

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_STEPS = 8
_SIZE = "24m"


def _run(binary, *flags):
  return cli.run(cli.command(binary, *flags), env=_ENV)


@pytest.fixture
def disk(tmp_path):
  """A mounted tmpfs of _SIZE, unmounted after the test."""
  mount_point = tmp_path / "disk"
  mount_point.mkdir()
  mounted = subprocess.run(
      ["mount", "-t", "tmpfs", "-o", f"size={_SIZE}", "tmpfs",
       str(mount_point)], capture_output=True, text=True, check=False)
  if mounted.returncode != 0:
    pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()!r}")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk):
  """Fills the disk to its last byte with a file of ours; returns it.

  Unbuffered writes, halving the size at each refusal, down to one byte.
  """
  filler = disk / "filler"
  descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
  size = 1 << 20
  try:
    while size:
      try:
        os.write(descriptor, b"\0" * size)
      except OSError:
        size //= 2
  finally:
    os.close(descriptor)
  return filler


def _error(result, program):
  assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  line = result.stderr.strip().splitlines()[-1]
  assert line.startswith(f"{program}: error: "), line
  return line


def _weights(checkpoint):
  reader = tf.train.load_checkpoint(str(checkpoint))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if "save_counter" not in name}


def test_a_run_that_fills_the_disk_stops_and_resumes_exactly(
    disk, tmp_path, tiny_bert_flags):
  flags = list(tiny_bert_flags) + [f"--train_steps={_STEPS}",
                                   "--checkpoint_every=2", "--deterministic"]
  straight = tmp_path / "straight"
  result = _run("train", f"--model_dir={straight}", *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  run = disk / "run"
  process = forkserver.Popen(cli.command("train", f"--model_dir={run}",
                                         *flags),
                             env=_ENV, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
  for line in process.stdout:
    if line.startswith(f"step      5/{_STEPS}"):  # ckpt-4 is saved
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  checkpoints = run / "checkpoints"
  latest = tf.train.latest_checkpoint(str(checkpoints))
  assert latest.endswith("ckpt-4"), latest

  filler = _fill(disk)
  error = _error(_run("train", f"--model_dir={run}", *flags), "thattn-train")
  assert "the disk is full (no space left on device)" in error, error
  # The file that could not be written is named (the first write of the
  # rerun to fail: its TensorBoard events file, or a checkpoint).
  assert (f"into the model_dir {run} ({run}/" in error or
          "could not write the checkpoint of step" in error), error
  # The last complete checkpoint is the one before, and it restores.
  assert tf.train.latest_checkpoint(str(checkpoints)) == latest
  assert not [name for name in os.listdir(checkpoints) if "_temp" in name]
  _weights(latest)

  filler.unlink()  # space freed: the same command resumes
  result = _run("train", f"--model_dir={run}", *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "at step 4." in result.stdout, result.stdout[-2000:]
  want = _weights(straight / "checkpoints" / f"ckpt-{_STEPS}")
  got = _weights(checkpoints / f"ckpt-{_STEPS}")
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    assert np.array_equal(got[name], value), name


def test_an_export_into_a_full_disk_leaves_no_trace(disk, tmp_path,
                                                   tiny_bert_flags):
  trained = tmp_path / "trained"
  result = _run("train", f"--model_dir={trained}", *tiny_bert_flags,
                "--train_steps=1")
  assert result.returncode == 0, result.stderr[-3000:]
  filler = _fill(disk)
  error = _error(_run("export", f"--model_dir={trained}",
                      f"--export_dir={disk / 'export'}"), "thattn-export")
  assert str(disk / "export") in error and "the disk is full" in error, error
  assert sorted(os.listdir(disk)) == [filler.name]


def test_a_conversion_into_a_full_disk_leaves_no_trace(disk, tmp_path):
  from thattn.mtf import models as mtf_models  # pylint: disable=g-import-not-at-top
  from tests.mtf import model_convert_test  # pylint: disable=g-import-not-at-top
  gin_text = next(iter(model_convert_test.GIN.values()))
  variables = mtf_models.initial_variables(
      gin_text=gin_text, vocab_size=model_convert_test.VOCAB, seed=1)
  mtf_models.write_model_dir(mtf_model_dir=str(tmp_path / "mtf"),
                             gin_text=gin_text, variables=variables, step=10)
  filler = _fill(disk)
  error = _error(_run("convert", f"--mtf_model_dir={tmp_path / 'mtf'}",
                      f"--model_dir={disk / 'converted'}"), "thattn-convert")
  assert "the disk is full" in error, error
  assert sorted(os.listdir(disk)) == [filler.name]


def test_a_full_cache_disk_is_named_and_leaves_nothing(disk, tmp_path):
  cache = disk / "cache"
  cache.mkdir()
  filler = _fill(disk)
  result = forkserver.run(
      cli.command("train", f"--model_dir={tmp_path / 'run'}",
                  "--train_steps=1", "--noexport"), env=dict(_ENV, THATTN_CACHE_DIR=str(cache)),
      capture_output=True, text=True, timeout=600, check=False)
  error = _error(result, "thattn-train")
  assert error.startswith(f"thattn-train: error: could not write thattn's "
                          f"cache {cache}/corpus-"), error
  assert "the disk is full" in error and "THATTN_CACHE_DIR" in error, error
  assert not (tmp_path / "run").exists()  # a failed start leaves nothing
  leftovers = [str(path) for path in cache.rglob("*") if path.is_file()]
  assert leftovers == [], leftovers
  assert sorted(os.listdir(disk)) == ["cache", filler.name]


def test_a_kernel_that_cannot_be_cached_falls_back_and_says_why(
    disk, tmp_path, tiny_bert_flags):
  cache = disk / "cache"
  cache.mkdir()
  _fill(disk)
  result = forkserver.run(
      cli.command("train", f"--model_dir={tmp_path / 'run'}",
                  *tiny_bert_flags, "--train_steps=2"),
      env=dict(_ENV, THATTN_CACHE_DIR=str(cache)), capture_output=True,
      text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "kernel is unavailable, so TensorFlow ops run instead" in (
      result.stderr), result.stderr[-3000:]
  assert str(cache / "kernels") in result.stderr, result.stderr[-3000:]
  # Refused before the compiler ran, not after its 15 s or more.
  assert "Compiling thattn's" not in result.stdout + result.stderr
  assert (tmp_path / "run" / "checkpoints" / "ckpt-2.index").exists()
