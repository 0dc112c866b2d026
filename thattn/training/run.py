"""The run driver: one training loop for every backend.

`train(model_dir=..., task=..., model=..., data=..., options=...)` trains
one registered task (`thattn.tasks`) with the paper's recipe by default:
Adafactor, an inverse-square-root schedule whose last 10% decays linearly
to zero, and no dropout in pretraining. `options.backend` names the
backend (`thattn.training.backend`: the protocol, in one place): tf-keras
on any strategy or a DTensor mesh (`thattn.training.keras_backend`), or
Mesh TensorFlow (`thattn.mtf.training`). Everything else is done here,
once, for both:

- the run lock and the start guard (a failed start leaves the model_dir as
  it was); only the chief of a cluster owns the model_dir;
- run_config.json, and the refusal of a rerun with other settings;
- one resume policy: the latest checkpoint, or with
  `resume_from="latest_intact"` the newest one that restores; a damaged
  one is a ValueError naming its files, the cause and the newest intact
  one; without a checkpoint, `init_checkpoint`'s backbone;
- the schedule, the step loop, evaluation every `eval_every` steps,
  progress lines and TensorBoard summaries (`thattn.training.progress`);
- the task's extra metrics after training, and summary.json (its schema is
  in docs/training.md);
- a stop asked for by SIGTERM where the backend hears one
  (`backend.preempted()`, keras3): saved at the step boundary, then
  `Preempted`, which thattn-train reports and exits with 143.

What a run leaves in `model_dir` is listed in `thattn.io.run_dir`.

Exact resume. Batches are a pure function of (seed, step)
(`thattn.data.batches`), so the step is the data iterator's whole state,
and it is saved with every checkpoint. With `deterministic=True`
(TensorFlow's op determinism), a run killed at any point and rerun ends
with the same weights and loss as an uninterrupted run, bit for bit, as long
as dropout is off (the pretraining default). Departure: tf-keras keeps
dropout's random state out of checkpoints, so with dropout on, a resumed run
reseeds dropout from (seed, resume step): deterministic, but not the masks
the uninterrupted run drew.
"""

import contextlib
import math
import os
import random
import time

from thattn.core import requirements

# Before the first TensorFlow import: names the pip extra if it is missing.
requirements.require("thattn.training.run", requirements.TENSORFLOW)

# pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np
import tensorflow as tf

from thattn.io import run_dir
from thattn import tasks
from thattn.io import write_failures
from thattn.training import backend as backend_lib
from thattn.io import checkpoint_reading
from thattn.training import cluster
from thattn.training import options as options_lib
from thattn.training import progress as progress_lib
from thattn.training import run_lock
from thattn.training import run_setup

# What a damaged or foreign checkpoint raises while it is read or matched.
_RESTORE_ERRORS = (tf.errors.OpError, IndexError, ValueError, AssertionError,
                   KeyError)


def train(*, model_dir, task="mlm", model=None, data=None, options=None,
          log=print):
  """Trains, evaluates before, during and after, and returns the summary.

  Args:
    model_dir: where checkpoints, summaries and the run's files go.
    task: a registered task's name (`thattn.tasks.names()`).
    model: a `tasks.ModelOptions`; without a preset, the task's default
      (or, with `options.init_checkpoint`, that run's model).
    data: a `tasks.DataOptions` (text tasks).
    options: a `options.TrainOptions`; `options.backend` picks the backend.
    log: called with each progress line.
  Returns:
    The summary dict, also written to `model_dir/summary.json` (or, for a
    process that only served another's mtf run, {"served", "model_dir"});
    a process of a cluster that is not its chief adds "chief": False.
  """
  task_class = tasks.get(task)
  options = options or options_lib.TrainOptions()
  data = data or tasks.DataOptions()
  backend_class = backend_lib.get(options.backend)
  if options.deterministic:
    tf.config.experimental.enable_op_determinism()
  served = backend_class.serve(model_dir, options, log)
  if served is not None:
    return served
  model = run_setup.resolve_model(task_class, model, options, log)
  backend_class.check_task(task_class, model)
  guard = run_lock.StartGuard(model_dir)
  # Every other file the run writes (run_config.json, the tokenizer, the
  # summaries, summary.json): a full or read-only disk is named in one
  # line; the checkpoints have their own, more precise message (_save).
  refused = write_failures.refused_writes(
      f"into the model_dir {model_dir}",
      then="Its checkpoints are as they were (a rerun resumes from the "
           "last complete one): make room (or make it writable) and rerun "
           "the same command.", folder=model_dir)
  with refused, backend_class.processes(model_dir, options, log) as place:
    # Only the chief owns the model_dir (thattn.training.cluster): the
    # other processes of a cluster write to temporary folders, and take no
    # lock.
    chief = cluster.is_chief() if place.chief is None else place.chief
    lock = run_lock.hold(model_dir, log=log) if chief else (
        contextlib.nullcontext())
    with lock:
      summary = _train_locked(
          model_dir=model_dir, place=place, backend_class=backend_class,
          task_class=task_class, model=model, data=data, options=options,
          log=log, guard=guard if chief else None)
  return summary if chief else dict(summary, chief=False)


