"""`thattn-train --backend=keras3` across processes, on JAX's own runtime.

    thattn-train --backend=keras3 --mesh_shape=batch:2,model:2 \\
        --coordinator_address=host0:1234 --num_processes=2 --process_id=I

Every process runs the same command but for `--process_id` (on SLURM and
Cloud TPU, where JAX finds the three values itself, with none of them).
What JAX provides is used as it is: `jax.distributed.initialize` (process
0 runs the coordination service; every process sends it heartbeats), one
set of global devices that `--mesh_shape` spans (`keras3_mesh`), arrays
assembled from each process's rows (`keras3_steps.Steps.inputs`), Orbax
writing each process's shards (`thattn.io.orbax_checkpoints`), gloo's
collectives between CPU processes, and the preemption notifier that
turns a SIGTERM on any process into one agreed step
(`multihost_utils.reached_preemption_sync_point`). What this module adds:

- `joined(options, log)`: the join, bounded by `--cluster_timeout` (a
  process that cannot join within it ends with a message naming the
  coordinator; JAX's runtime would abort it later, with its own), with
  `--heartbeat_timeout`, on each process's share of the devices (on a CPU
  the host is split into `mesh size / processes` devices), before
  anything touches a device; a clean shutdown at the end;
- `check_same_run(settings, processes)`: every process's run settings
  gathered and compared before the first step, so that processes started
  with different flags are refused, naming the difference, instead of
  training different things into one checkpoint;
- `Preemption`: SIGTERM (a preemption) asks the run to save at the next
  step boundary and stop; across processes all of them stop at the same
  step;
- `LostProcess`: when a collective fails because a peer died, the
  processes still alive answer a roll call, and the error names the ones
  that did not (before JAX's runtime ends them at the heartbeat timeout).
"""

import contextlib
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time

# Where JAX finds the cluster without flags (jax._src.clusters): the
# environment variables that say so, and how many processes they name.
_DETECTED = (("SLURM", "SLURM_PROCID", "SLURM_NTASKS"),  # an srun step
             ("Cloud TPU", "TPU_WORKER_HOSTNAMES", None))
_JOIN_HINT = ("is every process started, with the same --coordinator_address "
              "and --num_processes and its own --process_id, and is process "
              "0's port free (a port is not reused across overlapping "
              "restarts)?")
# The coordination service's key-value folder of the lost-process roll
# call (`lost_process_error`).
_ROLL_CALL = "thattn_roll_call"
# What a failed collective or coordination call says when a process is
# gone (gloo's and NCCL's messages, gRPC's status).
_COMMUNICATION_WORDS = ("Gloo", "gloo", "NCCL", "Connection reset",
                        "Connection closed", "UNAVAILABLE", "heartbeat")


@dataclasses.dataclass(frozen=True)
class Processes:
  """This process's place in the run: its index (0 writes the run's
  files) and how many processes train it."""
  index: int
  count: int

  @property
  def chief(self):
    return self.index == 0

  def describe(self):
    return f"process {self.index} of {self.count}"


def detected_cluster(environ=None):
  """(name, processes or None) of a cluster JAX joins without flags, where
  the environment names one with several processes; else None."""
  environ = os.environ if environ is None else environ
  for name, marker, count_variable in _DETECTED:
    value = environ.get(marker)
    if not value:
      continue
    if count_variable is None:  # a list of hosts, one process each
      count = len(value.split(","))
    else:
      count = int(environ.get(count_variable) or 1)
    if count > 1:
      return name, count
  return None


def wanted(options):
  """Whether the run joins a JAX cluster: flags, or a detected cluster."""
  return (options.num_processes is not None or
          options.coordinator_address is not None or
          detected_cluster() is not None)


def _process_count(options):
  if options.num_processes is not None:
    return options.num_processes
  detected = detected_cluster()
  return detected[1] if detected else None


