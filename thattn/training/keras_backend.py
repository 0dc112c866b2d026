"""The Keras backend: the driver's protocol over tf-keras models.

`thattn.training.backend` documents the protocol; this adapter implements
it for every device set-up of `thattn.training.devices` (`Devices`): the
default strategy, `mirrored`, `multi_worker_mirrored`, `tpu`, and DTensor
meshes (`thattn.training.dtensor`).

The checkpoints (`tf.train.CheckpointManager` in `model_dir/checkpoints`)
hold the backbone, the head, the optimizer (its slots and its
`iterations`, the run's step) and the held-out loss at step 0. The strategy
and mesh are not in them: checkpoints do not depend on them, so a rerun
may resume on other devices. In a cluster the chief saves into model_dir;
the other workers save (saving runs collectives) into their own temporary
folders and resume from the chief's checkpoints, and the clients of a
multi-client DTensor job each write their shards into model_dir.
"""

import contextlib

import tensorflow as tf

from thattn.io import checkpoint_reading
from thattn.io import run_dir
from thattn.training import backend as backend_lib
from thattn.training import cluster
from thattn.training import devices as devices_lib
from thattn.training import dtensor
from thattn.training import optimizer as optimizer_lib
from thattn.training import strategies


def make_devices(options, model_dir, log=print):
  """The `devices.Devices` that `options.strategy` names."""
  if options.strategy == strategies.DTENSOR:
    return dtensor.DTensorDevices(options, model_dir)
  return devices_lib.StrategyDevices(strategies.make_strategy(
      options.strategy, options.tpu, cluster_timeout=options.cluster_timeout,
      log=log))


@backend_lib.register
class KerasBackend(backend_lib.Backend):
  """tf-keras on a strategy or a DTensor mesh; see the module."""

  name = "keras"
  feeds_learning_rate = False  # the optimizer's schedule, in the step

  @classmethod
  def logical_devices(cls, options):
    return options.strategy == strategies.DTENSOR

  @classmethod
  @contextlib.contextmanager
  def processes(cls, model_dir, options, log):
    del options, log
    with cluster.write_dir(model_dir) as write_dir:
      yield backend_lib.Place(write_dir)

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    # Before any data is read: a bad mesh or an absent cluster fails here.
    self.devices = make_devices(self.options, self.write_dir, log=self.log)
    self.task = self.loop = self.manager = self.reader = None
    self.initial_eval_variable = None

  def build(self, task):
    options = self.options
    self.task = task
    optimizer, _ = self.devices.build(
        task, lambda **kwargs: optimizer_lib.make_optimizer(options,
                                                            **kwargs),
        seed=options.seed)
    # Trainer state, outside the strategy: one copy, not one per replica.
    self.initial_eval_variable = tf.Variable(float("nan"), trainable=False)
    checkpoint = tf.train.Checkpoint(
        optimizer=optimizer, initial_eval=self.initial_eval_variable,
        **task.checkpoint_items())
    # Multi-client DTensor: every client writes its shards of one
    # checkpoint, in model_dir; otherwise each process saves to write_dir.
    checkpoint_dir = (self.model_dir if cluster.is_dtensor_client() else
                      self.write_dir)
    self.manager = tf.train.CheckpointManager(
        checkpoint, run_dir.path(checkpoint_dir, run_dir.CHECKPOINTS),
        max_to_keep=options.max_checkpoints)
    # A worker that is not the chief resumes from the chief's checkpoints.
    self.reader = self.manager if checkpoint_dir == self.model_dir else (
        tf.train.CheckpointManager(
            checkpoint, run_dir.path(self.model_dir, run_dir.CHECKPOINTS),
            max_to_keep=None))
    self.loop = self.devices.train_loop(
        task, optimizer, loss_scaling=options.mixed_precision == "float16")

  def checkpoints(self):
    return list(self.reader.checkpoints)

  def restore(self, path):
    self.manager.checkpoint.restore(path).assert_consumed()

  def initialize(self, init_checkpoint=None):
    """The weights `build` drew; the backbone's from `init_checkpoint`."""
    if init_checkpoint:
      checkpoint_reading.restore(init_checkpoint, backbone=self.task.backbone)

  @property
  def step(self):
    return int(self.loop.optimizer.iterations.numpy())

  @property
  def initial_eval(self):
    return float(self.initial_eval_variable)

  def set_initial_eval(self, value):
    self.initial_eval_variable.assign(value)

  def train_batches(self, start_step):
    return iter(self.loop.distribute(self.task.train_dataset(start_step)))

  def train_step(self, batches, learning_rate):
    del learning_rate  # None: the optimizer's own schedule gives the rate
    return float(self.loop.train_step(batches))

  def evaluate(self, batches):
    return devices_lib.evaluate(self.loop, batches)

  def task_metrics(self, num_steps):
    return self.task.extra_eval_metrics(num_steps, self.devices)

  def save(self):
    return self.manager.save(checkpoint_number=self.step)

  def latest_checkpoint(self):
    return self.manager.latest_checkpoint

  def checkpoint_directory(self):
    return self.manager.directory

  def describe(self):
    """The model's and the trained parameters, optimizer and devices."""
    return backend_lib.describe_run(
        self.task, self.options, [tuple(v.shape) for v in self.loop.variables],
        self.devices.describe())
