"""thattn-train --backend=keras3 across JAX processes, on localhost.

Every run is real: `thattn-train` processes joined by
`jax.distributed.initialize` over a free localhost port, JAX's gloo
collectives between them, each process holding 2 of the 4 devices of a
batch:2,model:2 mesh (the heads, d_ff and vocabulary split over `model`
within a process, the batch over the processes). Against one process
holding all 4 devices: the same steps (held-out losses within 1e-4); a
SIGKILLed process named by the one left, and the rerun ending on the
uninterrupted run's weights; the two-process checkpoint resumed in one
process without a mesh, until a SIGTERM saves it; SIGTERM on one of two
processes saving both at one agreed step; processes started with
different flags refused.
"""

import os
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from tests import forkserver
from tests.keras3 import processes
from tests.training import local_cluster
from thattn.io import checkpoint_reading

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

_ENV = processes.train_environment("TF_CONFIG")
_STEPS = 8
_MESH = "--mesh_shape=batch:2,model:2"


def _command(model_dir, flags, *extra):
  return ([*cli.command("train"), "--backend=keras3",
           f"--model_dir={model_dir}", "--deterministic",
           f"--train_steps={_STEPS}", "--checkpoint_every=3", _MESH] +
          list(flags) + list(extra))


def _cluster(model_dir, flags, *extra, per_process=((), ())):
  """Two processes of one run on a fresh coordinator port; `per_process`:
  each process's own extra flags."""
  port = local_cluster.free_ports(1)[0]
  commands = [_command(model_dir, flags, *extra, *own,
                       f"--coordinator_address=localhost:{port}",
                       "--num_processes=2", f"--process_id={index}",
                       "--heartbeat_timeout=6", "--cluster_timeout=120")
              for index, own in enumerate(per_process)]
  return local_cluster.LocalCluster(commands, 2, env=_ENV, envs=[{}, {}],
                                    timeout=400)


def _ran(outputs):
  for code, stdout, stderr in outputs:
    assert code == 0, stdout[-2000:] + stderr[-3000:]
  return [stdout for _, stdout, _ in outputs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_flags):
  """The same job by 2 processes x 2 devices (exported by process 0) and
  by 1 process x 4 devices: {"two": (model_dir, [stdout, stdout]),
  "one": (model_dir, stdout)}."""
  root = tmp_path_factory.mktemp("keras3_processes")
  with _cluster(root / "two", tiny_bert_flags, "--export") as cluster:
    two = _ran(cluster.wait())
  one = cli.run_ok(_command(root / "one", tiny_bert_flags), _ENV)
  return {"two": (root / "two", two), "one": (root / "one", one)}


def _weights(model_dir, step=_STEPS):
  return checkpoint_reading.read_step(
      str(model_dir / "checkpoints" / str(step)))


def test_two_processes_train_what_one_process_trains(runs):
  two_dir, stdouts = runs["two"]
  one_dir, _ = runs["one"]
  for index, stdout in enumerate(stdouts):
    assert f"Joined as process {index} of 2: 2 of 4 devices here." in stdout
    assert (f"mesh batch:2,model:2 on 4 JAX devices (process {index} of 2), "
            "15 of 30 weights sharded") in stdout  # heads, d_ff, vocab
  one, two = (local_cluster.summary(str(d)) for d in (one_dir, two_dir))
  for key in ("held_out_ln_ppl_before", "held_out_ln_ppl_after"):
    np.testing.assert_allclose(two[key], one[key], atol=1e-4)
  assert two["held_out_ln_ppl_after"] < two["held_out_ln_ppl_before"] - 0.005
  losses = local_cluster.train_losses(str(two_dir))
  reference = local_cluster.train_losses(str(one_dir))
  assert sorted(losses) == sorted(reference) == list(range(1, _STEPS + 1))
  np.testing.assert_allclose([losses[s] for s in sorted(losses)],
                             [reference[s] for s in sorted(losses)],
                             atol=1e-4)
  saved, reference = _weights(two_dir), _weights(one_dir)
  assert sorted(saved) == sorted(reference)
  for key, value in reference.items():
    np.testing.assert_allclose(saved[key], value, atol=1e-5, err_msg=key)


