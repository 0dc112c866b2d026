"""The training loop behind `thattn-train`. It knows no flags and no task.

`train(model_dir=..., task=..., model=..., data=..., options=...)` trains one
registered task (`thattn.tasks`) with the paper's recipe by default:
Adafactor, an inverse-square-root schedule whose last 10% decays linearly
to zero, and no dropout in pretraining. The task is looked up by name, and
the devices (`thattn.training.devices`) are chosen by `options.strategy`.

This is the Keras backend. The Mesh TensorFlow backend (`--backend=mtf`,
`thattn.mtf.training`) shares its start with it: `resolve_model`,
`make_task`, `run_config` and `finished_summary`.

What a run leaves in `model_dir` is listed in `thattn.run_dir`. The
checkpoints hold the backbone, the head, the optimizer (its slots and
step), and the held-out loss at step 0; a rerun of the same command resumes
from the latest one. `run_config.json` holds the task's run config plus the
batch size and seed, and a rerun must match it. The strategy and mesh are
not in it: checkpoints do not depend on them, so a rerun may resume on
other devices (`thattn.training.dtensor`).

Exact resume. Batches are a pure function of (seed, step)
(`thattn.data.batches`), so the step is the data iterator's whole state; it
is the optimizer's `iterations`, saved with it. With `deterministic=True`
(TensorFlow's op determinism), a run killed at any point and rerun ends
with the same weights and loss as an uninterrupted run, bit for bit, as long
as dropout is off (the pretraining default). Departure: tf-keras keeps
dropout's random state out of checkpoints, so with dropout on, a resumed run
reseeds dropout from (seed, resume step): deterministic, but not the masks
the uninterrupted run drew.
"""

import contextlib
import dataclasses
import math
import os
import time

import tensorflow as tf
import tf_keras

from thattn import models
from thattn import tasks
from thattn.training import cluster
from thattn.training import devices as devices_lib
from thattn.training import dtensor
from thattn.training import optimizer as optimizer_lib
from thattn.training import options as options_lib
from thattn.training import progress as progress_lib
from thattn import run_dir
from thattn.training import run_lock
from thattn.training import strategies

def default_model(task_class, model=None):
  """ModelOptions with the task's default preset (and its overrides).

  The given overrides win over the task's default ones; a given preset
  keeps only the given overrides.
  """
  model = model or tasks.ModelOptions(preset=None)
  if model.preset is not None or task_class.default_preset is None:
    return model
  return dataclasses.replace(
      model, preset=task_class.default_preset,
      overrides=dict(task_class.default_overrides, **model.overrides))


def _inherit_model(model, init_checkpoint, log):
  """ModelOptions with the preset and overrides of the init checkpoint's run.

  The run's own overrides win; its vocabulary and dropout do not carry over
  (the tokenizer sets one, and pretraining ran without the other).
  """
  init_dir = run_dir.run_dir_of(init_checkpoint)
  try:
    config = run_dir.read_run_config(init_dir)
  except ValueError:
    raise ValueError(f"init_checkpoint={init_checkpoint!r} has no "
                     f"{run_dir.RUN_CONFIG} in {init_dir} to take the model "
                     "from; pass the preset.") from None
  inherited = {key: value for key, value in config["overrides"].items()
               if key not in ("vocab_size", "dropout_rate")}
  log(f"Model: {config['preset']} with {inherited}, as in "
      f"{run_dir.path(init_dir, run_dir.RUN_CONFIG)}.")
  return dataclasses.replace(model, preset=config["preset"],
                             overrides=dict(inherited, **model.overrides))


def _check_positions(init_checkpoint, sequence_length):
  """Refuses a fine-tuning run longer than its backbone's learned positions.

  A BERT backbone learns one embedding per position, and the init
  checkpoint holds as many as its run's model: a longer table could not be
  restored into (nor would its new rows be trained ones).
  """
  try:
    config = run_dir.read_run_config(run_dir.run_dir_of(init_checkpoint))
  except ValueError:
    return  # a bare checkpoint: the restore itself checks the shapes
  if config.get("preset") is None:
    return
  backbone = models.model_config(config["preset"], **config["overrides"])
  positions = getattr(backbone, "max_position_embeddings", None)
  if (getattr(backbone, "position_embedding", None) == "absolute" and
      positions < sequence_length):
    raise ValueError(
        f"init_checkpoint={init_checkpoint!r} has {positions} learned "
        f"positions, but sequence_length={sequence_length}; pass "
        f"--sequence_length={positions} or less (SQuAD: with "
        "--on_overflow=window).")