def _train_locked(*, model_dir, place, backend_class, task_class, model,
                  data, options, log, guard):
  # Python's, NumPy's and TensorFlow's seeds, on every backend (its
  # framework's own in `framework_scope`; the initial weights are drawn from
  # the seed by name, apart).
  random.seed(options.seed)
  np.random.seed(options.seed)
  tf.random.set_seed(options.seed)
  with backend_class.framework_scope(options):
    with contextlib.ExitStack() as stack:
      try:
        backend = backend_class(model_dir=model_dir, place=place,
                                options=options, log=log)
        stack.callback(backend.close)
        task, start_step = _start(backend, task_class, model, data, options,
                                  log)
        finished = run_setup.finished_summary(model_dir, start_step, options,
                                              log)
      except BaseException:
        if guard:
          guard.rollback()  # a failed start leaves the model_dir as it was
        raise
      if finished is not None:
        return finished
      return _train(backend, task, options, start_step, log)


def _start(backend, task_class, model, data, options, log):
  """The task, its run config, the model, restored: (task, start step).

  The run's files are written to the backend's `write_dir` (model_dir, but
  for the non-chief workers of a cluster).
  """
  write_dir = backend.write_dir
  tf.io.gfile.makedirs(write_dir)
  task = backend.make_task(lambda tokenizer_dir: run_setup.make_task(
      task_class, model_dir=write_dir, model=model, data=data,
      options=options, log=log, tokenizer_dir=tokenizer_dir))
  config = run_setup.run_config(task, model, data, options, write_dir)
  backend.agree(config,
                lambda: run_dir.check_or_write_run_config(write_dir, config))
  backend.build(task)
  return task, _resume(backend, task, options, log)


def _resume(backend, task, options, log):
  """Restores the latest checkpoint, or starts from the task's weights
  (with `init_checkpoint`'s backbone); returns the step training starts
  from."""
  paths = backend.checkpoints()
  if paths:
    path = _restore_latest(backend, paths, options.resume_from, log)
    log(f"Resumed from {path} at step {backend.step}.")
  else:
    path = (run_dir.find_checkpoint(options.init_checkpoint)
            if options.init_checkpoint else None)
    backend.initialize(init_checkpoint=path)
    if path:
      log(f"Backbone initialized from {path}.")
  start_step = backend.step
  if start_step and start_step < options.train_steps:
    # Dropout's random state is not in the checkpoint (see the module).
    tf.random.set_seed(options.seed * 1_000_003 + start_step)
  return start_step


def _restore_latest(backend, paths, resume_from, log):
  """Restores the newest checkpoint, or with "latest_intact" the newest
  that restores; returns its path.

  A checkpoint that cannot be restored is a ValueError naming its files and
  the cause, and the newest intact one, if any. Nothing is deleted or
  overwritten: the user decides (--resume_from=latest_intact).
  """
  latest = paths[-1]
  try:
    backend.restore(latest)
    return latest
  except _RESTORE_ERRORS as error:
    cause = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
  intact = [path for path in reversed(paths[:-1]) if _readable(path)]
  if resume_from == "latest_intact" and intact:
    backend.restore(intact[0])
    log(f"{latest} cannot be restored ({cause}); resuming from the newest "
        f"intact checkpoint, {intact[0]}, as --resume_from=latest_intact "
        "asks.")
    return intact[0]
  files = ", ".join(_checkpoint_files(latest))
  hint = (f"The newest intact checkpoint is {intact[0]}: rerun with "
          "--resume_from=latest_intact to resume from it (the damaged one "
          "is replaced when training reaches its step again)."
          if intact else "No earlier checkpoint is intact; use a new "
          "--model_dir to start over.")
  raise ValueError(f"The latest checkpoint {latest} ({files}) cannot be "
                   f"restored: {cause}. {hint}")


def _checkpoint_files(path):
  """The names of a checkpoint's files, for a message: a prefix's
  `ckpt-N.*`, a step folder's entries."""
  if checkpoint_reading.is_step(path):
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path))
  return sorted(os.path.basename(f) for f in tf.io.gfile.glob(path + ".*"))


def _readable(path):
  """Whether every tensor of the checkpoint at `path` can be read."""
  if checkpoint_reading.is_step(path):
    try:
      checkpoint_reading.read_step(path)
      return True
    except ValueError:  # RunCheckpoints names a step it cannot read so
      return False
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
    return True
  except _RESTORE_ERRORS:
    return False


