"""Mesh TensorFlow across processes: one step graph over a TF_CONFIG cluster.

Mesh TensorFlow spans hosts in-graph, the TF1 way. Every process runs a
`tf.distribute.Server` of the cluster that `TF_CONFIG` names (TensorFlow's
convention, as for `--strategy=multi_worker_mirrored`); one client, the
chief, builds the whole step graph with the mesh's slices placed on the
devices of every task, `/job:worker/replica:0/task:N/device:CPU:k`, and runs
it in a `tf.compat.v1.Session` on its own server. The other tasks serve:
their servers run the parts of each step the chief sends them, until the
chief says the run is over.

    # the same command in each process, each with its own TF_CONFIG
    thattn-train --backend=mtf --task=span_corruption --preset=t5_tiny \\
        --mesh_shape=model:2 --layout_rules=heads:model

The mesh's S positions are spread evenly over the T tasks, task-major: task
t brings S/T CPU devices, positions t*S/T to (t+1)*S/T - 1 (with
heads:model on model:2, one half of the heads in each process). The chief
keeps the master variables, the Saver, the feeds and every file of the run
on its own task, so a run over T processes writes what a one-process run
on the same mesh writes, and either can resume the other.

Ending and failures, bounded in time:
- Before its server starts, every task waits for the others to answer
  (`thattn.training.cluster.wait_for_workers`, at most --cluster_timeout).
- When training ends (or fails), the chief puts a token in a queue on each
  serving task (a `FIFOQueue` with a shared name: how TF1 jobs end servers
  that would otherwise `join()` forever), and the serving task returns.
- A serving task whose chief stops answering (killed, or gone on an error)
  stops with `tf.errors.UnavailableError` naming the chief's address.
- A serving task lost mid-run fails the chief's next step with
  `tf.errors.UnavailableError` (within about 30 s: gRPC retries first).
The binary reports both as a lost task; restarting every task with the
same command resumes from the chief's last checkpoint.
"""

import dataclasses
import os

import tensorflow as tf

from thattn.training import cluster as cluster_lib

_v1 = tf.compat.v1
# The queue a serving task waits on for the end of the run.
_RUN_OVER_QUEUE = "thattn_mtf_run_over"
# A serving task polls its queue this often, and between polls asks
# whether the chief still answers; so many missed answers in a row end it
# (a restarting chief's port is briefly closed between its probe and its
# server).
_POLL_SECONDS = 2.0
_MISSED_ANSWERS = 3
# The jobs of TF_CONFIG that take part, in mesh order.
_JOBS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The TF_CONFIG cluster of a multi-process mtf run, seen by one task."""
  spec: dict  # job name -> [host:port], TF_CONFIG's "cluster"
  task_type: str  # this process's job
  index: int  # and its index there

  @property
  def tasks(self):
    """[(job, index)] of every task, the chief first: the mesh's order."""
    return [(job, index) for job in _JOBS
            for index in range(len(self.spec.get(job, [])))]

  @property
  def chief(self):
    return self.tasks[0]

  @property
  def is_chief(self):
    return (self.task_type, self.index) == self.chief

  def address(self, task):
    job, index = task
    return self.spec[job][index]

  def name(self, task=None):
    job, index = task or (self.task_type, self.index)
    return f"{job} {index}"

  @staticmethod
  def device(task, cpu=0):
    job, index = task
    return f"/job:{job}/replica:0/task:{index}/device:CPU:{cpu}"

  def devices_per_task(self, mesh_size):
    """S / T, the CPU devices each task brings to a mesh of S positions.

    Raises:
      ValueError: when the tasks do not divide the mesh evenly.
    """
    tasks = len(self.tasks)
    if mesh_size % tasks:
      raise ValueError(
          f"--backend=mtf over the {tasks} tasks of TF_CONFIG needs a "
          f"--mesh_shape whose size is a multiple of {tasks} (each task "
          f"brings the same number of devices); got {mesh_size} positions.")
    return mesh_size // tasks

  def mesh_devices(self, mesh_size):
    """The device of each mesh position, task-major (see the module)."""
    per_task = self.devices_per_task(mesh_size)
    return [self.device(task, cpu) for task in self.tasks
            for cpu in range(per_task)]


