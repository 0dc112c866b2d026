"""The training loop behind `thattn-train`. It knows no flags.

`train(model_dir=..., task=..., model=..., data=..., options=...)` trains one
objective (`thattn.tasks.objectives`, `thattn.tasks.finetuning`) with the
paper's recipe by default: Adafactor, an inverse-square-root schedule whose
last 10% decays linearly to zero, and no dropout in pretraining.

What a run leaves in `model_dir`:
- `checkpoints/`: `tf.train.CheckpointManager` checkpoints of the backbone,
  the head, the optimizer (its slots and step), the seed and the held-out
  loss at step 0. A rerun of the same command resumes from the latest one.
- `train/` and `eval/`: TensorBoard summaries (loss, learning rate,
  tokens/s; held-out ln(PPL) or loss, and task metrics).
- `run_config.json`: the task, preset, overrides and sizes, which
  `thattn-export` rebuilds the model from; a rerun must match it. The
  strategy and mesh are not in it: checkpoints do not depend on them, so a
  rerun may resume on other devices (`thattn.tasks.dtensor_training`).
- `dtensor_layouts.json` (--strategy=dtensor): each weight's and optimizer
  slot's layout in the latest run.
- `tokenizer/`: the tokenizer's files (none for recall).
- `summary.json`: the final summary, also printed.

Exact resume. Batches are a pure function of (seed, step)
(`thattn.tasks.lm_data`), so the step is the data iterator's whole state; it
is the optimizer's `iterations`, saved with it. With `deterministic=True`
(TensorFlow's op determinism), a run killed at any point and rerun ends
with the same weights and loss as an uninterrupted run, bit for bit, as long
as dropout is off (the pretraining default). Departure: tf-keras keeps
dropout's random state out of checkpoints, so with dropout on, a resumed run
reseeds dropout from (seed, resume step): deterministic, but not the masks
the uninterrupted run drew.
"""

import dataclasses
import json
import math
import os
import time

import tensorflow as tf
from tensorflow.core.framework import summary_pb2
import tf_keras

from thattn import optimizers
from thattn.tasks import dtensor_training
from thattn.tasks import finetuning
from thattn.tasks import objectives
from thattn.tasks import strategies

TASKS = ("mlm", "span_corruption", "classification", "squad", "recall")
OPTIMIZERS = ("adafactor", "adam")
MIXED_PRECISION = ("off", "float16", "bfloat16")
# The backbone each task uses when no preset is given.
DEFAULT_PRESETS = {"mlm": "bert_tiny", "span_corruption": "t5_tiny",
                   "classification": "bert_tiny", "squad": "bert_tiny",
                   "recall": None}