def resolve_model(task_class, model, options, log=print):
  """The run's ModelOptions, checked before anything is read or written.

  Without a preset: the init checkpoint's run's model, or the task's
  default. Raises ValueError for a model the task cannot build, or one
  with fewer learned positions than the sequence length.
  """
  model = model or tasks.ModelOptions(preset=None)
  if model.preset is None and task_class.default_preset is not None:
    model = (_inherit_model(model, options.init_checkpoint, log)
             if options.init_checkpoint else default_model(task_class, model))
  task_class.check_model(model)
  if options.init_checkpoint:
    _check_positions(options.init_checkpoint, options.sequence_length)
  return model


def make_devices(options, model_dir, log=print):
  """The `devices.Devices` that `options.strategy` names."""
  if options.strategy == strategies.DTENSOR:
    return dtensor.DTensorDevices(options, model_dir)
  return devices_lib.StrategyDevices(strategies.make_strategy(
      options.strategy, options.tpu, cluster_timeout=options.cluster_timeout,
      log=log))


def make_task(task_class, *, model_dir, model, data, options, log):
  """One run of `task_class`, with its files in model_dir."""
  init_dir = (run_dir.run_dir_of(options.init_checkpoint)
              if options.init_checkpoint else None)
  files = tasks.TaskFiles(
      tokenizer_dir=run_dir.path(model_dir, run_dir.TOKENIZER),
      init_tokenizer_dir=(run_dir.path(init_dir, run_dir.TOKENIZER)
                          if init_dir else None))
  return task_class(model=model, data=data, files=files,
                    batch_size=options.batch_size,
                    sequence_length=options.sequence_length,
                    seed=options.seed, log=log)


def train(*, model_dir, task="mlm", model=None, data=None, options=None,
          log=print):
  """Trains, evaluates before, during and after, and returns the summary.

  Args:
    model_dir: where checkpoints, summaries and the run's files go.
    task: a registered task's name (`thattn.tasks.names()`).
    model: a `tasks.ModelOptions`; without a preset, the task's default
      (or, with `options.init_checkpoint`, that run's model).
    data: a `tasks.DataOptions` (text tasks).
    options: a `options.TrainOptions`.
    log: called with each progress line.
  Returns:
    The summary dict, also written to `model_dir/summary.json`.
  """
  task_class = tasks.get(task)
  options = options or options_lib.TrainOptions()
  data = data or tasks.DataOptions()
  if options.backend != options_lib.KERAS:
    raise ValueError(f"backend={options.backend!r}: this trainer is the "
                     "Keras backend's; thattn.mtf.training trains in Mesh "
                     "TensorFlow.")
  model = resolve_model(task_class, model, options, log)
  guard = run_lock.StartGuard(model_dir)
  # Only the chief owns the model_dir (thattn.training.cluster): the other
  # workers of a cluster write to temporary folders, and take no lock.
  chief = cluster.is_chief()
  lock = run_lock.hold(model_dir, log=log) if chief else (
      contextlib.nullcontext())
  with lock, cluster.write_dir(model_dir) as write_dir:
    return _train_locked(model_dir=model_dir, write_dir=write_dir,
                         task_class=task_class, model=model, data=data,
                         options=options, log=log,
                         guard=guard if chief else None)