def _train(backend, task, options, start_step, log):
  """Trains from start_step, evaluates, writes and returns the summary."""
  write_dir = backend.write_dir
  log(backend.describe())
  eval_data = task.eval_dataset(options.eval_steps)
  if math.isnan(backend.initial_eval):
    backend.set_initial_eval(backend.evaluate(eval_data))
  before = backend.initial_eval
  metric = task.eval_metric
  log(f"Held-out {metric} before training: {before:.4f}")
  writers = {name: tf.summary.create_file_writer(run_dir.path(write_dir,
                                                              name))
             for name in run_dir.SUMMARY_FOLDERS}
  started = time.time()
  steps_run, steady_rate = _run_steps(backend, task, options, writers,
                                      eval_data, start_step, log)
  train_seconds = time.time() - started
  after, extra = _final_eval(backend, task, writers, eval_data, options)
  summary = {
      "task": task.name, "preset": task.model_options.preset,
      "backend": options.backend, "steps": backend.step,
      "resumed_from_step": start_step, "steps_this_run": steps_run,
      "parameters": backend.parameters()[1],
      f"held_out_{metric}_before": before,
      f"held_out_{metric}_after": after,
      **{f"held_out_{name}": value for name, value in extra.items()},
      "train_seconds": round(train_seconds, 2),
      "tokens_per_second": round(steady_rate),
      "model_dir": write_dir, "checkpoint": backend.latest_checkpoint(),
  }
  run_dir.write_json(run_dir.path(write_dir, run_dir.SUMMARY), summary)
  log(f"Held-out {metric} after training:  {after:.4f} "
      f"(before: {before:.4f})" +
      "".join(f", {name} {value:.4g}" for name, value in extra.items()))
  return summary


def _final_eval(backend, task, writers, eval_data, options):
  """(held-out loss, task metrics) after training, also in the summaries."""
  after = backend.evaluate(eval_data)
  extra = backend.task_metrics(options.eval_steps)
  progress_lib.write_eval(writers["eval"], backend.step, task.eval_metric,
                          after, extra)
  for writer in writers.values():
    writer.flush()
  return after, extra


def _run_steps(backend, task, options, writers, eval_data, start_step, log):
  """The training loop proper.

  Returns (steps run, tokens/s after the first step, which compiles).
  """
  remaining = options.train_steps - start_step
  if remaining <= 0:
    return 0, 0.0
  schedule = backend.schedule(options)
  batches = backend.train_batches(start_step)
  progress = progress_lib.Progress(task, options, schedule, writers["train"],
                                   log)
  steady_start, paused = None, 0.0
  for index in range(remaining):
    learning_rate = (float(schedule(start_step + index))
                     if backend.feeds_learning_rate else None)
    progress.add(backend.train_step(batches, learning_rate))
    if index == 0:
      steady_start = time.time()
    step = backend.step
    last = step == options.train_steps
    preempted = backend.preempted()
    # Saved before reported: a progress line says its step is kept.
    if step % options.checkpoint_every == 0 or last or preempted:
      path = _save(backend)
    if step % options.log_every == 0 or last or preempted:
      progress.report(step)
    if preempted and not last:
      raise Preempted(
          f"Stopped by SIGTERM (a preemption) after step {step} of "
          f"{options.train_steps}, saved in {path}; rerun the same command "
          "to resume from it.")
    if options.eval_every and step % options.eval_every == 0 and not last:
      eval_started = time.time()
      value = backend.evaluate(eval_data)
      progress_lib.write_eval(writers["eval"], step, task.eval_metric, value,
                              {})
      log(f"step {step:>6}/{options.train_steps}  held-out "
          f"{task.eval_metric} {value:.4f}")
      progress.pause(time.time() - eval_started)  # tokens/s: training only
      paused += time.time() - eval_started
  if remaining <= 1:
    return remaining, 0.0
  seconds = max(time.time() - steady_start - paused, 1e-9)
  return remaining, (remaining - 1) * task.tokens_per_step / seconds


class Preempted(Exception):
  """The run saved and stopped at a step boundary, as a SIGTERM asked."""


def _save(backend):
  """backend.save(), or a WriteFailed naming the folder and the cause when
  the machine refuses the write (a full or read-only disk): the run stops
  rather than train on unsaved, and the save's unfinished files go."""
  try:
    return backend.save()
  except Exception as error:  # pylint: disable=broad-except
    failure = write_failures.checkpoint_not_written(
        error, directory=backend.checkpoint_directory(), step=backend.step,
        latest=backend.latest_checkpoint(),
        rerun="make room (or make the folder writable) and rerun the same "
              "command to resume from it")
    if failure is None:
      raise
    raise failure from None