def _split_host(options):
  """On a CPU, the host split into this process's share of the mesh's
  devices (XLA's host platform flag; before JAX starts). Raises
  ValueError when the mesh does not split over the processes."""
  count = _process_count(options)
  mesh = options.mtf_mesh()
  if mesh is None or count is None:
    return
  size = mesh[0].size
  if size % count:
    raise ValueError(
        f"--mesh_shape={options.mesh_shape} ({size} devices) does not split "
        f"over --num_processes={count}: each process holds an equal share "
        f"of the mesh; pass a mesh of a multiple of {count} devices.")
  from thattn.training import keras3_mesh  # pylint: disable=g-import-not-at-top
  keras3_mesh.split_host(size // count)


@contextlib.contextmanager
def joined(options, log):
  """Joins the run's JAX cluster for the `with` block; yields its
  `Processes`, or None for a run of one process (nothing joined)."""
  if not wanted(options):
    yield None
    return
  _split_host(options)
  import jax  # pylint: disable=g-import-not-at-top
  # gloo: collectives between CPU processes (accelerators use their own).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  where = options.coordinator_address or "the address JAX detects"
  me = ("(detected)" if options.process_id is None else options.process_id,
        _process_count(options) or "(detected)")
  log(f"Joining the JAX cluster at {where} as process {me[0]} of {me[1]}; "
      f"waiting up to {options.cluster_timeout:g} s for the others.")
  _check_resolves(options.coordinator_address)
  # JAX's runtime ends a process that cannot join with a C++ abort, not an
  # exception; so thattn's own timer ends it first, with a message.
  watchdog = threading.Timer(options.cluster_timeout, _not_joined,
                             args=(where, me, options.cluster_timeout))
  watchdog.daemon = True
  watchdog.start()
  try:
    jax.distributed.initialize(
        options.coordinator_address, options.num_processes,
        options.process_id,
        initialization_timeout=int(options.cluster_timeout) + 60,
        heartbeat_timeout_seconds=options.heartbeat_timeout)
  except (RuntimeError, ValueError) as error:
    raise ValueError(
        f"Could not join the JAX cluster at {where} "
        f"({str(error).splitlines()[0]}): {_JOIN_HINT}") from None
  finally:
    watchdog.cancel()
  processes = Processes(jax.process_index(), jax.process_count())
  log(f"Joined as {processes.describe()}: {jax.local_device_count()} of "
      f"{jax.device_count()} devices here.")
  lost = None
  try:
    yield processes
  except Exception as error:  # pylint: disable=broad-except
    if _communication_failed(error):
      lost = lost_process_error(error, processes,
                                min(10.0, options.heartbeat_timeout / 3))
    if lost is None:
      raise
    raise lost from None
  finally:
    if lost is None:  # a shutdown would wait for the lost process
      jax.distributed.shutdown()


def _check_resolves(address):
  """Raises ValueError when the coordinator's host has no address (JAX's
  client would abort the process)."""
  if address is None:
    return
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"--coordinator_address={address!r} is not host:port "
                     "(process 0's host and a free port on it).")
  try:
    socket.getaddrinfo(host.strip("[]"), int(port))
  except OSError as error:
    raise ValueError(f"--coordinator_address={address}: the host "
                     f"{host!r} cannot be resolved ({error}); pass process "
                     "0's host name or address.") from None


def _not_joined(where, me, timeout):
  """The join's timer: the process ends, saying what it waited for (the
  main thread is inside JAX's runtime, which cannot be interrupted)."""
  sys.stdout.flush()
  sys.stderr.write(
      f"thattn-train: error: process {me[0]} of {me[1]} could not join the "
      f"JAX cluster at {where} within --cluster_timeout={timeout:g} s: "
      f"{_JOIN_HINT}\n")
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


