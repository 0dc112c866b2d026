"""What a model_dir and an export dir promise, tried through the binaries.

Each case runs `python -m thattn.bin.train` or `thattn.bin.export` in fresh
processes, as a user would, and checks the message (it names the file or
value) and that what was there before is byte-identical after.
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import pytest

from tests import cli
from tests import forkserver

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def data_flags(tiny_bert_flags):
  """The tiny run's flags, a checkpoint every step, and a file of bad bytes."""
  bad = pathlib.Path(tiny_bert_flags[0].split("=", 1)[1]).parent / "bad.txt"
  bad.write_bytes(b"fine text\n\nthen \xff bad bytes\n")
  return tiny_bert_flags + ["--checkpoint_every=1"]


def _run(binary, *flags, timeout=300):
  return cli.run(cli.command(binary, *flags), env=_ENV, timeout=timeout)


def _train(model_dir, data_flags, *flags):
  return _run("train", f"--model_dir={model_dir}", *data_flags, *flags)


def _snapshot(folder):
  """{relative path: sha256} of every file under folder.

  The lock file is left out: each run writes who holds it, and it holds
  nothing of the run's.
  """
  digests = {}
  for root, _, files in os.walk(folder):
    for name in files:
      if name == ".thattn.lock":
        continue
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        digests[os.path.relpath(path, folder)] = hashlib.sha256(
            f.read()).hexdigest()
  return digests


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_flags):
  """A finished 3-step run with checkpoints 1, 2 and 3."""
  run = tmp_path_factory.mktemp("trained") / "run"
  result = _train(run, data_flags, "--train_steps=3")
  assert result.returncode == 0, result.stderr[-3000:]
  return run


