"""`thattn-train --backend=mtf`: thattn's T5 runs trained in Mesh TensorFlow.

    summary = training.train(
        model_dir="runs/t5_mtf", task="span_corruption",
        options=TrainOptions(backend="mtf", mesh_shape="batch:2,model:2"))

The model is mtf's own (`mesh_tensorflow.transformer`): a `Bitransformer`
for span corruption, an aligned `Unitransformer` for masked LM on a T5
encoder (`t5_tiny_encoder`), built from the gin config that
`thattn.mtf.architecture.gin_text` writes for the run's T5Config, and trained by a plain `tf.compat.v1` session loop
(TensorFlow 2.21 has no TPUEstimator) on `PlacementMeshImpl`: one device,
or `options.mesh_shape` logical CPUs laid out by `options.layout_rules`
(thattn's one rules table; the binary splits the CPU before TensorFlow
starts). The step's graph is `thattn.mtf.training_graph`'s.

The same as the Keras backend (`thattn.training.trainer`), so that the two
are interchangeable and agree step for step:
- the task, its tokenizer and its step-addressed batches; run_config.json
  (with "backend": "mtf"), the model_dir lock, progress lines, TensorBoard
  summaries, summary.json, and resuming from the latest checkpoint;
- the initial weights: the task builds its Keras backbone under the run's
  seed, exactly as the Keras backend does, and `thattn.mtf.model_map`
  converts them (or, with `init_checkpoint`, that run's backbone);
- the loss, the optimizer and the schedule (see `training_graph`).

The model_dir is an mtf model_dir: `operative_config.gin` and TF1
checkpoints `model.ckpt-N` (the master variables under T5's names,
Adafactor's `<name>_slot_v*`, `global_step`), which `thattn-convert` takes
to Keras; beside them thattn's run_config.json, tokenizer/ and summaries.
`export` serves it through that conversion.

Departures, refused or documented: T5 models only (BERT and ALBERT have
no mtf model here); float32, Adafactor, no dropout.
Adafactor factors a weight's second moment over its two largest axes, and
mtf's multi-head SelfAttention keeps q, k, v, o combined ([d_model,
heads * d_kv]) where Keras keeps [d_model, heads, d_kv]: where an axis
reaches 128, the two backends factor those weights differently (both are
Adafactor; their steps differ slightly).
"""

import contextlib
import dataclasses
import math
import os
import tempfile
import time

import numpy as np
import tensorflow as tf
import tf_keras

from thattn import export as export_lib
from thattn import models
from thattn import run_dir
from thattn import tasks
from thattn.mtf import architecture
from thattn.mtf import cluster as cluster_lib
from thattn.mtf import convert
from thattn.mtf import model_map
from thattn.mtf import models as mtf_models
from thattn.mtf import training_graph
from thattn.training import devices as devices_lib
from thattn.training import optimizer as optimizer_lib
from thattn.training import options as options_lib
from thattn.training import progress as progress_lib
from thattn.training import run_lock
from thattn.training import trainer

_CHECKPOINT_PREFIX = mtf_models.CHECKPOINT_PREFIX


# What --backend=mtf trains: each task with its T5 model.
_TASKS = {"span_corruption": "a T5 encoder-decoder (e.g. t5_tiny)",
          "mlm": "a T5 encoder (e.g. t5_tiny_encoder)"}


def _check_task(task_class, model):
  """Refuses tasks and models that have no mtf model here."""
  config = (models.model_config(model.preset, **model.overrides)
            if model.preset else None)
  if task_class.name not in _TASKS or not isinstance(config,
                                                     models.T5Config):
    trains = "; ".join(f"--task={name} with {what}"
                       for name, what in _TASKS.items())
    raise ValueError(f"--backend=mtf trains T5 models ({trains}); "
                     f"--task={task_class.name} with preset "
                     f"{model.preset!r} has no Mesh TensorFlow model here.")
  # The held-out loss is read from the training graph, which is exact only
  # without dropout (the paper's pretraining recipe).
  dropout = config.dropout_rate
  if dropout:
    raise ValueError(f"--backend=mtf trains without dropout, got "
                     f"dropout_rate={dropout}; pass --dropout_rate=0.")