def _train_locked(*, model_dir, write_dir, task_class, model, data, options,
                  log, guard):
  tf_keras.utils.set_random_seed(options.seed)
  if options.deterministic:
    tf.config.experimental.enable_op_determinism()
  previous_policy = tf_keras.mixed_precision.global_policy()
  if options.mixed_precision != "off":
    tf_keras.mixed_precision.set_global_policy(
        f"mixed_{options.mixed_precision}")
  try:
    try:
      run = _start(model_dir=model_dir, write_dir=write_dir,
                   task_class=task_class, model=model, data=data,
                   options=options, log=log)
    except BaseException:
      if guard:
        guard.rollback()  # a failed start leaves the model_dir as it was
      raise
    if run.finished is not None:
      return run.finished
    return _train(write_dir, run, options, log)
  finally:
    tf_keras.mixed_precision.set_global_policy(previous_policy)


@dataclasses.dataclass
class _Run:
  """What `_start` sets up for the training loop."""
  task: object
  devices: object
  loop: object
  schedule: object
  manager: object
  initial_eval: object
  eval_data: object
  start_step: int
  finished: dict = None  # the summary of a run that had already finished


def run_config(task, model, data, options, write_dir):
  """run_config.json: every setting that changes what training computes.

  Settings that may change on resume are not in it: train_steps (to extend
  a run; the schedule's final decay follows the new total), evaluation,
  logging and checkpoint intervals, the devices and mesh (checkpoints do
  not depend on them), determinism, init_checkpoint and --tokenizer (used
  only by a run's first start; a resumed run keeps its own tokenizer).
  The backend is in it: a model_dir's checkpoints are one backend's.
  """
  config = dict(task.run_config(), train_files=data.train_files,
                eval_files=data.eval_files, on_overflow=data.on_overflow,
                batch_size=options.batch_size,
                seed=options.seed, optimizer=options.optimizer,
                learning_rate=options.peak_learning_rate,
                warmup_steps=options.warmup_steps,
                decay_fraction=options.decay_fraction,
                mixed_precision=options.mixed_precision,
                freeze_embeddings=model.freeze_embeddings,
                backend=options.backend)
  if tf.io.gfile.exists(run_dir.path(write_dir, run_dir.TOKENIZER)):
    config["tokenizer_dir"] = run_dir.TOKENIZER  # the task saved one
  return config


def _start(*, model_dir, write_dir, task_class, model, data, options, log):
  """Devices, task, run config, model, optimizer, restore: a `_Run`.

  The run's files are written to `write_dir` (model_dir, but for the
  non-chief workers of a cluster) and checkpoints restored from model_dir.
  """
  devices = make_devices(options, write_dir, log=log)
  tf.io.gfile.makedirs(write_dir)
  task = make_task(task_class, model_dir=write_dir, model=model, data=data,
                   options=options, log=log)
  run_dir.check_or_write_run_config(
      write_dir, run_config(task, model, data, options, write_dir))
  optimizer, schedule = devices.build(
      task, lambda **kwargs: optimizer_lib.make_optimizer(options, **kwargs))
  # Trainer state, outside the strategy: one copy, not one per replica.
  initial_eval = tf.Variable(float("nan"), trainable=False)
  checkpoint = tf.train.Checkpoint(
      optimizer=optimizer, initial_eval=initial_eval,
      **task.checkpoint_items())
  # Multi-client DTensor: every client writes its shards of one checkpoint,
  # in model_dir; otherwise each process saves to its write_dir.
  checkpoint_dir = model_dir if cluster.is_dtensor_client() else write_dir
  manager = tf.train.CheckpointManager(
      checkpoint, run_dir.path(checkpoint_dir, run_dir.CHECKPOINTS),
      max_to_keep=options.max_checkpoints)
  # A worker that is not the chief resumes from the chief's checkpoints.
  start_step = _restore(manager if checkpoint_dir == model_dir else
                        tf.train.CheckpointManager(
                            checkpoint,
                            run_dir.path(model_dir, run_dir.CHECKPOINTS),
                            max_to_keep=None),
                        task, options, log)
  finished = finished_summary(model_dir, start_step, options, log)
  loop = devices.train_loop(task, optimizer,
                            loss_scaling=options.mixed_precision == "float16")
  return _Run(task=task, devices=devices, loop=loop, schedule=schedule,
              manager=manager, initial_eval=initial_eval,
              eval_data=task.eval_dataset(options.eval_steps),
              start_step=start_step, finished=finished)