# The peak learning rate when none is given. T5's Adafactor peaks at 0.01
# (1 / sqrt(10^4)) after 10^4 warmup steps; our runs are short, with 100
# warmup steps, and peak higher: on the default job's model, 600 steps gave
# held-out ln(PPL) 6.10, 5.96 and 6.04 at peaks 0.01, 0.03 and 0.1 (and 6.16
# with Adam at 1e-3).
DEFAULT_LEARNING_RATES = {"adafactor": 0.03, "adam": 1e-3}
# What TensorBoard's scalar plugin reads. TensorFlow 2.21 no longer installs
# tensorboard, whose tf.summary.scalar this replaces; install tensorboard
# (the [tensorboard] extra) only to view the summaries.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=summary_pb2.DATA_CLASS_SCALAR)
RUN_CONFIG = "run_config.json"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  """How to train: steps, batches, optimizer, schedule, logging, devices."""
  train_steps: int = 1000
  batch_size: int = 32
  sequence_length: int = 128
  optimizer: str = "adafactor"
  learning_rate: float = None  # peak rate; None: DEFAULT_LEARNING_RATES
  warmup_steps: int = 100
  decay_fraction: float = 0.1
  eval_every: int = 0  # 0: only before and after training
  eval_steps: int = 20
  log_every: int = 100
  checkpoint_every: int = 500
  max_checkpoints: int = 3
  seed: int = 0
  deterministic: bool = False
  mixed_precision: str = "off"
  strategy: str = "default"
  tpu: str = None
  init_checkpoint: str = None
  # --strategy=dtensor only (thattn.tasks.dtensor_training): the mesh, e.g.
  # "batch:2,model:2", and the rules; None: DEFAULT_LAYOUT_RULES there.
  mesh_shape: str = None
  layout_rules: str = None

  def __post_init__(self):
    for name in ("train_steps", "batch_size", "sequence_length",
                 "warmup_steps", "eval_steps", "log_every",
                 "checkpoint_every", "max_checkpoints"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if self.eval_every < 0:
      raise ValueError(f"eval_every must be >= 0, got {self.eval_every}.")
    for name, value, choices in (
        ("optimizer", self.optimizer, OPTIMIZERS),
        ("mixed_precision", self.mixed_precision, MIXED_PRECISION),
        ("strategy", self.strategy, strategies.STRATEGIES)):
      if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of "
                         f"{choices}.")
    if self.learning_rate is not None and not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be positive, got "
                       f"{self.learning_rate}.")
    # Flag mistakes fail here, before any device or data is touched.
    dtensor_training.check_options(
        strategy=self.strategy, mesh_shape=self.mesh_shape,
        layout_rules=self.layout_rules, tpu=self.tpu)

  @property
  def peak_learning_rate(self):
    return self.learning_rate or DEFAULT_LEARNING_RATES[self.optimizer]


def format_duration(seconds):
  minutes, seconds = divmod(int(round(seconds)), 60)
  return f"{minutes}m{seconds:02d}s"


def _make_objective(task, *, model_dir, model, data, options, finetune, log):
  common = dict(batch_size=options.batch_size,
                sequence_length=options.sequence_length, seed=options.seed,
                model=model, log=log)
  if task == "recall":
    return objectives.Recall(**common)
  text = dict(common, data=data, model_dir=model_dir)
  if task == "mlm":
    return objectives.MaskedLM(**text)
  if task == "span_corruption":
    return objectives.SpanCorruption(**text)
  if options.init_checkpoint:
    finetune = dataclasses.replace(
        finetune, init_dir=_run_dir(options.init_checkpoint))
  if task == "classification":
    return finetuning.Classification(finetune=finetune, **text)
  return finetuning.Squad(finetune=finetune, **text)


def make_optimizer(options, mesh=None):
  """(optimizer, schedule); `mesh`: a DTensor mesh to keep the state on."""
  # tf-keras optimizers take `mesh=` to make their slots DVariables.
  on_mesh = {"mesh": mesh} if mesh is not None else {}
  schedule = optimizers.InverseSqrtSchedule(
      options.warmup_steps, options.train_steps,
      decay_fraction=options.decay_fraction,
      scale=options.peak_learning_rate * math.sqrt(options.warmup_steps))
  if options.optimizer == "adafactor":
    optimizer = optimizers.Adafactor(schedule, **on_mesh)
  else:
    optimizer = tf_keras.optimizers.Adam(schedule, **on_mesh)
  if options.mixed_precision == "float16":
    optimizer = tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
  return optimizer, schedule


def _run_dir(checkpoint):
  """The model_dir of a checkpoint path, or the folder itself."""
  if tf.io.gfile.isdir(checkpoint):
    return checkpoint
  parent = os.path.dirname(checkpoint)
  return os.path.dirname(parent) if os.path.basename(parent) == CHECKPOINTS \
      else parent


def _inherit_model(model, init_checkpoint, log):
  """ModelOptions with the preset and overrides of the init checkpoint's run.

  The run's own overrides win; its vocabulary and dropout do not carry over
  (the tokenizer sets one, and pretraining ran without the other).
  """
  path = os.path.join(_run_dir(init_checkpoint), RUN_CONFIG)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"init_checkpoint={init_checkpoint!r} has no {path} to "
                     "take the model from; pass the preset.")
  with tf.io.gfile.GFile(path) as f:
    config = json.load(f)
  inherited = {key: value for key, value in config["overrides"].items()
               if key not in ("vocab_size", "dropout_rate")}
  log(f"Model: {config['preset']} with {inherited}, as in {path}.")
  return dataclasses.replace(model, preset=config["preset"],
                             overrides=dict(inherited, **model.overrides))


