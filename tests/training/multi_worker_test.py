"""thattn-train across real processes: MultiWorkerMirroredStrategy on loopback.

Each worker is `python -m thattn.bin.train` with its TF_CONFIG
(`local_cluster.LocalCluster`); the reference is the same command in one
process with the same global batch and seed.
"""

import json
import os

import numpy as np
import pytest

from tests import cli
from tests import forkserver
from tests.training import local_cluster

_TRAIN = cli.command("train")


def _env(tmp_path):
  # Workers' temporary folders go here, so the test sees them removed.
  (tmp_path / "tmp").mkdir(exist_ok=True)
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              TMPDIR=str(tmp_path / "tmp"))


@pytest.fixture(scope="module")
def flags(tiny_bert_flags):
  return tiny_bert_flags + ["--batch_size=6", "--deterministic",
                            "--checkpoint_every=1"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, flags):
  """The single-process run, 8 steps; the reference of every case."""
  model_dir = tmp_path_factory.mktemp("one_process") / "run"
  result = forkserver.run(_TRAIN + flags + [f"--model_dir={model_dir}",
                                            "--train_steps=8"],
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir


def _assert_equals_one_process(model_dir, one_process):
  """Every step's loss, the held-out result and the last checkpoint as in
  one process."""
  reference = local_cluster.train_losses(one_process)
  losses = local_cluster.train_losses(model_dir)
  assert sorted(losses) == list(range(1, 9))
  np.testing.assert_allclose([losses[s] for s in range(1, 9)],
                             [reference[s] for s in range(1, 9)], rtol=1e-5)
  np.testing.assert_allclose(
      local_cluster.summary(model_dir)["held_out_ln_ppl_after"],
      local_cluster.summary(one_process)["held_out_ln_ppl_after"], rtol=1e-5)
  assert sorted(os.listdir(model_dir / "checkpoints"))[-1] == (
      "ckpt-8.index")


def test_three_workers_equal_one_process(tmp_path, flags, one_process):
  """Two workers are compared in the killed-worker test below, whose
  restarted cluster must end where one process does."""
  model_dir = tmp_path / "run"
  argv = _TRAIN + flags + ["--strategy=multi_worker_mirrored",
                           f"--model_dir={model_dir}", "--train_steps=8"]
  with local_cluster.LocalCluster(argv, 3, env=_env(tmp_path)) as cluster:
    outputs = cluster.wait()
  for code, _, stderr in outputs:
    assert code == 0, stderr[-3000:]
  _assert_equals_one_process(model_dir, one_process)
  # The chief wrote the run; the others only to temporary folders, removed.
  assert os.listdir(tmp_path / "tmp") == []


def test_a_killed_worker_then_a_restart_loses_and_repeats_nothing(
    tmp_path, flags, one_process):
  model_dir = tmp_path / "run"
  argv = _TRAIN + flags + ["--strategy=multi_worker_mirrored",
                           f"--model_dir={model_dir}", "--train_steps=8"]
  configs = local_cluster.tf_configs(2)
  with local_cluster.LocalCluster(argv, 2, env=_env(tmp_path),
                                  configs=configs) as cluster:
    code, stderr = local_cluster.kill_at_step(cluster, 3)
  assert code != 0
  assert "the cluster lost a task" in stderr, stderr[-3000:]
  left_by_the_killed_worker = set(os.listdir(tmp_path / "tmp"))

  with local_cluster.LocalCluster(argv, 2, env=_env(tmp_path),
                                  configs=configs) as cluster:
    outputs = cluster.wait()
  for code, _, stderr in outputs:
    assert code == 0, stderr[-3000:]
  resumed, steps = local_cluster.resumed_steps(outputs[0][1])
  assert resumed >= 3
  assert steps == list(range(resumed + 1, 9))  # each step once
  # The two clusters' steps together: one process's, step for step.
  _assert_equals_one_process(model_dir, one_process)
  # Worker 1's temporary files of the finished run: gone.
  assert set(os.listdir(tmp_path / "tmp")) <= left_by_the_killed_worker


def test_an_unreachable_worker_fails_in_bounded_time(tmp_path, flags):
  model_dir = tmp_path / "run"
  config = local_cluster.tf_configs(2)[0]  # worker 1 is never started
  address = json.loads(config)["cluster"]["worker"][1]
  result = forkserver.run(
      _TRAIN + flags + ["--strategy=multi_worker_mirrored",
                        f"--model_dir={model_dir}", "--train_steps=2",
                        "--cluster_timeout=5"],
      env=dict(_env(tmp_path), TF_CONFIG=config), capture_output=True,
      text=True, timeout=120, check=False)
  assert result.returncode != 0
  assert f"could not reach {address} within 5 s" in result.stderr
  assert not model_dir.exists()