def train(*, model_dir, task="span_corruption", model=None, data=None,
          options=None, log=print):
  """Trains a T5 in Mesh TensorFlow (span corruption, or masked LM on a T5
  encoder); returns the summary.

  Args: as `thattn.training.trainer.train`, with `options.backend == "mtf"`.
  Raises:
    ValueError for a task or model this backend cannot train, bad mesh or
    rules (naming the variable and sizes), or a model_dir of another run.
  """
  task_class = tasks.get(task)
  options = options or options_lib.TrainOptions(backend=options_lib.MTF)
  if options.backend != options_lib.MTF:
    raise ValueError(f"backend={options.backend!r}; this trainer is "
                     "--backend=mtf's.")
  if options.deterministic:
    tf.config.experimental.enable_op_determinism()
  processes = cluster_lib.from_tf_config()
  if processes and not processes.is_chief:
    return _serve(processes, model_dir, options, log)
  data = data or tasks.DataOptions()
  model = trainer.resolve_model(task_class, model, options, log)
  _check_task(task_class, model)
  guard = run_lock.StartGuard(model_dir)
  with _chief_server(processes, options, log) as server, run_lock.hold(
      model_dir, log=log):
    tf_keras.utils.set_random_seed(options.seed)  # as the Keras backend
    try:
      task_run, gin_text = _start(model_dir, task_class, model, data,
                                  options, log)
    except BaseException:
      guard.rollback()  # a failed start leaves the model_dir as it was
      raise
    with mtf_models.gin_scope(gin_text):
      return _train(model_dir, task_run, gin_text, options, log,
                    _Placement.of(processes, server, options))


def _mesh_size(processes, options):
  if options.mesh_shape is None:
    raise ValueError(
        f"--backend=mtf over the {len(processes.tasks)} tasks of TF_CONFIG "
        "needs --mesh_shape (and --layout_rules) to place the model on "
        "their devices.")
  return options.mtf_mesh()[0].size


def _serve(processes, model_dir, options, log):
  """A task other than the chief: its devices serve the chief's steps."""
  server = cluster_lib.start_server(processes, _mesh_size(processes, options),
                                    options.cluster_timeout, log)
  cluster_lib.serve(processes, server, log)
  return {"served": processes.name(), "model_dir": model_dir}


@contextlib.contextmanager
def _chief_server(processes, options, log):
  """The chief's server (None in one process), started before anything
  can fail, and the serving tasks told when the run ends, however it
  ends."""
  if processes is None:
    yield None
    return
  server = cluster_lib.start_server(processes, _mesh_size(processes, options),
                                    options.cluster_timeout, log)
  finished = False
  try:
    yield server
    finished = True
  except tf.errors.UnavailableError as error:  # a serving task was lost
    raise cluster_lib.lost_tasks(processes, error) from error
  finally:
    cluster_lib.end_run(processes, server, finished, log)


@dataclasses.dataclass(frozen=True)
class _Placement:
  """Where the step graph runs: this process, or a TF_CONFIG cluster."""
  target: str = ""  # the session's: "" in-process, else the chief's server
  devices: tuple = None  # of the mesh's positions; None: local CPUs
  client_device: str = None  # the feeds, masters and Saver: the chief's

  @classmethod
  def of(cls, processes, server, options):
    if processes is None:
      return cls()
    return cls(target=server.target,
               devices=tuple(processes.mesh_devices(
                   _mesh_size(processes, options))),
               client_device=processes.device(processes.chief))


def _start(model_dir, task_class, model, data, options, log):
  """The task (data, tokenizer, Keras backbone) and the run's files."""
  tf.io.gfile.makedirs(model_dir)
  task = trainer.make_task(task_class, model_dir=model_dir, model=model,
                           data=data, options=options, log=log)
  run_dir.check_or_write_run_config(
      model_dir, trainer.run_config(task, model, data, options, model_dir))
  gin_text = architecture.gin_text(task.model_config)
  _check_or_write_gin(model_dir, gin_text)
  task.build()  # the Keras backbone: the initial weights
  if options.init_checkpoint and not tf.train.latest_checkpoint(model_dir):
    path = run_dir.find_checkpoint(options.init_checkpoint)
    tf.train.Checkpoint(backbone=task.backbone).restore(
        path).expect_partial().assert_existing_objects_matched()
    log(f"Backbone initialized from {path}.")
  return task, gin_text


def _check_or_write_gin(model_dir, gin_text):
  path = os.path.join(model_dir, mtf_models.OPERATIVE_CONFIG)
  if not tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(gin_text)
  elif mtf_models.read_operative_config(model_dir) != gin_text:
    raise ValueError(f"{path} describes another model than this run's; use "
                     "a new --model_dir, or the flags of the run there.")