def _latest_checkpoint(path):
  """A checkpoint prefix from a prefix, a checkpoints/ folder or a model_dir."""
  if not tf.io.gfile.isdir(path):
    return path
  for folder in (os.path.join(path, CHECKPOINTS), path):
    latest = tf.train.latest_checkpoint(folder)
    if latest:
      return latest
  raise ValueError(f"init_checkpoint={path!r}: no checkpoint found there or "
                   f"in its {CHECKPOINTS}/ folder.")


def _check_run_config(model_dir, config):
  """Writes run_config.json, or checks a rerun against the one there."""
  path = os.path.join(model_dir, RUN_CONFIG)
  if tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path) as f:
      saved = json.load(f)
    changed = sorted(key for key in set(saved) | set(config)
                     if saved.get(key) != config.get(key))
    if changed:
      details = ", ".join(f"{key}: {saved.get(key)!r} -> {config.get(key)!r}"
                          for key in changed)
      raise ValueError(f"{model_dir} holds a run with other settings "
                       f"({details}); use a new --model_dir to start over.")
    return
  tf.io.gfile.makedirs(model_dir)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


class StrategyDevices:
  """A tf.distribute.Strategy: builds in its scope, runs with TrainLoop.

  `dtensor_training.DTensorDevices` has the same methods for a DTensor mesh.
  """

  def __init__(self, strategy):
    self.strategy = strategy

  def describe(self):
    return f"{self.strategy.num_replicas_in_sync} replica(s)"

  def build(self, objective, make_optimizer_fn):
    """Builds the objective and `make_optimizer_fn()` with all its slots."""
    with self.strategy.scope():
      objective.build()
      optimizer, schedule = make_optimizer_fn()
      optimizer.build(objective.trainable_variables)
    return optimizer, schedule

  def train_loop(self, objective, optimizer, loss_scaling):
    return TrainLoop(self.strategy, objective, optimizer, loss_scaling)


def _make_devices(options, model_dir):
  if options.strategy == strategies.DTENSOR:
    return dtensor_training.DTensorDevices(options, model_dir)
  return StrategyDevices(strategies.make_strategy(options.strategy,
                                                  options.tpu))


class TrainLoop:
  """The compiled steps: distributed training and evaluation."""

  def __init__(self, strategy, objective, optimizer, loss_scaling):
    self.strategy = strategy
    self.objective = objective
    self.optimizer = optimizer
    self.variables = objective.trainable_variables
    self.loss_scaling = loss_scaling
    self.train_step = tf.function(self._train_step)
    self.eval_step = tf.function(self._eval_step)

  def replica_train_step(self, batch):
    with tf.GradientTape() as tape:
      total, count = self.objective.loss(batch, training=True)
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
        lambda b: self.objective.loss(b, training=False), args=(batch,)))

  def distribute(self, dataset):
    return self.strategy.experimental_distribute_dataset(dataset)


def evaluate(loop, dataset):
  """Mean loss over every weighted position of `dataset`.

  `loop` is a TrainLoop or a `dtensor_training.DTensorTrainLoop`: both
  place batches with `distribute` and return (total, count) from
  `eval_step`.
  """
  total = count = 0.0
  for batch in loop.distribute(dataset):
    batch_total, batch_count = loop.eval_step(batch)
    total, count = total + float(batch_total), count + float(batch_count)
  return total / max(count, 1.0)


