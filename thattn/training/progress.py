"""Progress lines and TensorBoard summaries of a training run."""

import time

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

# What TensorBoard's scalar plugin reads. TensorFlow 2.21 no longer installs
# tensorboard, whose tf.summary.scalar this replaces; install tensorboard
# (the [tensorboard] extra) only to view the summaries.
SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR)


def format_duration(seconds):
  minutes, seconds = divmod(int(round(seconds)), 60)
  return f"{minutes}m{seconds:02d}s"


def scalar(name, value):
  tf.summary.write(name, tf.constant(value, tf.float32),
                   metadata=SCALAR_METADATA)


def write_eval(writer, step, metric, value, extra):
  with writer.as_default(step=step):
    scalar(metric, value)
    for name, extra_value in extra.items():
      scalar(name, extra_value)


class Progress:
  """Progress lines and train summaries over a window of steps."""

  def __init__(self, task, options, schedule, writer, log):
    self.task, self.options, self.schedule = task, options, schedule
    self.writer, self.log = writer, log
    self.window_start, self.losses = time.time(), []

  def add(self, loss):
    self.losses.append(loss)

  def pause(self, seconds):
    """Excludes `seconds` (an evaluation) from the tokens/s of the window."""
    self.window_start += seconds

  def report(self, step):
    elapsed = max(time.time() - self.window_start, 1e-9)
    rate = len(self.losses) * self.task.tokens_per_step / elapsed
    loss = sum(self.losses) / len(self.losses)
    learning_rate = float(self.schedule(step - 1))
    total = self.options.train_steps
    eta = (total - step) * elapsed / len(self.losses)
    with self.writer.as_default(step=step):
      scalar("loss", loss)
      scalar("learning_rate", learning_rate)
      scalar("tokens_per_second", rate)
    self.log(f"step {step:>6}/{total}  loss {loss:.4f}  "
             f"lr {learning_rate:.2e}  {rate:,.0f} tokens/s  "
             f"ETA {format_duration(eta)}")
    self.window_start, self.losses = time.time(), []
