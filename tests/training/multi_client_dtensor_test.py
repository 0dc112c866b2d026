"""thattn-train --strategy=dtensor across processes: multi-client DTensor.

Two client processes with two logical CPU devices each form one
`batch:2,model:2` mesh (TensorFlow's DTENSOR_* variables, loopback ports);
the reference is one process with four logical devices. Every client
writes its shards of one checkpoint into the model_dir; the rest of the
run's files come from client 0 only. A client killed mid-run stops the
other within seconds, and a restart of both resumes from the last
checkpoint without losing or repeating a step.
"""

import os
import time

import numpy as np
import pytest

from tests import cli
from tests import forkserver
from tests.training import local_cluster

_TRAIN = cli.command("train")


@pytest.fixture(scope="module")
def flags(tiny_bert_flags):
  return tiny_bert_flags + ["--deterministic", "--checkpoint_every=2",
                            "--strategy=dtensor",
                            "--mesh_shape=batch:2,model:2", "--num_heads=4",
                            "--train_steps=8"]


def _env(tmp_path):
  # Client 1's temporary folder goes here, so the test sees it removed.
  (tmp_path / "tmp").mkdir(exist_ok=True)
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              TMPDIR=str(tmp_path / "tmp"))


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, flags):
  """The 4-device run in one process: the reference of every case."""
  model_dir = tmp_path_factory.mktemp("one_process") / "run"
  result = forkserver.run(_TRAIN + flags + [f"--model_dir={model_dir}"],
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return model_dir


def test_a_killed_client_then_a_restart_loses_and_repeats_nothing(
    tmp_path, flags, one_process):
  """Two clients on one mesh, client 1 SIGKILLed after step 3, then both
  restarted: each step runs once, and the two runs' steps together equal
  one process's on the same mesh, step for step."""
  model_dir = tmp_path / "run"
  argv = _TRAIN + flags + [f"--model_dir={model_dir}"]
  envs = local_cluster.dtensor_envs(2)
  with local_cluster.LocalCluster(argv, 2, env=_env(tmp_path),
                                  envs=envs) as cluster:
    code, stderr = local_cluster.kill_at_step(cluster, 3, timeout=120)
  assert code != 0
  assert "the cluster lost a task" in stderr, stderr[-3000:]
  assert "Restart every task with the same command" in stderr
  left_by_the_killed_client = set(os.listdir(tmp_path / "tmp"))

  with local_cluster.LocalCluster(argv, 2, env=_env(tmp_path),
                                  envs=envs) as cluster:
    outputs = cluster.wait()
  for code, stdout, stderr in outputs:
    assert code == 0, stderr[-3000:]
    assert "the mesh as 2 logical devices" in stdout  # each client's half
  resumed, steps = local_cluster.resumed_steps(outputs[0][1])
  assert resumed >= 2  # the checkpoint of step 2 (or later) was kept
  assert steps == list(range(resumed + 1, 9))  # each step once
  reference = local_cluster.train_losses(one_process)
  losses = local_cluster.train_losses(model_dir)
  assert sorted(losses) == list(range(1, 9))
  np.testing.assert_allclose([losses[s] for s in range(1, 9)],
                             [reference[s] for s in range(1, 9)], rtol=1e-5)
  np.testing.assert_allclose(
      local_cluster.summary(model_dir)["held_out_ln_ppl_after"],
      local_cluster.summary(one_process)["held_out_ln_ppl_after"], rtol=1e-5)
  shards = [name for name in os.listdir(model_dir / "checkpoints")
            if name.startswith("ckpt-8.data")]
  assert len(shards) >= 2  # written by both clients
  # Client 1's own files of the finished run: gone.
  assert set(os.listdir(tmp_path / "tmp")) <= left_by_the_killed_client


def test_a_client_whose_peer_never_comes_fails_in_bounded_time(tmp_path,
                                                               flags):
  """One client of two, with --cluster_timeout=3: it stops naming client 1,
  where DTensor's own start-up would wait without end."""
  env = dict(_env(tmp_path), **local_cluster.dtensor_envs(2)[0])
  model_dir = tmp_path / "run"
  started = time.time()
  result = forkserver.run(
      _TRAIN + flags + [f"--model_dir={model_dir}", "--cluster_timeout=3"],
      env=env, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode != 0
  jobs = env["DTENSOR_JOBS"].split(",")
  assert (f"DTensor client 0 of 2 could not reach client 1 ({jobs[1]}) "
          "within 3 s") in result.stderr, result.stderr[-3000:]
  assert time.time() - started < 60
  assert not model_dir.exists()