def train(*, model_dir, task="mlm", model=None, data=None, options=None,
          finetune=None, log=print):
  """Trains, evaluates before, during and after, and returns the summary.

  Args:
    model_dir: where checkpoints, summaries and the run's files go.
    task: one of TASKS.
    model: an `objectives.ModelOptions`; its preset defaults per task
      (DEFAULT_PRESETS). For recall, overrides are RecallEncoder keywords.
    data: an `objectives.DataOptions` (text tasks).
    options: a `TrainOptions`.
    finetune: a `finetuning.FinetuneOptions` (classification and squad).
    log: called with each progress line.
  Returns:
    The summary dict, also written to `model_dir/summary.json`.
  """
  if task not in TASKS:
    raise ValueError(f"Unknown task {task!r}; expected one of {TASKS}.")
  options = options or TrainOptions()
  data = data or objectives.DataOptions()
  finetune = finetune or finetuning.FinetuneOptions()
  model = model or objectives.ModelOptions(preset=None)
  if model.preset is None and task != "recall":
    if options.init_checkpoint:
      model = _inherit_model(model, options.init_checkpoint, log)
    else:
      model = dataclasses.replace(model, preset=DEFAULT_PRESETS[task])
  tf_keras.utils.set_random_seed(options.seed)
  if options.deterministic:
    tf.config.experimental.enable_op_determinism()
  previous_policy = tf_keras.mixed_precision.global_policy()
  if options.mixed_precision != "off":
    tf_keras.mixed_precision.set_global_policy(
        f"mixed_{options.mixed_precision}")
  try:
    return _train(model_dir=model_dir, task=task, model=model, data=data,
                  options=options, finetune=finetune, log=log)
  finally:
    tf_keras.mixed_precision.set_global_policy(previous_policy)


def _train(*, model_dir, task, model, data, options, finetune, log):
  devices = _make_devices(options, model_dir)
  tf.io.gfile.makedirs(model_dir)
  objective = _make_objective(task, model_dir=model_dir, model=model,
                              data=data, options=options, finetune=finetune,
                              log=log)
  run_config = dict(objective.run_config(), batch_size=options.batch_size,
                    seed=options.seed)
  _check_run_config(model_dir, run_config)
  optimizer, schedule = devices.build(
      objective, lambda **kwargs: make_optimizer(options, **kwargs))
  # Trainer state, outside the strategy: one copy, not one per replica.
  initial_eval = tf.Variable(float("nan"), trainable=False)
  checkpoint = tf.train.Checkpoint(optimizer=optimizer,
                                   initial_eval=initial_eval,
                                   **objective.checkpoint_items())
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(model_dir, CHECKPOINTS),
      max_to_keep=options.max_checkpoints)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    log(f"Resumed from {manager.latest_checkpoint} at step "
        f"{int(optimizer.iterations.numpy())}.")
  elif options.init_checkpoint:
    path = _latest_checkpoint(options.init_checkpoint)
    tf.train.Checkpoint(backbone=objective.backbone).restore(
        path).expect_partial().assert_existing_objects_matched()
    log(f"Backbone initialized from {path}.")
  start_step = int(optimizer.iterations.numpy())
  if start_step and start_step < options.train_steps:
    # Dropout's random state is not in the checkpoint (see the module).
    tf.random.set_seed(options.seed * 1_000_003 + start_step)

  loop = devices.train_loop(objective, optimizer,
                            loss_scaling=options.mixed_precision == "float16")
  eval_data = objective.eval_dataset(options.eval_steps)
  metric = objective.eval_metric
  log(f"{objective.describe()}; {len(loop.variables)} trained tensors, "
      f"{sum(v.shape.num_elements() for v in loop.variables):,} trained "
      f"parameters; {options.optimizer}, peak learning rate "
      f"{options.peak_learning_rate:g}; {devices.describe()}.")
  if math.isnan(float(initial_eval)):
    initial_eval.assign(evaluate(loop, eval_data))
  eval_before = float(initial_eval)
  log(f"Held-out {metric} before training: {eval_before:.4f}")

  writers = {name: tf.summary.create_file_writer(os.path.join(model_dir, name))
             for name in ("train", "eval")}
  started = time.time()
  steps_run, steady_rate = _run_steps(loop, objective, options, schedule,
                                      manager, writers, eval_data,
                                      start_step, log)
  train_seconds = time.time() - started
  eval_after = evaluate(loop, eval_data)
  extra = objective.extra_eval_metrics(options.eval_steps)
  step = int(optimizer.iterations.numpy())
  _write_eval(writers["eval"], step, metric, eval_after, extra)
  for writer in writers.values():
    writer.flush()
  summary = {
      "task": task, "preset": model.preset, "steps": step,
      "resumed_from_step": start_step, "steps_this_run": steps_run,
      "parameters": objective.backbone.count_params(),
      f"held_out_{metric}_before": eval_before,
      f"held_out_{metric}_after": eval_after,
      **{f"held_out_{name}": value for name, value in extra.items()},
      "train_seconds": round(train_seconds, 2),
      "tokens_per_second": round(steady_rate),
      "model_dir": model_dir, "checkpoint": manager.latest_checkpoint,
  }
  with tf.io.gfile.GFile(os.path.join(model_dir, SUMMARY), "w") as f:
    f.write(json.dumps(summary, indent=2) + "\n")
  log(f"Held-out {metric} after training:  {eval_after:.4f} "
      f"(before: {eval_before:.4f})" +
      "".join(f", {name} {value:.4g}" for name, value in extra.items()))
  return summary


