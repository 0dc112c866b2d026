"""thattn-train --backend=mtf across real processes (thattn.mtf.cluster).

Two `python -m thattn.bin.train` processes on loopback ports, each with its
TF_CONFIG (`local_cluster.LocalCluster`), train a tiny talking-heads T5 on a
`model:2` mesh with the heads split over the mesh: the chief builds the
step graph and holds the masters, worker 1 holds one half of every sharded
variable. The reference is the same command in one process, on the same
mesh of two logical CPUs.
"""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from tests import forkserver
from tests.training import local_cluster
from thattn.mtf import cluster as mtf_cluster

_STEPS = 8
_MESH = ["--mesh_shape=model:2", "--layout_rules=heads:model;d_ff:model"]


def _env(tmp_path):
  # Temporary files of every process go here, so the test sees what is left.
  (tmp_path / "tmp").mkdir(exist_ok=True)
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
              TMPDIR=str(tmp_path / "tmp"))


def _command(model_dir, data_flags, *extra):
  flags = dict(task="span_corruption", preset="t5_tiny", batch_size=4,
               sequence_length=32, train_steps=_STEPS, warmup_steps=1,
               log_every=1, checkpoint_every=1, eval_every=0, eval_steps=2)
  return ([*cli.command("train"), "--backend=mtf",
           "--noexport", "--deterministic", f"--model_dir={model_dir}"] +
          data_flags + [f"--{name}={value}" for name, value in flags.items()]
          + _MESH + list(extra))


