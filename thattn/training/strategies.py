"""Distribution strategies by name, for `thattn-train --strategy`.

| name                   | strategy                                         |
|------------------------|--------------------------------------------------|
| default                | no distribution: the current device              |
| mirrored               | MirroredStrategy over the local devices          |
| multi_worker_mirrored  | MultiWorkerMirroredStrategy; workers from TF_CONFIG |
| tpu                    | TPUStrategy on the TPU that `tpu` names           |
| dtensor                | not a Strategy: see below                        |

The trainer's loop is the same for the four strategies: it distributes the
dataset and runs each step with `strategy.run`.

"dtensor" shards the weights themselves over a mesh (`--mesh_shape`,
`--layout_rules`). TensorFlow 2.21's DTensor-backed strategies are private
(`tensorflow.python.distribute.experimental`) and only mirror the weights,
and a DTensor program is global (one logical batch, no replicas, no
`strategy.run`), so the trainer runs it through
`thattn.training.dtensor` rather than pretending it is a Strategy.
"""

import tensorflow as tf

from thattn.training import cluster

DTENSOR = "dtensor"
STRATEGIES = ("default", "mirrored", "tpu", "multi_worker_mirrored", DTENSOR)


def make_strategy(name, tpu=None, cluster_timeout=300, log=print):
  """The `tf.distribute.Strategy` called `name`; see the module's table.

  tpu: the TPU's name or grpc:// address (for "tpu"); None or "" means the
  local TPU or the one a Cloud TPU VM's environment names.
  cluster_timeout: seconds a multi_worker_mirrored task waits for the other
  tasks of its TF_CONFIG cluster (`cluster.wait_for_workers`).
  """
  if name not in STRATEGIES:
    raise ValueError(f"Unknown strategy {name!r}; expected one of "
                     f"{STRATEGIES}.")
  if name == DTENSOR:
    raise ValueError("DTensor is not a tf.distribute.Strategy; train with "
                     "thattn.training.dtensor.DTensorDevices (the "
                     "trainer does this for --strategy=dtensor).")
  if tpu and name != "tpu":
    raise ValueError(f"--tpu={tpu!r} needs --strategy=tpu, got "
                     f"--strategy={name}.")
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy()
  if name == "multi_worker_mirrored":
    # Bounded: a task that never answers is an error, not a hang.
    cluster.check_multi_worker()
    cluster.wait_for_workers(cluster_timeout, log=log)
    return tf.distribute.MultiWorkerMirroredStrategy()
  return _tpu_strategy(tpu)


def _tpu_strategy(tpu):
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, tf.errors.OpError) as e:
    raise ValueError(
        f"--strategy=tpu found no TPU (--tpu={tpu!r}): {e}. Run on a Cloud "
        "TPU VM, or pass --tpu=<name or grpc://address>.") from e
  return tf.distribute.TPUStrategy(resolver)