def _build(task, gin_text, options, placement):
  """The `StepGraph`, with the Keras backbone's weights as initial values."""
  mesh_and_rules = options.mtf_mesh()
  mesh, rules = mesh_and_rules or (None, None)
  config = task.model_config
  model = mtf_models.build_model(gin_text=gin_text,
                                 vocab_size=config.vocab_size,
                                 mesh_shape=mesh, layout=rules)
  initial = model_map.keras_to_mtf(mtf_model=model, keras_model=task.backbone)
  # The placeholders take the shapes of the task's batches.
  inputs, targets = mtf_batch(next(iter(task.eval_dataset(1))))
  with _quiet_tensorflow_logger():  # mtf's notes on initializers replaced
    return training_graph.build(
        model=model, batch_size=inputs.shape[0],
        inputs_length=inputs.shape[1], targets_length=targets.shape[1],
        initial_values=initial, mesh_and_rules=mesh_and_rules,
        seed=options.seed, max_to_keep=options.max_checkpoints,
        devices=placement.devices, client_device=placement.client_device)


@contextlib.contextmanager
def _quiet_tensorflow_logger():
  """Hides warnings of TensorFlow's logger (mtf's) inside the block."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")
  try:
    yield
  finally:
    logger.setLevel(level)


class _Session:
  """The step graph in a session: steps, held-out loss, saves, restores."""

  def __init__(self, step_graph, model_dir, target=""):
    self.graph = step_graph
    self.model_dir = model_dir
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
    inputs, targets = mtf_batch(batch)
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

  def evaluate(self, dataset):
    """ln(PPL) over every non-padding target of `dataset`."""
    return devices_lib.evaluate(self, dataset)

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
          self.session, os.path.join(self.model_dir, _CHECKPOINT_PREFIX),
          global_step=self.step, write_meta_graph=False)

  def restore(self, path):
    with self.graph.graph.as_default():
      self.graph.saver.restore(self.session, path)
    self.session.run(self.graph.copy_to_slices)


def mtf_batch(batch):
  """(inputs, targets) int32 [batch, length] of a task's batch.

  Span corruption's are its own. Masked LM's inputs are the masked tokens,
  and its targets the original tokens at the masked positions, 0 (not
  scored) elsewhere: the positions the Keras loss gathers.
  """
  if "targets" in batch:
    return (np.asarray(batch["inputs"], np.int32),
            np.asarray(batch["targets"], np.int32))
  inputs = np.asarray(batch["input_word_ids"], np.int32)
  targets = np.zeros_like(inputs)
  rows, slots = np.nonzero(np.asarray(batch["masked_lm_weights"]) > 0)
  positions = np.asarray(batch["masked_lm_positions"])[rows, slots]
  targets[rows, positions] = np.asarray(batch["masked_lm_ids"])[rows, slots]
  return inputs, targets


# What a damaged or foreign checkpoint raises while it is read.
_RESTORE_ERRORS = (tf.errors.OpError, ValueError, IndexError)


def _resume(session, options, log):
  """Restores the newest checkpoint, or initializes; returns the step."""
  state = tf.train.get_checkpoint_state(session.model_dir)
  paths = list(reversed(state.all_model_checkpoint_paths)) if state else []
  for index, path in enumerate(paths):
    try:
      session.restore(path)
    except _RESTORE_ERRORS as error:
      cause = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
      if options.resume_from == "latest_intact" and index + 1 < len(paths):
        log(f"{path} cannot be restored ({cause}); trying the one before, "
            "as --resume_from=latest_intact asks.")
        continue
      raise ValueError(
          f"The checkpoint {path} cannot be restored: {cause}. Rerun with "
          "--resume_from=latest_intact to resume from an earlier one, or "
          "use a new --model_dir.") from error
    log(f"Resumed from {path} at step {session.step}.")
    return session.step
  session.initialize()
  return 0


def _train(model_dir, task, gin_text, options, log, placement):
  session = _Session(_build(task, gin_text, options, placement), model_dir,
                     placement.target)
  with contextlib.closing(session):
    start_step = _resume(session, options, log)
    finished = trainer.finished_summary(model_dir, start_step, options, log)
    if finished is not None:
      return finished
    return _run(session, task, options, start_step, log)


def _run(session, task, options, start_step, log):
  """Evaluates, trains to train_steps, evaluates; the summary."""
  schedule = optimizer_lib.make_schedule(options)
  variables = len(session.graph.variable_names)
  mesh = (f"mesh {options.mesh_shape}, {len(session.graph.sharded)} of "
          f"{variables} variables sharded" if options.mesh_shape else
          "one device")
  kind = {mtf_models.BITRANSFORMER: "Bitransformer",
          "aligned": "aligned Unitransformer"}[session.graph.model_type]
  log(f"{task.describe()}; Mesh TensorFlow {kind}, {variables} "
      f"variables; adafactor, peak learning rate "
      f"{options.peak_learning_rate:g}; {mesh}.")
  eval_data = task.eval_dataset(options.eval_steps)
  if math.isnan(session.initial_eval):
    session.set_initial_eval(session.evaluate(eval_data))
  before = session.initial_eval
  log(f"Held-out {task.eval_metric} before training: {before:.4f}")
  writers = {name: tf.summary.create_file_writer(
      run_dir.path(session.model_dir, name))
             for name in run_dir.SUMMARY_FOLDERS}
  started = time.time()
  steady_rate = _steps(session, task, options, schedule, writers, eval_data,
                       start_step, log)
  train_seconds = time.time() - started
  after = session.evaluate(eval_data)
  progress_lib.write_eval(writers["eval"], session.step, task.eval_metric,
                          after, {})
  for writer in writers.values():
    writer.flush()
  metric = task.eval_metric
  summary = {
      "task": task.name, "preset": task.model_options.preset,
      "backend": options_lib.MTF, "steps": session.step,
      "resumed_from_step": start_step,
      "steps_this_run": session.step - start_step,
      "parameters": task.backbone.count_params(),
      f"held_out_{metric}_before": before, f"held_out_{metric}_after": after,
      "train_seconds": round(train_seconds, 2),
      "tokens_per_second": round(steady_rate),
      "model_dir": session.model_dir,
      "checkpoint": tf.train.latest_checkpoint(session.model_dir)}
  run_dir.write_json(run_dir.path(session.model_dir, run_dir.SUMMARY),
                     summary)
  log(f"Held-out {metric} after training:  {after:.4f} (before: "
      f"{before:.4f})")
  return summary


def _steps(session, task, options, schedule, writers, eval_data, start_step,
           log):
  """The loop proper; returns tokens/s after the first step."""
  remaining = options.train_steps - start_step
  progress = progress_lib.Progress(task, options, schedule, writers["train"],
                                   log)
  steady_start, paused = None, 0.0
  for index, batch in enumerate(task.train_dataset(start_step).take(
      remaining)):
    step = start_step + index
    progress.add(session.train_step(batch, float(schedule(step))))
    if index == 0:
      steady_start = time.time()
    step += 1
    last = step == options.train_steps
    # Saved before reported: a progress line says its step is kept.
    if step % options.checkpoint_every == 0 or last:
      session.save()
    if step % options.log_every == 0 or last:
      progress.report(step)
    if options.eval_every and step % options.eval_every == 0 and not last:
      eval_started = time.time()
      value = session.evaluate(eval_data)
      progress_lib.write_eval(writers["eval"], step, task.eval_metric, value,
                              {})
      log(f"step {step:>6}/{options.train_steps}  held-out "
          f"{task.eval_metric} {value:.4f}")
      progress.pause(time.time() - eval_started)
      paused += time.time() - eval_started
  if remaining <= 1:
    return 0.0
  seconds = max(time.time() - steady_start - paused, 1e-9)
  return (remaining - 1) * task.tokens_per_step / seconds


def export(*, model_dir, export_dir, log=print):
  """Exports a `--backend=mtf` run: converted to Keras, then exported.

  The newest checkpoint is converted (`thattn.mtf.convert.mtf_to_thattn`,
  with the run's tokenizer and sequence length) into a temporary thattn
  model_dir, which `thattn.export.export` exports as any Keras run.
  """
  config = run_dir.read_run_config(model_dir)
  with tempfile.TemporaryDirectory(prefix="thattn-mtf-export-") as temp:
    keras_dir = os.path.join(temp, "run")
    convert.mtf_to_thattn(
        mtf_model_dir=model_dir, model_dir=keras_dir,
        vocabulary=run_dir.path(model_dir, run_dir.TOKENIZER),
        sequence_length=config["sequence_length"], task=config["task"],
        log=log)
    return export_lib.export(model_dir=keras_dir, export_dir=export_dir,
                             log=log)
