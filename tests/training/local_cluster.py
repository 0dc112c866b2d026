"""Local clusters for tests: N processes of one job on loopback ports.

`LocalCluster(argv, num_workers)` starts `argv` once per worker, each with a
TF_CONFIG that names free localhost ports for every worker and its own
index (or, with `envs=dtensor_envs(n)`, DTensor's multi-client variables),
waits for them with a time limit, and kills them all on failure or when the
`with` block ends. Only 127.0.0.1 ports; every wait is bounded.
"""

import glob
import json
import os
import re
import signal
import socket
import subprocess
import time

import tensorflow as tf

from tests import forkserver


def free_ports(count):
  """`count` distinct ports free on 127.0.0.1 just now."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for sock in sockets:
      sock.bind(("127.0.0.1", 0))
    return [sock.getsockname()[1] for sock in sockets]
  finally:
    for sock in sockets:
      sock.close()


def tf_configs(num_workers, ports=None):
  """One TF_CONFIG string per worker of a localhost cluster."""
  ports = ports or free_ports(num_workers)
  cluster = {"worker": [f"localhost:{port}" for port in ports]}
  return [json.dumps({"cluster": cluster,
                      "task": {"type": "worker", "index": index}})
          for index in range(num_workers)]


def dtensor_envs(num_clients, ports=None):
  """DTensor's multi-client variables, one dict per client process."""
  ports = ports or free_ports(num_clients)
  jobs = ",".join(f"localhost:{port}" for port in ports)
  return [{"DTENSOR_CLIENT_ID": str(index),
           "DTENSOR_NUM_CLIENTS": str(num_clients),
           "DTENSOR_JOB_NAME": "worker", "DTENSOR_JOBS": jobs}
          for index in range(num_clients)]


class LocalCluster:
  """Worker processes of one cluster; see the module."""

  def __init__(self, argv, num_workers, *, env=None, timeout=300,
               configs=None, envs=None):
    """argv: the command, or a list of one command per process; envs:
    per-process variables; default: TF_CONFIG from `configs` (or fresh
    `tf_configs(num_workers)`)."""
    self.timeout = timeout
    self.started = time.time()
    envs = envs or [{"TF_CONFIG": config}
                    for config in (configs or tf_configs(num_workers))]
    argvs = argv if isinstance(argv[0], list) else [argv] * num_workers
    self.processes = [
        forkserver.Popen(command, env=dict(env or os.environ, **extra),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for command, extra in zip(argvs, envs)]

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.kill()

  def kill(self):
    for process in self.processes:
      if process.poll() is None:
        process.kill()
    for process in self.processes:
      process.wait(timeout=30)

  def wait(self):
    """[(returncode, stdout, stderr)] of every worker; kills all on timeout."""
    try:
      outputs = []
      for process in self.processes:
        left = max(self.timeout - (time.time() - self.started), 1)
        stdout, stderr = process.communicate(timeout=left)
        outputs.append((process.returncode, stdout, stderr))
      return outputs
    except subprocess.TimeoutExpired:
      self.kill()
      raise


def kill_at_step(cluster, step, victim=1, timeout=180,
                 signal_number=signal.SIGKILL):
  """SIGKILLs process `victim` (or sends it `signal_number`) once process
  0 logs training step `step`.

  Returns process 0's (return code, stderr) once it has stopped, at most
  `timeout` seconds later.
  """
  leader = cluster.processes[0]
  signal_at_step(leader, step, cluster.processes[victim], signal_number)
  _, stderr = leader.communicate(timeout=timeout)
  return leader.returncode, stderr


def signal_at_step(reader, step, target, signal_number):
  """Reads `reader`'s stdout until it logs training step `step`, then
  sends `target` `signal_number`; returns the lines read."""
  lines = []
  for line in reader.stdout:
    lines.append(line)
    if line.startswith(f"step {step:6d}/"):
      target.send_signal(signal_number)
      break
  return lines


def resumed_steps(stdout):
  """(the step a run's log says it resumed at, the steps it then logged)."""
  resumed = int(stdout.split(" at step ")[1].split(".")[0])
  steps = [int(line.split()[1].split("/")[0])
           for line in stdout.splitlines() if line.startswith("step ")]
  return resumed, steps


def train_losses(model_dir):
  """{step: training loss} from a run's TensorBoard summaries."""
  losses = {}
  for path in glob.glob(os.path.join(model_dir, "train", "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "loss":
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  return losses


def summary(model_dir):
  """A run's summary.json."""
  with open(os.path.join(model_dir, "summary.json")) as f:
    return json.load(f)


# A driver's line with its numbers taken out: its format.
_NUMBERS = re.compile(r"\d[\d,.]*(e[-+]\d+)?")


def line_formats(stdout):
  """The run driver's progress and result lines of a run's stdout, each
  with its numbers replaced by '#': what every backend prints alike."""
  return [" ".join(_NUMBERS.sub("#", line).split())
          for line in stdout.splitlines()
          if line.startswith(("step ", "Held-out "))]