def finished_summary(model_dir, start_step, options, log):
  """The summary of a run that already reached train_steps, or None."""
  summary = run_dir.read_summary(model_dir)
  if (start_step < options.train_steps or summary is None or
      summary.get("steps") != start_step):
    return None
  log(f"Already finished: {model_dir} holds a run of {start_step} steps "
      f"(its summary: {run_dir.path(model_dir, run_dir.SUMMARY)}); pass a "
      "larger --train_steps to train on, or another --model_dir to start "
      "over.")
  return dict(summary, already_finished=True)


def _train(model_dir, run, options, log):
  """Trains from run.start_step, evaluates, writes and returns the summary."""
  task, loop = run.task, run.loop
  _describe(task, loop, options, run.devices, log)
  if math.isnan(float(run.initial_eval)):
    run.initial_eval.assign(devices_lib.evaluate(loop, run.eval_data))
  log(f"Held-out {task.eval_metric} before training: "
      f"{float(run.initial_eval):.4f}")
  writers = {name: tf.summary.create_file_writer(run_dir.path(model_dir,
                                                              name))
             for name in run_dir.SUMMARY_FOLDERS}
  started = time.time()
  steps_run, steady_rate = _run_steps(
      loop, task, options, run.schedule, run.manager, writers, run.eval_data,
      run.start_step, log)
  train_seconds = time.time() - started
  eval_after, extra = _final_eval(task, loop, run.devices, writers,
                                  run.eval_data, options)
  metric = task.eval_metric
  summary = {
      "task": task.name, "preset": task.model_options.preset,
      "steps": int(loop.optimizer.iterations.numpy()),
      "resumed_from_step": run.start_step, "steps_this_run": steps_run,
      "parameters": task.backbone.count_params(),
      f"held_out_{metric}_before": float(run.initial_eval),
      f"held_out_{metric}_after": eval_after,
      **{f"held_out_{name}": value for name, value in extra.items()},
      "train_seconds": round(train_seconds, 2),
      "tokens_per_second": round(steady_rate),
      "model_dir": model_dir, "checkpoint": run.manager.latest_checkpoint,
  }
  run_dir.write_json(run_dir.path(model_dir, run_dir.SUMMARY), summary)
  log(f"Held-out {metric} after training:  {eval_after:.4f} "
      f"(before: {float(run.initial_eval):.4f})" +
      "".join(f", {name} {value:.4g}" for name, value in extra.items()))
  return summary


def _restore(manager, task, options, log):
  """Restores the latest checkpoint, or the init checkpoint's backbone.

  Returns the step training starts from.
  """
  checkpoint = manager.checkpoint
  optimizer = checkpoint.optimizer
  if manager.latest_checkpoint:
    path = _restore_latest(manager, options.resume_from, log)
    log(f"Resumed from {path} at step {int(optimizer.iterations.numpy())}.")
  elif options.init_checkpoint:
    path = run_dir.find_checkpoint(options.init_checkpoint)
    tf.train.Checkpoint(backbone=task.backbone).restore(
        path).expect_partial().assert_existing_objects_matched()
    log(f"Backbone initialized from {path}.")
  start_step = int(optimizer.iterations.numpy())
  if start_step and start_step < options.train_steps:
    # Dropout's random state is not in the checkpoint (see the module).
    tf.random.set_seed(options.seed * 1_000_003 + start_step)
  return start_step


# What a damaged or foreign checkpoint raises while it is read or matched.
_RESTORE_ERRORS = (tf.errors.OpError, IndexError, ValueError, AssertionError,
                   KeyError)


