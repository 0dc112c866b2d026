"""Where a task's model lives and how its steps run: one interface, two kinds.

`Devices` is what the trainer asks of a device set-up:

- `build(task, make_optimizer, seed)`: build the task's model (its weights
  drawn from `seed`, `build_task`) and the optimizer with all of its
  slots, on the devices; returns (optimizer, schedule);
- `train_loop(task, optimizer, loss_scaling)`: the compiled steps, a
  `Loop` (`train_step(iterator)`, `eval_step(batch)`, `distribute(dataset)`,
  `variables`, `optimizer`);
- `place(batch)` and `fetch(tensor)`: a host batch onto the devices, and a
  result back to NumPy, for task metrics computed outside the loss;
- `describe()`: one line for the log.

`StrategyDevices` (here) runs a `tf.distribute.Strategy`: data parallel, the
model mirrored. `thattn.training.dtensor.DTensorDevices` shards the model's
weights over a DTensor mesh.
"""

import abc

import numpy as np
import tensorflow as tf

from thattn.core import requirements

with requirements.lazy_imports("thattn.training.devices"):
  # tf_keras, on first use: dtensor.py imports this module on every backend.
  from thattn.models import initial_weights  # pylint: disable=g-import-not-at-top


def build_task(task, seed):
  """Builds the task's tf_keras model and draws its weights from `seed` by
  weight name (`thattn.models.initial_weights`), as a keras3 run draws its
  Keras 3 model's: a run of one seed starts from the same weights on every
  backend, whatever the framework's own random numbers."""
  task.build()
  initial_weights.assign(
      [layer for layer in (task.backbone, task.head) if layer is not None],
      seed)


class Devices(abc.ABC):
  """A device set-up; see the module."""

  @abc.abstractmethod
  def describe(self):
    """One line for the log: the devices and how the model sits on them."""

  @abc.abstractmethod
  def build(self, task, make_optimizer, seed):
    """Builds `task` (`build_task`, its weights drawn from `seed`) and
    `make_optimizer(**kwargs)`; (optimizer, schedule)."""

  @abc.abstractmethod
  def train_loop(self, task, optimizer, loss_scaling):
    """The compiled training and evaluation steps of `task`."""

  # Whether a task's metrics may run step-by-step decoding here (T5's
  # greedy decoding after span corruption).
  decodes = True

  def place(self, batch):
    """A host batch, ready for the model's functions."""
    return batch

  def fetch(self, tensor):
    """A result of the model's functions as a NumPy array."""
    return np.asarray(tensor)


class StrategyDevices(Devices):
  """A tf.distribute.Strategy: builds in its scope, runs with `TrainLoop`."""

  def __init__(self, strategy):
    self.strategy = strategy

  def describe(self):
    return f"{self.strategy.num_replicas_in_sync} replica(s)"

  def build(self, task, make_optimizer, seed):
    with self.strategy.scope():
      build_task(task, seed)
      optimizer, schedule = make_optimizer()
      optimizer.build(task.trainable_variables)
    return optimizer, schedule

  def train_loop(self, task, optimizer, loss_scaling):
    return TrainLoop(self.strategy, task, optimizer, loss_scaling)


class TrainLoop:
  """The compiled steps under a strategy: distributed training and eval."""

  def __init__(self, strategy, task, optimizer, loss_scaling):
    self.strategy = strategy
    self.task = task
    self.optimizer = optimizer
    self.variables = task.trainable_variables
    self.loss_scaling = loss_scaling
    # No AutoGraph: see thattn.ops.autograph.
    self.train_step = tf.function(self._train_step, autograph=False)
    self.eval_step = tf.function(self._eval_step, autograph=False)

  def replica_train_step(self, batch):
    with tf.GradientTape() as tape:
      total, count = self.task.loss(batch, training=True)
      # The mean over all replicas' positions: each replica's gradient is
      # scaled by the global count, and the optimizer sums them.
      global_count = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, count)
      loss = total / tf.maximum(global_count, 1.0)
      if self.loss_scaling:
        loss = self.optimizer.get_scaled_loss(loss)
    gradients = tape.gradient(loss, self.variables)
    if self.loss_scaling:
      gradients = self.optimizer.get_unscaled_gradients(gradients)
    self.optimizer.apply_gradients(zip(gradients, self.variables))
    return total, count

  def _reduce(self, values):
    return [self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)
            for value in values]

  def _train_step(self, iterator):
    total, count = self._reduce(self.strategy.run(
        self.replica_train_step, args=(next(iterator),)))
    return total / tf.maximum(count, 1.0)

  def _eval_step(self, batch):
    return self._reduce(self.strategy.run(
        lambda b: self.task.loss(b, training=False), args=(batch,)))

  def distribute(self, dataset):
    return self.strategy.experimental_distribute_dataset(dataset)


def evaluate(loop, dataset):
  """Mean loss over every weighted position of `dataset`.

  `loop` is any `Devices.train_loop`: it places batches with `distribute`
  and returns (total, count) from `eval_step`.
  """
  total = count = 0.0
  for batch in loop.distribute(dataset):
    batch_total, batch_count = loop.eval_step(batch)
    total, count = total + float(batch_total), count + float(batch_count)
  return total / max(count, 1.0)
