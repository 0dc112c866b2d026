"""Local clusters for tests: N processes of one TF_CONFIG cluster on loopback.

`LocalCluster(argv, num_workers)` starts `argv` once per worker, each with a
TF_CONFIG that names free localhost ports for every worker and its own
index, waits for them with a time limit, and kills them all on failure or
when the `with` block ends. Only 127.0.0.1 ports; every wait is bounded.
"""

import json
import os
import socket
import subprocess
import time


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


class LocalCluster:
  """Worker processes of one cluster; see the module."""

  def __init__(self, argv, num_workers, *, env=None, timeout=300,
               configs=None):
    self.timeout = timeout
    self.started = time.time()
    self.processes = [
        subprocess.Popen(argv, env=dict(env or os.environ, TF_CONFIG=config),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for config in (configs or tf_configs(num_workers))]

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