@pytest.fixture(scope="module")
def data_flags(tiny_bert_flags):
  return tiny_bert_flags[:2]  # a text file and its tokenizer


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, data_flags):
  """The one-process run on model:2 (two logical CPUs): the reference."""
  model_dir = tmp_path_factory.mktemp("one_process") / "run"
  result = forkserver.run(_command(model_dir, data_flags),
                          env=_env(model_dir.parent), capture_output=True,
                          text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "2 logical devices" in result.stdout
  return model_dir


def _cluster_run(model_dir, data_flags, tmp_path, configs=None):
  with local_cluster.LocalCluster(_command(model_dir, data_flags), 2,
                                  env=_env(tmp_path), configs=configs,
                                  timeout=300) as processes:
    return processes.wait()


def _steps(stdout):
  """The steps of a run's progress lines."""
  return [int(line.split()[1].split("/")[0])
          for line in stdout.splitlines() if line.startswith("step ")]


def _variables(model_dir):
  reader = tf.train.load_checkpoint(str(model_dir))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def test_a_killed_worker_then_a_restart_loses_and_repeats_nothing(
    tmp_path, data_flags, one_process):
  """Two processes on one model:2 mesh, worker 1 SIGKILLed after step 3,
  then both restarted: each step runs once, and the two runs together equal
  the one-process run on the same mesh, step for step and weight for
  weight."""
  model_dir = tmp_path / "run"
  configs = local_cluster.tf_configs(2)
  with local_cluster.LocalCluster(_command(model_dir, data_flags), 2,
                                  env=_env(tmp_path), configs=configs,
                                  timeout=300) as processes:
    chief, worker = processes.processes
    seen = []
    for line in chief.stdout:
      seen.append(line)
      if line.startswith(f"step      3/{_STEPS}"):
        worker.send_signal(signal.SIGKILL)
        break
    rest, stderr = chief.communicate(timeout=120)
  assert chief.returncode != 0
  assert "the cluster lost a task (worker 1 at localhost:" in stderr, (
      stderr[-3000:])
  killed_steps = _steps("".join(seen) + rest)
  left_by_the_killed_worker = set(os.listdir(tmp_path / "tmp"))

  (chief, worker) = _cluster_run(model_dir, data_flags, tmp_path, configs)
  for code, stdout, stderr in (chief, worker):
    assert code == 0, stdout[-2000:] + stderr[-3000:]
  assert "worker 0 of the TF_CONFIG cluster" in chief[1]
  assert "1 of the mesh's 2 devices" in worker[1]
  assert "worker 1 served the chief's run" in worker[1]
  # Heads and d_ff on `model`: most variables are split over the processes.
  plan = [line for line in chief[1].splitlines() if "mesh model:2, " in line]
  assert plan and int(plan[0].split("mesh model:2, ")[1].split()[0]) >= 20
  resumed = int(chief[1].split("Resumed from ")[1].split(" at step ")[1]
                .split(".")[0])
  assert resumed >= 3
  # Each step once: the killed run's steps were kept (each progress line
  # comes after its checkpoint), and the rerun starts after them.
  assert killed_steps == list(range(1, len(killed_steps) + 1))
  assert len(killed_steps) <= resumed
  assert _steps(chief[1]) == list(range(resumed + 1, _STEPS + 1))

  # The two runs' steps together: the one-process run's.
  reference = local_cluster.train_losses(one_process)
  losses = local_cluster.train_losses(model_dir)
  assert sorted(losses) == list(range(1, _STEPS + 1))
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [reference[s] for s in sorted(losses)],
                             rtol=1e-6)
  assert losses[_STEPS] < losses[1] - 0.5  # it trained
  # The model's outputs before (kept in the checkpoints) and after: the
  # held-out loss.
  mine, theirs = (local_cluster.summary(model_dir),
                  local_cluster.summary(one_process))
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    np.testing.assert_allclose(mine[key], theirs[key], rtol=1e-6)
  # The checkpoint, written by the chief alone: the same variables.
  trained, expected = _variables(model_dir), _variables(one_process)
  assert sorted(trained) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(trained[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)
  # Temporary files of the finished run: gone.
  assert set(os.listdir(tmp_path / "tmp")) <= left_by_the_killed_worker


def test_a_worker_whose_chief_dies_stops_naming_it(tmp_path, data_flags):
  configs = local_cluster.tf_configs(2)
  chief_address = json.loads(configs[0])["cluster"]["worker"][0]
  with local_cluster.LocalCluster(_command(tmp_path / "run", data_flags), 2,
                                  env=_env(tmp_path), configs=configs,
                                  timeout=120) as processes:
    chief, worker = processes.processes
    for line in chief.stdout:
      if line.startswith(f"step      1/{_STEPS}"):
        chief.send_signal(signal.SIGKILL)
        break
    _, stderr = worker.communicate(timeout=60)
  assert worker.returncode != 0
  assert f"the chief at {chief_address} stopped answering" in stderr, (
      stderr[-3000:])


def test_a_worker_without_its_chief_fails_in_bounded_time(tmp_path,
                                                          data_flags):
  config = local_cluster.tf_configs(2)[1]  # worker 0, the chief, never comes
  chief_address = json.loads(config)["cluster"]["worker"][0]
  result = forkserver.run(
      _command(tmp_path / "run", data_flags, "--cluster_timeout=3"),
      env=dict(_env(tmp_path), TF_CONFIG=config), capture_output=True,
      text=True, timeout=120, check=False)
  assert result.returncode != 0
  assert f"could not reach {chief_address} within 3 s" in result.stderr
  assert not (tmp_path / "run").exists()


def _with_tf_config(monkeypatch, cluster, task_type="worker", index=0):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": cluster, "task": {"type": task_type, "index": index}}))
  return mtf_cluster.from_tf_config()


def test_the_mesh_is_spread_task_major_with_the_chief_first(monkeypatch):
  processes = _with_tf_config(
      monkeypatch, {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "worker", 1)
  assert not processes.is_chief and processes.chief == ("chief", 0)
  assert processes.mesh_devices(6) == [
      f"/job:{job}/replica:0/task:{index}/device:CPU:{cpu}"
      for job, index in (("chief", 0), ("worker", 0), ("worker", 1))
      for cpu in (0, 1)]
  with pytest.raises(ValueError, match="multiple of 3.*got 4 positions"):
    processes.mesh_devices(4)


def test_clusters_mtf_cannot_run_on_are_refused(monkeypatch):
  assert _with_tf_config(monkeypatch, {"worker": ["a:1"]}) is None
  monkeypatch.delenv("TF_CONFIG")
  assert mtf_cluster.from_tf_config() is None
  with pytest.raises(ValueError, match=r"jobs \['ps'\]"):
    _with_tf_config(monkeypatch, {"worker": ["a:1"], "ps": ["b:1"]})
  with pytest.raises(ValueError, match="worker 2 is not in its cluster"):
    _with_tf_config(monkeypatch, {"worker": ["a:1", "b:1"]}, "worker", 2)