def _restore_latest(manager, resume_from, log):
  """Restores the newest checkpoint, or with "latest_intact" the newest
  that restores; returns its path.

  A checkpoint that cannot be restored is a ValueError naming its files and
  the cause, and the newest intact one, if any. Nothing is deleted or
  overwritten: the user decides (--resume_from=latest_intact).
  """
  latest = manager.latest_checkpoint
  try:
    manager.checkpoint.restore(latest).assert_consumed()
    return latest
  except _RESTORE_ERRORS as error:
    cause = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
  intact = [path for path in reversed(manager.checkpoints[:-1])
            if _readable(path)]
  if resume_from == "latest_intact" and intact:
    manager.checkpoint.restore(intact[0]).assert_consumed()
    log(f"{latest} cannot be restored ({cause}); resuming from the newest "
        f"intact checkpoint, {intact[0]}, as --resume_from=latest_intact "
        "asks.")
    return intact[0]
  files = ", ".join(sorted(os.path.basename(f)
                           for f in tf.io.gfile.glob(latest + ".*")))
  hint = (f"The newest intact checkpoint is {intact[0]}: rerun with "
          "--resume_from=latest_intact to resume from it (the damaged one "
          "is replaced when training reaches its step again)."
          if intact else "No earlier checkpoint is intact; use a new "
          "--model_dir to start over.")
  raise ValueError(f"The latest checkpoint {latest} ({files}) cannot be "
                   f"restored: {cause}. {hint}")


def _readable(path):
  """Whether every tensor of the checkpoint at `path` can be read."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
    return True
  except _RESTORE_ERRORS:
    return False


def _describe(task, loop, options, devices, log):
  """Logs the model's and the trained parameters, optimizer and devices.

  The trained parameters can differ from the model's: frozen embeddings and
  weights the loss never reaches (BERT's pooler in masked LM) are left out.
  """
  trained = sum(v.shape.num_elements() for v in loop.variables)
  untrained = task.parameters()[0] - trained
  left_out = (f" ({untrained:,} frozen or unused by the loss)" if untrained
              else "")
  log(f"{task.describe()}; trained: {len(loop.variables)} tensors, "
      f"{trained:,} parameters{left_out}; {options.optimizer}, peak "
      f"learning rate {options.peak_learning_rate:g}; "
      f"{devices.describe()}.")


def _final_eval(task, loop, devices, writers, eval_data, options):
  """(held-out loss, task metrics) after training, also in the summaries."""
  eval_after = devices_lib.evaluate(loop, eval_data)
  extra = task.extra_eval_metrics(options.eval_steps, devices)
  step = int(loop.optimizer.iterations.numpy())
  progress_lib.write_eval(writers["eval"], step, task.eval_metric, eval_after,
                          extra)
  for writer in writers.values():
    writer.flush()
  return eval_after, extra


def _run_steps(loop, task, options, schedule, manager, writers, eval_data,
               start_step, log):
  """The training loop proper.

  Returns (steps run, tokens/s after the first step, which compiles).
  """
  remaining = options.train_steps - start_step
  if remaining <= 0:
    return 0, 0.0
  iterator = iter(loop.distribute(task.train_dataset(start_step)))
  progress = progress_lib.Progress(task, options, schedule, writers["train"],
                                   log)
  steady_start, steady_seconds = None, 0.0
  for index in range(remaining):
    progress.add(float(loop.train_step(iterator)))
    if index == 0:
      steady_start = time.time()
    step = int(loop.optimizer.iterations.numpy())
    last = step == options.train_steps
    # Saved before reported: a progress line says its step is kept.
    if step % options.checkpoint_every == 0 or last:
      manager.save(checkpoint_number=step)
    if step % options.log_every == 0 or last:
      progress.report(step)
    if options.eval_every and step % options.eval_every == 0 and not last:
      eval_started = time.time()
      value = devices_lib.evaluate(loop, eval_data)
      progress_lib.write_eval(writers["eval"], step, task.eval_metric, value,
                              {})
      log(f"step {step:>6}/{options.train_steps}  held-out "
          f"{task.eval_metric} {value:.4f}")
      progress.pause(time.time() - eval_started)  # tokens/s: training only
      steady_seconds -= time.time() - eval_started
  steady_seconds += time.time() - steady_start
  steady_rate = ((remaining - 1) * task.tokens_per_step /
                 max(steady_seconds, 1e-9)) if remaining > 1 else 0.0
  return remaining, steady_rate
