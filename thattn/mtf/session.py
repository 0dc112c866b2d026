"""The step graph of `thattn.mtf.training_graph` in a TF1 session.

`Session` runs what the Mesh TensorFlow backend (`thattn.mtf.training`)
asks of a step graph: training steps with the learning rate fed, held-out
losses, the initial values, saves and restores of the master variables
(mtf's TF1 Saver), and the masters' values read back. `Placement` says
where the graph runs: in this process, or over a TF_CONFIG cluster
(`thattn.mtf.cluster`).
"""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from thattn.mtf import models as mtf_models


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where the step graph runs: this process, or a TF_CONFIG cluster."""
  target: str = ""  # the session's: "" in-process, else the chief's server
  devices: tuple = None  # of the mesh's positions; None: local CPUs
  client_device: str = None  # the feeds, masters and Saver: the chief's


class Session:
  """The step graph in a session: steps, held-out loss, saves, restores.

  `to_arrays(batch)` turns one of the task's batches into (inputs,
  targets) int32 arrays [batch, length] (the task's `inputs_and_targets`).
  """

  def __init__(self, step_graph, model_dir, to_arrays, target=""):
    self.graph = step_graph
    self.model_dir = model_dir
    self.to_arrays = to_arrays
    # On a cluster, isolated: a serving task's server keeps no state of an
    # earlier session (a chief restarted on a live server starts clean).
    # In process no config: the session takes TensorFlow's, with the
    # logical CPUs the binary made.
    config = (tf.compat.v1.ConfigProto(isolate_session_state=True)
              if target else None)
    self.session = tf.compat.v1.Session(target, graph=step_graph.graph,
                                        config=config)

  def close(self):
    self.session.close()

  def _feeds(self, batch):
    inputs, targets = self.to_arrays(batch)
    return {self.graph.inputs: inputs, self.graph.targets: targets}

  def train_step(self, batch, learning_rate):
    feeds = self._feeds(batch)
    feeds[self.graph.learning_rate] = learning_rate
    loss_sum, count, _ = self.session.run(
        [self.graph.loss_sum, self.graph.count, self.graph.train_op], feeds)
    return float(np.float32(loss_sum) / np.float32(count))

  # What `thattn.training.devices.evaluate` asks of a train loop.
  def distribute(self, dataset):
    return dataset

  def eval_step(self, batch):
    """(sum of losses, non-padding targets) of one batch."""
    return self.session.run([self.graph.loss_sum, self.graph.count],
                            self._feeds(batch))

  @property
  def step(self):
    return int(self.session.run(self.graph.global_step))

  @property
  def initial_eval(self):
    return float(self.session.run(self.graph.initial_eval))

  def set_initial_eval(self, value):
    placeholder, assign = self.graph.set_initial_eval
    self.session.run(assign, {placeholder: value})

  def initialize(self):
    self.session.run(self.graph.initialize)
    self.session.run(self.graph.load_ops, self.graph.load_feeds)
    self.session.run(self.graph.copy_to_slices)

  def save(self):
    self.session.run(self.graph.copy_to_masters)
    with self.graph.graph.as_default():  # the Saver's graph-mode path
      return self.graph.saver.save(
          self.session,
          os.path.join(self.model_dir, mtf_models.CHECKPOINT_PREFIX),
          global_step=self.step, write_meta_graph=False)

  def restore(self, path):
    with self.graph.graph.as_default():
      self.graph.saver.restore(self.session, path)
    self.session.run(self.graph.copy_to_slices)

  def model_values(self):
    """{mtf variable name: float32 array} of the model as trained."""
    self.session.run(self.graph.copy_to_masters)
    values = self.session.run(dict(self.graph.masters))
    return {name: np.asarray(value, np.float32)
            for name, value in values.items()}