def _gathered_texts(text, processes):
  """Every process's `text` (a str), in process order: a collective every
  process calls."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  encoded = text.encode()
  lengths = multihost_utils.process_allgather(
      np.array([len(encoded)], np.int32))
  width = max(int(np.max(lengths)), 1)
  padded = np.frombuffer(encoded.ljust(width, b" "), np.uint8)
  gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(
      processes.count, width)
  return [bytes(row).decode().rstrip(" ") for row in gathered]


def check_same_run(settings, processes):
  """Refuses processes started with different run settings.

  `settings`: a JSON-able dict of this process's (its run config and the
  flags every process must share). Every process gathers every process's
  and raises the same ValueError, naming each difference from process 0.
  """
  if processes is None or processes.count == 1:
    return
  everyone = [json.loads(text) for text in _gathered_texts(
      json.dumps(settings, sort_keys=True, default=str), processes)]
  differences = []
  for index, other in enumerate(everyone[1:], start=1):
    for key in sorted(set(everyone[0]) | set(other)):
      if everyone[0].get(key) != other.get(key):
        differences.append(f"process {index} has {key}={other.get(key)!r}, "
                           f"process 0 {key}={everyone[0].get(key)!r}")
  if differences:
    raise ValueError(
        "The processes were started with different settings (nothing was "
        f"trained): {'; '.join(differences)}. Start every process with the "
        "same flags, but for --process_id.")


def everywhere(check, processes):
  """Runs `check()`; across processes, a ValueError it raises on any
  process is raised on every one (the others would otherwise wait for it
  in the next collective until the heartbeat timeout)."""
  if processes is None or processes.count == 1:
    check()
    return
  try:
    check()
    message = ""
  except ValueError as error:
    message = str(error) or type(error).__name__
  refusals = [(index, text) for index, text in enumerate(
      _gathered_texts(message, processes)) if text]
  if refusals:
    index, text = refusals[0]
    raise ValueError(text if index == processes.index else
                     f"process {index} refused the run: {text}")


class Preemption:
  """Whether a SIGTERM asked the run to stop; see the module.

  In one process a signal handler notes it (restored by `close`); across
  processes JAX's own preemption notifier does, and every process learns
  it at the same step.
  """

  def __init__(self, processes):
    self.processes, self.signalled = processes, False
    self._previous = None
    if processes is None:
      try:
        self._previous = signal.signal(signal.SIGTERM, self._note)
      except ValueError:  # not the main thread: SIGTERM stops it as before
        self._previous = None

  def _note(self, signum, frame):
    del signum, frame
    self.signalled = True

  def reached(self, step):
    """Whether the run saves and stops after `step`; every process of a
    cluster calls it at every step."""
    if self.processes is None:
      return self.signalled
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return bool(multihost_utils.reached_preemption_sync_point(step))

  def close(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


class LostProcess(RuntimeError):
  """A process of the run stopped answering; the message names it."""


def _coordination_client():
  """The coordination service's client of this process. JAX exposes no
  public handle; Orbax reaches it the same way."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def _communication_failed(error):
  """Whether `error` is a collective or the coordination service failing
  to reach a process (gloo's or NCCL's words, or gRPC's)."""
  text = str(error)
  return any(word in text for word in _COMMUNICATION_WORDS)


def lost_process_error(error, processes, timeout):
  """A `LostProcess` naming the processes that do not answer a roll call
  after a collective failed with `error`, or None if every process
  answers (the failure was something else).

  Every process still alive sets its key in the coordination service and
  waits up to `timeout` seconds for the others' (they meet the same failed
  collective); a process whose key never comes is lost. Where process 0
  itself is lost the service went with it, and that is the answer.
  """
  cause = str(error).splitlines()[0][:200]
  try:
    client = _coordination_client()
    client.key_value_set(f"{_ROLL_CALL}/{processes.index}", "here")
    deadline, answered = time.time() + timeout, set()
    while time.time() < deadline:
      answered = {int(key.rsplit("/", 1)[-1])
                  for key, _ in client.key_value_dir_get(_ROLL_CALL)}
      if len(answered) == processes.count:
        return None
      time.sleep(0.2)
    lost = sorted(set(range(processes.count)) - answered)
  except Exception:  # pylint: disable=broad-except
    lost = [0]  # the coordination service is process 0's
  names = ", ".join(f"process {index}" for index in lost)
  return LostProcess(
      f"{processes.describe()} lost {names}, which stopped answering "
      f"({cause}). Restart every process with the same commands (on a "
      "fresh --coordinator_address port if the old one may still be held) "
      "to resume from the last checkpoint.")
