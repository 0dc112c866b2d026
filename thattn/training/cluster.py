"""Who writes what when several processes train one model (`TF_CONFIG`).

Under `--strategy=multi_worker_mirrored` every worker runs the same
`thattn-train`, with `TF_CONFIG` saying which task of the cluster it is
(TensorFlow's convention):

    {"cluster": {"worker": ["host0:port", "host1:port"]},
     "task": {"type": "worker", "index": 0}}

The chief (the task of type "chief", or worker 0 in a cluster without one)
owns the model_dir: it holds its lock and writes its checkpoints,
summaries, `summary.json`, run config and export. Every other worker must
still save with the others (saving runs collective ops), so it writes the
same files to a temporary folder of its own, which is removed when it
finishes or fails, and reads the chief's checkpoints to resume. Without
`TF_CONFIG` the process is a chief of one.
"""

import contextlib
import json
import os
import shutil
import socket
import tempfile
import time


def task_spec():
  """(task type, task index, cluster dict) from TF_CONFIG; a lone chief."""
  config = json.loads(os.environ.get("TF_CONFIG") or "{}")
  task = config.get("task", {})
  return (task.get("type", "chief"), int(task.get("index", 0)),
          config.get("cluster", {}))


def num_tasks():
  """How many tasks TF_CONFIG's cluster names (1 without TF_CONFIG)."""
  _, _, spec = task_spec()
  return max(sum(len(addresses) for addresses in spec.values()), 1)


def is_dtensor_client():
  """Whether this process is one client of a multi-client DTensor job."""
  return int(os.environ.get("DTENSOR_NUM_CLIENTS") or 1) > 1


def is_chief():
  if is_dtensor_client():  # DTensor's clients: client 0 leads
    return int(os.environ.get("DTENSOR_CLIENT_ID") or 0) == 0
  task_type, index, cluster = task_spec()
  if "chief" in cluster:
    return task_type == "chief"
  return task_type in ("chief", "worker") and index == 0


@contextlib.contextmanager
def write_dir(model_dir):
  """The folder this process writes the run's files to; see the module."""
  if is_chief():
    yield model_dir
    return
  task_type, index, _ = task_spec()
  folder = tempfile.mkdtemp(prefix=f"thattn-{task_type}{index}-")
  try:
    yield folder
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def wait_for_workers(timeout_seconds, log=print):
  """Returns once every other task of the cluster accepts a connection.

  TensorFlow's collectives wait forever for a task that never comes (a
  wrong port in TF_CONFIG, a worker that was not started), holding the
  interpreter, so nothing can time them out from Python. So before the
  strategy is made, each task listens on its own TF_CONFIG port and
  connects to every other task's, until all answer or `timeout_seconds`
  pass. (Then the listener closes and TensorFlow's server takes the port;
  a peer still probing meets that server instead.)

  Raises:
    ValueError: naming the addresses that did not answer in time, or this
      task's own address if its port is taken.
  """
  task_type, index, spec = task_spec()
  tasks = [address for kind in sorted(spec) for address in spec[kind]]
  mine = spec.get(task_type, [None] * (index + 1))[index]
  pending = [address for address in tasks if address != mine]
  if not pending:
    return
  listener = _listen(mine)
  deadline = time.time() + timeout_seconds
  log(f"{task_type} {index}: waiting up to {timeout_seconds:g} s for "
      f"{', '.join(pending)}.")
  try:
    while pending and time.time() < deadline:
      _drain(listener)
      pending = [address for address in pending if not answers(address)]
      if pending:
        time.sleep(0.2)
  finally:
    listener.close()
  if pending:
    raise ValueError(
        f"{task_type} {index} of the TF_CONFIG cluster could not reach "
        f"{', '.join(pending)} within {timeout_seconds:g} s: is every task "
        "started, and are the addresses and ports in TF_CONFIG right?")


def _split(address):
  host, port = address.rsplit(":", 1)
  return host.strip("[]"), int(port)


def _listen(address):
  host, port = _split(address)
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    listener.bind(("", port))
  except OSError as error:
    listener.close()
    raise ValueError(f"This task's address {address} (TF_CONFIG) cannot be "
                     f"used: {error}.") from None
  listener.listen(16)
  listener.setblocking(False)
  del host  # any interface: the cluster names this host as it likes
  return listener


def _drain(listener):
  """Accepts and closes pending connections (peers probing this task)."""
  while True:
    try:
      connection, _ = listener.accept()
    except (BlockingIOError, OSError):
      return
    connection.close()


def answers(address):
  """Whether something accepts a TCP connection at host:port (1 s)."""
  try:
    with socket.create_connection(_split(address), timeout=1.0):
      return True
  except OSError:
    return False