def from_tf_config():
  """The `Cluster` TF_CONFIG names, or None for fewer than two tasks.

  Raises:
    ValueError: for jobs other than "chief" and "worker" (an mtf run has
      no parameter servers or evaluators), or a task not in the cluster.
  """
  task_type, index, spec = cluster_lib.task_spec()
  if sum(len(addresses) for addresses in spec.values()) < 2:
    return None
  others = sorted(set(spec) - set(_JOBS))
  if others:
    raise ValueError(
        f"TF_CONFIG names jobs {others}; --backend=mtf runs on the tasks of "
        f"the jobs {list(_JOBS)} only (the chief builds the graph, every "
        "task holds devices of the mesh).")
  if index >= len(spec.get(task_type, [])):
    raise ValueError(f"TF_CONFIG's task {task_type} {index} is not in its "
                     f"cluster {spec}.")
  return Cluster(spec=spec, task_type=task_type, index=index)


def start_server(cluster, mesh_size, timeout_seconds, log=print):
  """This task's `tf.distribute.Server`, with its S/T CPU devices.

  Waits first (at most `timeout_seconds`) for every other task to answer,
  so that a task that never comes is named instead of waited for.
  """
  per_task = cluster.devices_per_task(mesh_size)
  cluster_lib.wait_for_workers(timeout_seconds, log=log)
  # A call to a task that died fails at once, instead of waiting for the
  # task to come back (a step would otherwise hang forever on the dead
  # task's tensors). TensorFlow reads this when its first call is made.
  os.environ.setdefault("GRPC_FAIL_FAST", "true")
  server = tf.distribute.Server(
      tf.train.ClusterSpec(cluster.spec), job_name=cluster.task_type,
      task_index=cluster.index,
      config=_v1.ConfigProto(device_count={"CPU": per_task}))
  mine = (cluster.task_type, cluster.index)
  log(f"{cluster.name()} of the TF_CONFIG cluster ({cluster.address(mine)}):"
      f" {per_task} of the mesh's {mesh_size} devices.")
  return server


def lost_tasks(cluster, error):
  """`error` (a step's UnavailableError) restated with the tasks that no
  longer answer, for the chief to stop with."""
  lost = [f"{cluster.name(task)} at {cluster.address(task)}"
          for task in cluster.tasks[1:]
          if not cluster_lib.answers(cluster.address(task))]
  if lost:
    return tf.errors.UnavailableError(
        None, None, f"{' and '.join(lost)} stopped answering")
  return error


def _run_over_queue(task):
  with tf.device(Cluster.device(task)):
    return tf.queue.FIFOQueue(1, tf.int32, shared_name=_RUN_OVER_QUEUE)


def serve(cluster, server, log=print):
  """Serves the chief's steps until it ends the run (a serving task).

  Raises:
    ValueError: when the chief ended the run on an error (its own output
      says which).
    tf.errors.UnavailableError: when the chief stops answering first.
  """
  graph = tf.Graph()
  with graph.as_default():
    wait = _run_over_queue((cluster.task_type, cluster.index)).dequeue()
  chief = cluster.address(cluster.chief)
  log(f"{cluster.name()}: serving the chief at {chief} until it ends the "
      "run.")
  missed = 0
  # Filtered to this task's devices: the session calls no other task (the
  # chief may still be starting; with GRPC_FAIL_FAST a call would fail).
  own = _v1.ConfigProto(device_filters=[
      f"/job:{cluster.task_type}/task:{cluster.index}"])
  with _v1.Session(server.target, graph=graph, config=own) as session:
    while True:
      try:
        finished = session.run(wait, options=_v1.RunOptions(
            timeout_in_ms=int(_POLL_SECONDS * 1000)))
      except tf.errors.DeadlineExceededError:
        missed = 0 if cluster_lib.answers(chief) else missed + 1
        if missed < _MISSED_ANSWERS:
          continue
        raise tf.errors.UnavailableError(
            None, None, f"the chief at {chief} stopped answering "
            f"({cluster.name()} served it)") from None
      if not finished:
        raise ValueError(f"the chief at {chief} stopped on an error (its "
                         f"output says which); {cluster.name()} served it.")
      log(f"{cluster.name()}: the chief ended the run.")
      return


def end_run(cluster, server, finished, log=print):
  """The chief: tells every serving task that the run is over, and whether
  it `finished` (or stopped on an error).

  A task that is already gone is only reported: it has nothing to lose.
  """
  graph = tf.Graph()
  with graph.as_default():
    tokens = {task: _run_over_queue(task).enqueue(int(finished))
              for task in cluster.tasks[1:]}
  with _v1.Session(server.target, graph=graph) as session:
    for task, token in tokens.items():
      try:
        session.run(token, options=_v1.RunOptions(timeout_in_ms=30000))
      except tf.errors.OpError as error:
        log(f"{cluster.name(task)} at {cluster.address(task)} could not be "
            f"told that the run is over ({type(error).__name__}); it "
            "stops by itself once this chief is gone.")