def _scalar(name, value):
  tf.summary.write(name, tf.constant(value, tf.float32),
                   metadata=_SCALAR_METADATA)


def _write_eval(writer, step, metric, value, extra):
  with writer.as_default(step=step):
    _scalar(metric, value)
    for name, extra_value in extra.items():
      _scalar(name, extra_value)


def _run_steps(loop, objective, options, schedule, manager, writers,
               eval_data, start_step, log):
  """The training loop proper.

  Returns (steps run, tokens/s after the first step, which compiles).
  """
  remaining = options.train_steps - start_step
  if remaining <= 0:
    return 0, 0.0
  iterator = iter(loop.distribute(objective.train_dataset(start_step)))
  window_start, window_losses = time.time(), []
  steady_start, steady_seconds = None, 0.0
  for index in range(remaining):
    window_losses.append(float(loop.train_step(iterator)))
    if index == 0:
      steady_start = time.time()
    step = int(loop.optimizer.iterations.numpy())
    last = step == options.train_steps
    if step % options.log_every == 0 or last:
      elapsed = max(time.time() - window_start, 1e-9)
      rate = len(window_losses) * objective.tokens_per_step / elapsed
      loss = sum(window_losses) / len(window_losses)
      learning_rate = float(schedule(step - 1))
      eta = (options.train_steps - step) * elapsed / len(window_losses)
      with writers["train"].as_default(step=step):
        _scalar("loss", loss)
        _scalar("learning_rate", learning_rate)
        _scalar("tokens_per_second", rate)
      log(f"step {step:>6}/{options.train_steps}  loss {loss:.4f}  "
          f"lr {learning_rate:.2e}  {rate:,.0f} tokens/s  "
          f"ETA {format_duration(eta)}")
      window_start, window_losses = time.time(), []
    if step % options.checkpoint_every == 0 or last:
      manager.save(checkpoint_number=step)
    if options.eval_every and step % options.eval_every == 0 and not last:
      eval_started = time.time()
      value = evaluate(loop, eval_data)
      _write_eval(writers["eval"], step, objective.eval_metric, value, {})
      log(f"step {step:>6}/{options.train_steps}  held-out "
          f"{objective.eval_metric} {value:.4f}")
      window_start += time.time() - eval_started  # tokens/s: training only
      steady_seconds -= time.time() - eval_started
  steady_seconds += time.time() - steady_start
  steady_rate = ((remaining - 1) * objective.tokens_per_step /
                 max(steady_seconds, 1e-9)) if remaining > 1 else 0.0
  return remaining, steady_rate
