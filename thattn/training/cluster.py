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


_EXPECTED = ('expected {"cluster": {"worker": ["host:port", ...]}, '
             '"task": {"type": "worker", "index": 0}}')


def task_spec():
  """(task type, task index, cluster dict) from TF_CONFIG; a lone chief.

  Raises:
    ValueError naming TF_CONFIG, the bad value and what was expected: not
    JSON, not an object, a job that is not a list of addresses, a task
    index that is not a non-negative integer, or a task not in its cluster.
  """
  text = os.environ.get("TF_CONFIG") or "{}"
  try:
    config = json.loads(text)
  except ValueError as error:
    raise ValueError(f"TF_CONFIG={text!r} is not valid JSON ({error}); "
                     f"{_EXPECTED}.") from None
  if not isinstance(config, dict):
    raise ValueError(f"TF_CONFIG={text!r} is not a JSON object; "
                     f"{_EXPECTED}.")
  spec = _cluster_of(config.get("cluster", {}))
  task = config.get("task", {})
  if not isinstance(task, dict):
    raise ValueError(f"TF_CONFIG's \"task\" is {task!r}, not an object; "
                     f"{_EXPECTED}.")
  task_type = task.get("type", "chief")
  index = _index_of(task.get("index", 0))
  addresses = spec.get(task_type, []) if isinstance(task_type, str) else []
  if spec and task_type != "evaluator" and index >= len(addresses):
    jobs = ", ".join(f"{job} 0-{len(tasks) - 1}" for job, tasks in spec.items()
                     if tasks)
    raise ValueError(
        f"TF_CONFIG's task {task_type} {index} is not in its cluster, "
        f"which has {jobs or 'no tasks'}; expected a task type and index of "
        "the cluster.")
  return task_type, index, spec


def _cluster_of(spec):
  """TF_CONFIG's "cluster", checked: {job name: [host:port, ...]}."""
  if not isinstance(spec, dict):
    raise ValueError(f"TF_CONFIG's \"cluster\" is {spec!r}, not an object; "
                     f"{_EXPECTED}.")
  for job, addresses in spec.items():
    if not (isinstance(addresses, list) and
            all(isinstance(address, str) for address in addresses)):
      raise ValueError(
          f"TF_CONFIG's cluster job {job!r} is {addresses!r}; expected a list "
          'of "host:port" strings, one per task.')
  return spec


def _index_of(index):
  """TF_CONFIG's task index, a non-negative integer ("1" is taken too)."""
  if isinstance(index, str) and index.isdigit():
    index = int(index)
  if isinstance(index, bool) or not isinstance(index, int) or index < 0:
    raise ValueError(f"TF_CONFIG's task \"index\" is {index!r}; expected a "
                     "non-negative integer, the task's place in its job's "
                     "list of addresses.")
  return index


def check_multi_worker():
  """Refuses a TF_CONFIG cluster that multi_worker_mirrored cannot run:
  jobs other than "chief" (at most one) and "worker", or no task at all."""
  _, _, spec = task_spec()
  others = sorted(set(spec) - {"chief", "worker"})
  if others or len(spec.get("chief", [])) > 1 or not (
      spec.get("chief") or spec.get("worker")):
    raise ValueError(
        f"TF_CONFIG's cluster {spec} has no chief or worker to train on, or "
        f"other jobs ({', '.join(others) or 'none'}) or several chiefs; "
        "--strategy=multi_worker_mirrored expects at most one \"chief\" and "
        'a list of "worker" addresses, nothing else.')


def num_tasks():
  """How many tasks TF_CONFIG's cluster names (1 without TF_CONFIG)."""
  _, _, spec = task_spec()
  return max(sum(len(addresses) for addresses in spec.values()), 1)


def _integer_variable(name, default, minimum):
  """An integer environment variable, named in the error if it is not one."""
  text = os.environ.get(name) or str(default)
  try:
    value = int(text)
  except ValueError:
    value = None
  if value is None or value < minimum:
    raise ValueError(f"{name}={text!r} is not an integer of at least "
                     f"{minimum}.")
  return value


def dtensor_clients():
  """(number of clients, this client's id) of a multi-client DTensor job,
  from DTENSOR_NUM_CLIENTS and DTENSOR_CLIENT_ID; (1, 0) without them.

  Raises:
    ValueError naming the variable: not an integer, an id out of range, or
    a DTENSOR_JOBS that does not list one address per client.
  """
  count = _integer_variable("DTENSOR_NUM_CLIENTS", 1, 1)
  client = _integer_variable("DTENSOR_CLIENT_ID", 0, 0)
  if count > 1:
    if client >= count:
      raise ValueError(f"DTENSOR_CLIENT_ID={client} is not one of the "
                       f"DTENSOR_NUM_CLIENTS={count} clients (0-{count - 1}).")
    jobs = os.environ.get("DTENSOR_JOBS")
    if jobs is not None and len(jobs.split(",")) != count:
      raise ValueError(
          f"DTENSOR_JOBS={jobs!r} lists {len(jobs.split(','))} addresses, but "
          f"DTENSOR_NUM_CLIENTS={count}; expected one host:port per client, "
          "comma-separated, in client order.")
  return count, client


def is_dtensor_client():
  """Whether this process is one client of a multi-client DTensor job."""
  return dtensor_clients()[0] > 1


def is_chief():
  if is_dtensor_client():  # DTensor's clients: client 0 leads
    return dtensor_clients()[1] == 0
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
  mine = dict(enumerate(spec.get(task_type, []))).get(index)
  pending = {address: address for address in tasks if address != mine}
  _wait_for(pending, mine, f"{task_type} {index}", timeout_seconds, log,
            f"{task_type} {index} of the TF_CONFIG cluster could not reach",
            "is every task started, and are the addresses and ports in "
            "TF_CONFIG right?")


def wait_for_dtensor_clients(timeout_seconds, log=print):
  """`wait_for_workers` for a multi-client DTensor job: returns once every
  other client of DTENSOR_JOBS accepts a connection, or raises ValueError
  naming the clients that did not within `timeout_seconds`. (DTensor's
  start-up waits forever for a client that never comes.) Without
  DTENSOR_JOBS there is nothing to wait for."""
  count, client = dtensor_clients()
  jobs = os.environ.get("DTENSOR_JOBS")
  if count < 2 or not jobs:
    return
  addresses = jobs.split(",")
  pending = {f"client {other} ({address})": address
             for other, address in enumerate(addresses) if other != client}
  _wait_for(pending, addresses[client], f"DTensor client {client}",
            timeout_seconds, log,
            f"DTensor client {client} of {count} could not reach",
            "is every client started (thattn-train with its own "
            "DTENSOR_CLIENT_ID), and are DTENSOR_JOBS' addresses right?")


def _wait_for(pending, mine, me, timeout_seconds, log, failure, hint):
  """Probes `pending` ({name: address}) while listening on `mine`."""
  if not pending:
    return
  listener = _listen(mine)
  deadline = time.time() + timeout_seconds
  log(f"{me}: waiting up to {timeout_seconds:g} s for "
      f"{', '.join(pending)}.")
  try:
    while pending and time.time() < deadline:
      _drain(listener)
      pending = {name: address for name, address in pending.items()
                 if not answers(address)}
      if pending:
        time.sleep(0.2)
  finally:
    listener.close()
  if pending:
    raise ValueError(f"{failure} {', '.join(pending)} within "
                     f"{timeout_seconds:g} s: {hint}")


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
    raise ValueError(f"This process's address {address} (TF_CONFIG or "
                     f"DTENSOR_JOBS) cannot be used: {error}.") from None
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