def test_process_0_alone_writes_the_run_and_its_export(runs):
  two_dir, stdouts = runs["two"]
  assert sorted(os.listdir(two_dir / "checkpoints")) == ["3", "6", "8"]
  for name in ("run_config.json", "summary.json", "tokenizer", "train",
               "eval"):
    assert (two_dir / name).exists(), name
  assert "SavedModel:" in stdouts[0] and "SavedModel:" not in stdouts[1]
  served = tf.saved_model.load(str(two_dir / "export"))
  outputs = served.signatures["serving_default"](
      text=tf.constant(["talking heads attention"]))
  assert all(np.all(np.isfinite(value.numpy()))
             for value in outputs.values() if value.dtype.is_floating)


def test_a_two_process_checkpoint_resumes_in_one_process_until_sigterm(
    runs, tmp_path, tiny_bert_flags):
  """Process 0's model_dir, copied, resumed by one process on one device
  (every saved value finds its variable; the step-0 loss is kept), and
  stopped by SIGTERM: saved at the step boundary, exit status 143."""
  two_dir, _ = runs["two"]
  copy = tmp_path / "copy"
  shutil.copytree(two_dir, copy)  # the two-process run stays as it was
  command = [arg for arg in _command(copy, tiny_bert_flags,
                                     "--train_steps=400")
             if arg != _MESH]
  process = forkserver.Popen(command, env=_ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  try:
    lines = local_cluster.signal_at_step(process, _STEPS + 2, process,
                                         signal.SIGTERM)
    lines += process.stdout.readlines()
    assert process.wait(timeout=120) == 128 + signal.SIGTERM, "".join(lines)
  finally:
    process.kill()
  stdout = "".join(lines)
  assert f"Resumed from {copy}/checkpoints/{_STEPS} at step {_STEPS}." in (
      stdout)
  assert "; 1 device(s)." in stdout
  before = local_cluster.summary(str(two_dir))["held_out_ln_ppl_before"]
  assert f"Held-out ln_ppl before training: {before:.4f}" in stdout
  step = int(lines[-1].split("after step ")[1].split()[0])
  assert lines[-1].strip() == (
      f"thattn-train: Stopped by SIGTERM (a preemption) after step {step} "
      f"of 400, saved in {copy}/checkpoints/{step}; rerun the same command "
      "to resume from it.")
  assert step >= _STEPS + 2 and str(step) in os.listdir(copy / "checkpoints")
  assert sorted(local_cluster.train_losses(str(copy))) == list(
      range(1, step + 1))


def test_a_killed_process_is_named_and_the_rerun_ends_on_the_same_weights(
    runs, tmp_path, tiny_bert_flags):
  model_dir = tmp_path / "run"
  with _cluster(model_dir, tiny_bert_flags) as cluster:
    code, stderr = local_cluster.kill_at_step(cluster, 4, timeout=120)
  assert code == 1, stderr[-3000:]
  assert "process 0 of 2 lost process 1, which stopped answering" in stderr
  assert "Restart every process with the same commands" in stderr
  with _cluster(model_dir, tiny_bert_flags) as cluster:
    stdouts = _ran(cluster.wait())
  resumed, steps = local_cluster.resumed_steps(stdouts[0])
  assert resumed in (3, 6) and steps == list(range(resumed + 1, _STEPS + 1))
  want = _weights(runs["two"][0])
  for key, value in _weights(model_dir).items():
    np.testing.assert_array_equal(value, want[key], err_msg=key)


def test_sigterm_on_one_process_saves_every_process_at_one_step(
    tmp_path, tiny_bert_flags):
  model_dir = tmp_path / "run"
  with _cluster(model_dir, tiny_bert_flags, "--train_steps=400") as cluster:
    leader, other = cluster.processes
    local_cluster.signal_at_step(leader, 3, other, signal.SIGTERM)
    outputs = [(process.wait(timeout=120), process.stdout.read())
               for process in cluster.processes]
  lines = []
  for code, stdout in outputs:
    assert code == 128 + signal.SIGTERM, stdout[-2000:]
    lines.append(stdout.strip().splitlines()[-1])
  assert lines[0] == lines[1]  # both stopped after the same step
  step = int(lines[1].split("after step ")[1].split()[0])
  assert lines[1] == (
      f"thattn-train: Stopped by SIGTERM (a preemption) after step {step} "
      f"of 400, saved in {model_dir}/checkpoints/{step}; rerun the same "
      "command to resume from it.")
  assert str(step) in os.listdir(model_dir / "checkpoints")


def test_processes_started_with_different_flags_are_refused(
    tmp_path, tiny_bert_flags):
  model_dir = tmp_path / "run"
  with _cluster(model_dir, tiny_bert_flags,
                per_process=((), ("--seed=3",))) as cluster:
    outputs = cluster.wait()
  for code, _, stderr in outputs:
    assert code == 1
    assert ("The processes were started with different settings (nothing "
            "was trained): process 1 has seed=3, process 0 seed=0.") in stderr
  assert not model_dir.exists()  # the start guard left nothing


def test_a_batch_the_processes_cannot_split_is_refused(tmp_path,
                                                       tiny_bert_flags):
  model_dir = tmp_path / "run"
  with _cluster(model_dir, tiny_bert_flags, "--batch_size=3") as cluster:
    outputs = cluster.wait()
  for code, _, stderr in outputs:
    assert code == 1, stderr[-3000:]
    assert ("--batch_size=3 does not split over the mesh's 2 batch shards "
            "(its 'batch' axis, --mesh_shape=batch:2,model:2, over 2 "
            "processes); pass a multiple of 2.") in stderr
  assert not model_dir.exists()


def test_a_process_alone_stops_at_the_cluster_timeout_naming_it(
    tmp_path, tiny_bert_flags):
  """Process 1 of 2 with no process 0: it stops in bounded time with
  thattn's message (JAX's runtime would abort it, later), and an
  unresolvable coordinator host is refused at once."""
  port = local_cluster.free_ports(1)[0]
  command = _command(tmp_path / "run", tiny_bert_flags,
                     f"--coordinator_address=localhost:{port}",
                     "--num_processes=2", "--process_id=1",
                     "--cluster_timeout=3")
  result = forkserver.run(command, env=_ENV, capture_output=True, text=True,
                          timeout=120, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  assert ("thattn-train: error: process 1 of 2 could not join the JAX "
          f"cluster at localhost:{port} within --cluster_timeout=3 s: is "
          "every process started") in result.stderr
  command = [arg.replace(f"localhost:{port}", "no-such-host.invalid:8476")
             for arg in command]
  result = forkserver.run(command, env=_ENV, capture_output=True, text=True,
                          timeout=120, check=False)
  assert result.returncode == 1, result.stderr[-3000:]
  assert ("--coordinator_address=no-such-host.invalid:8476: the host "
          "'no-such-host.invalid' cannot be resolved") in result.stderr


@pytest.mark.parametrize("options, message", [
    (dict(backend="keras", num_processes=2, process_id=0),
     r"--num_processes=2 --process_id=0: JAX's cluster flags apply with "
     r"--backend=keras3"),
    (dict(coordinator_address="host0:1234", num_processes=2),
     "--coordinator_address=host0:1234 needs --process_id too"),
    (dict(num_processes=2, process_id=2),
     r"--process_id=2 is not one of the --num_processes=2 processes \(0-1\)"),
    (dict(num_processes=0), "num_processes must be a positive integer"),
    (dict(heartbeat_timeout=0), "heartbeat_timeout must be a positive"),
])
def test_cluster_flags_that_cannot_join_are_refused(options, message):
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  options = dict(dict(backend="keras3"), **options)
  with pytest.raises(ValueError, match=message):
    options_lib.TrainOptions(**options)


def test_the_clusters_jax_detects_are_named_from_the_environment():
  from thattn.training import jax_processes  # pylint: disable=g-import-not-at-top
  assert jax_processes.detected_cluster({}) is None
  assert jax_processes.detected_cluster(
      {"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}) == ("SLURM", 4)
  assert jax_processes.detected_cluster(
      {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # one process
  assert jax_processes.detected_cluster(
      {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}) is None  # not in srun
  assert jax_processes.detected_cluster(
      {"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}) == ("Cloud TPU", 4)