@pytest.fixture
def run_copy(trained, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(trained, copy)
  return copy


def _failed(result, *fragments):
  assert result.returncode != 0, result.stdout[-2000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  for fragment in fragments:
    assert fragment in result.stderr, (fragment, result.stderr[-3000:])


def test_export_refuses_a_folder_of_user_files(trained, tmp_path,
                                               killed_staging):
  target = tmp_path / "served"
  target.mkdir()
  (target / "notes.txt").write_text("my own notes")
  (target / "data.csv").write_text("1,2,3")
  before = _snapshot(target)
  leftover = killed_staging(target, "thattn-export")  # a SIGKILLed export
  # --overwrite does not make an export delete files it did not write.
  result = _run("export", f"--model_dir={trained}", f"--export_dir={target}",
                "--overwrite")
  _failed(result, str(target), "not a thattn export (data.csv, notes.txt)",
          "never deletes files it did not write")
  assert _snapshot(target) == before
  assert os.path.exists(leftover)  # refused before anything was touched

  for name in ("notes.txt", "data.csv"):
    (target / name).unlink()
  result = _run("export", f"--model_dir={trained}", f"--export_dir={target}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (target / "thattn_export.json").exists()
  assert not os.path.exists(leftover)  # a killed export's staging: removed
  assert "left by a killed thattn process" in result.stdout
  # A previous thattn export is replaced.
  result = _run("export", f"--model_dir={trained}", f"--export_dir={target}")
  assert result.returncode == 0, result.stderr[-3000:]


def test_two_runs_racing_for_one_model_dir(tmp_path, data_flags):
  run = tmp_path / "run"
  common = [f"--model_dir={run}", *data_flags, "--train_steps=150",
            "--checkpoint_every=50", "--log_every=50"]
  started = time.time()
  processes = [forkserver.Popen(cli.command("train", *common, *extra),
                                env=_ENV, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
               for extra in ([], ["--learning_rate=0.001"])]
  finished = {}
  while len(finished) < 2:
    for index, process in enumerate(processes):
      if index not in finished and process.poll() is not None:
        finished[index] = time.time() - started
    assert time.time() - started < 300
    time.sleep(0.2)
  outputs = [process.communicate() for process in processes]
  codes = [process.returncode for process in processes]
  assert sorted(code == 0 for code in codes) == [False, True], outputs
  winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
  assert finished[loser] < finished[winner]  # it stopped at once
  assert (f"is in use by another run (process {processes[winner].pid}"
          in outputs[loser][1]), outputs[loser][1][-2000:]
  with open(run / "run_config.json") as f:
    config = json.load(f)
  with open(run / "summary.json") as f:
    summary = json.load(f)
  assert config["learning_rate"] == (0.03 if winner == 0 else 0.001)
  assert summary["steps"] == 150
  assert summary["checkpoint"].endswith("ckpt-150")


def test_a_damaged_latest_checkpoint_is_named_and_nothing_changes(
    run_copy, data_flags):
  data_file = run_copy / "checkpoints" / "ckpt-3.data-00000-of-00001"
  size = data_file.stat().st_size
  with open(data_file, "r+b") as f:
    f.truncate(size // 2)
  before = _snapshot(run_copy)
  result = _train(run_copy, data_flags, "--train_steps=4")
  _failed(result, "ckpt-3", "ckpt-3.data-00000-of-00001", "cannot be restored",
          "The newest intact checkpoint is", "ckpt-2",
          "--resume_from=latest_intact")
  assert _snapshot(run_copy) == before

  result = _train(run_copy, data_flags, "--train_steps=4",
                  "--resume_from=latest_intact")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "resuming from the newest intact checkpoint" in result.stdout
  assert "at step 2." in result.stdout
  steps = [line.split()[1] for line in result.stdout.splitlines()
           if line.startswith("step ")]
  assert steps == ["3/4", "4/4"]


def test_resuming_with_another_learning_rate_is_refused(run_copy,
                                                        data_flags):
  before = _snapshot(run_copy)
  result = _train(run_copy, data_flags, "--train_steps=5",
                  "--learning_rate=0.001")
  _failed(result, "learning_rate: 0.03 -> 0.001")
  assert _snapshot(run_copy) == before
  # train_steps alone may change: it extends the run.
  result = _train(run_copy, data_flags, "--train_steps=4")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "at step 3." in result.stdout


@pytest.mark.parametrize("flags,fragments", [
    (["--num_heads=0"], ["num_heads must be a positive integer, got 0"]),
    (["--preset=nonsense"], ["Unknown --preset='nonsense'", "bert_tiny",
                             "t5_tiny"]),
    (["--train_files={bad}"], ["bad.txt:3: not UTF-8"]),
])
def test_a_failed_start_leaves_no_model_dir(tmp_path, data_flags, flags,
                                            fragments):
  run = tmp_path / "run"
  bad = data_flags[0].split("=", 1)[1].replace("train.txt", "bad.txt")
  result = _train(run, data_flags, "--train_steps=2",
                  *[flag.format(bad=bad) for flag in flags])
  _failed(result, *fragments)
  assert not run.exists()


def test_a_failed_start_in_an_existing_run_changes_nothing(run_copy,
                                                           data_flags):
  before = _snapshot(run_copy)
  result = _train(run_copy, data_flags, "--train_steps=5", "--d_model=32")
  _failed(result, "overrides")  # the run's model, named
  assert _snapshot(run_copy) == before


def test_rerunning_a_finished_run_says_where_its_results_are(run_copy,
                                                             data_flags):
  before = _snapshot(run_copy)
  result = _train(run_copy, data_flags, "--train_steps=3")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"Already finished: {run_copy} holds a run of 3 steps" in (
      result.stdout)
  assert "Already trained: 3 steps, nothing to do" in result.stdout
  assert f"Summary:      {run_copy}/summary.json" in result.stdout
  assert _snapshot(run_copy) == before


def test_a_killed_lock_holder_leaves_no_stale_lock(tmp_path, data_flags):
  run = tmp_path / "run"
  common = [*data_flags, "--train_steps=400", "--deterministic"]
  process = forkserver.Popen(cli.command("train", f"--model_dir={run}",
                                         *common),
                             env=_ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
  for line in process.stdout:
    if line.startswith("step      5/"):
      process.send_signal(signal.SIGKILL)
      break
  process.wait(timeout=60)
  assert process.returncode == -signal.SIGKILL
  assert (run / ".thattn.lock").exists()
  result = _train(run, common[:-2], "--train_steps=8", "--deterministic")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Resumed from" in result.stdout


def _file_size_limit(limit):
  """A preexec_fn: files of this process may not grow past `limit` bytes
  (the kernel refuses the write: EFBIG, as a full disk refuses: ENOSPC)."""
  import resource  # pylint: disable=g-import-not-at-top

  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
  return apply


def test_a_checkpoint_the_machine_refuses_stops_the_run_keeping_the_last(
    tmp_path, data_flags):
  """Issue 33: a checkpoint write that fails (here a file-size limit; a full
  disk fails the same write) stops the run with one line naming the folder
  and the cause, removes the unfinished checkpoint and keeps the last
  complete one, from which the rerun resumes."""
  run = tmp_path / "run"
  first = _train(run, data_flags, "--train_steps=2")
  assert first.returncode == 0, first.stderr[-3000:]
  checkpoints = run / "checkpoints"
  data = [p.stat().st_size for p in checkpoints.glob("ckpt-2.data-*")]
  # What a rerun writes besides checkpoints (the tokenizer is written
  # once, by the first run).
  others = [p.stat().st_size for p in run.rglob("*") if p.is_file() and
            not {"checkpoints", "tokenizer"} & set(p.parts)]
  assert max(others) < min(data), (others, data)
  limit = (max(others) + min(data)) // 2  # the checkpoint alone exceeds it
  refused = forkserver.run(
      cli.command("train", f"--model_dir={run}", *data_flags,
                  "--train_steps=4"), env=_ENV, capture_output=True, text=True,
      timeout=300, check=False, preexec_fn=_file_size_limit(limit))
  assert refused.returncode == 1, refused.stderr[-3000:]
  error = refused.stderr.strip().splitlines()[-1]
  assert error.startswith(
      f"thattn-train: error: could not write the checkpoint of step 3 into "
      f"{checkpoints}: a file would exceed the size limit"), error
  assert "the unfinished ckpt-3_temp was removed" in error
  assert (f"The last complete checkpoint, {checkpoints / 'ckpt-2'}, is kept"
          in error)
  assert "Traceback" not in refused.stderr
  assert sorted(p.name for p in checkpoints.iterdir()
                if "ckpt-3" in p.name) == []
  assert (checkpoints / "ckpt-2.index").exists()
  assert not (run / ".thattn.lock").exists() or _lock_is_free(run)
  resumed = _train(run, data_flags, "--train_steps=4")
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"Resumed from {checkpoints / 'ckpt-2'} at step 2." in resumed.stdout
  assert "step      3/4" in resumed.stdout, resumed.stdout
  assert (checkpoints / "ckpt-4.index").exists()


def _lock_is_free(run):
  """Whether another process could take the run's lock now."""
  import fcntl  # pylint: disable=g-import-not-at-top
  with open(run / ".thattn.lock", "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      return False
    fcntl.flock(f, fcntl.LOCK_UN)
  return True


def test_a_read_only_model_dir_is_named_not_a_traceback(tmp_path, data_flags):
  """Issue 33: a model_dir on a read-only file system (a real read-only
  bind mount) stops thattn-train with one line naming it."""
  source, model_dir = tmp_path / "source", tmp_path / "read_only"
  source.mkdir()
  model_dir.mkdir()
  mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(source),
                            str(model_dir)], capture_output=True, check=False)
  if mounted.returncode != 0:
    pytest.skip(f"a read-only bind mount needs root: {mounted.stderr!r}")
  try:
    result = _train(model_dir, data_flags, "--train_steps=1")
  finally:
    subprocess.run(["umount", str(model_dir)], check=True)
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"thattn-train: error: cannot write into the model_dir {model_dir} "
      f"({model_dir / '.thattn.lock'}): the file system is read-only. "
      "Choose a --model_dir this user can write, or free space.")
  assert "Traceback" not in result.stderr
  assert not list(source.iterdir())


def test_an_export_the_machine_refuses_leaves_its_target_as_it_was(
    trained, tmp_path):
  """Issue 33: an export that cannot be written (a file-size limit here; a
  full disk refuses the same write) ends in one line naming the target,
  which stays absent, with no staging folder left beside it."""
  export_dir = tmp_path / "export"
  refused = forkserver.run(
      cli.command("export", f"--model_dir={trained}",
                  f"--export_dir={export_dir}"), env=_ENV, capture_output=True,
      text=True, timeout=300, check=False,
      preexec_fn=_file_size_limit(20_000))
  assert refused.returncode == 1, refused.stderr[-3000:]
  error = refused.stderr.strip().splitlines()[-1]
  assert error.startswith(
      f"thattn-export: error: thattn-export could not write {export_dir}: a "
      "file would exceed the size limit"), error
  assert "Traceback" not in refused.stderr
  assert sorted(os.listdir(tmp_path)) == []
