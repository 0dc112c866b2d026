"""What a run starts from: its model, its task, its run_config.json.

Shared by every backend through the driver (`thattn.training.run`): the
model options resolved before anything is read or written (the task's
default, or the --init_checkpoint run's), the task made with the run's
files, and the settings a rerun must match.
"""

import dataclasses

import tensorflow as tf

from thattn import models
from thattn.io import run_dir
from thattn import tasks


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
  modules = tuple(config.get("attention_modules", ()))
  return dataclasses.replace(
      model, preset=config["preset"],
      overrides=dict(inherited, **model.overrides),
      attention_modules=modules + tuple(
          name for name in model.attention_modules if name not in modules))


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
  default. Raises ValueError for a model the task cannot build, one
  with fewer learned positions than the sequence length, or an init
  checkpoint that is a --backend=mtf run (`run_dir.check_init_checkpoint`).
  """
  if options.init_checkpoint:  # an mtf run: named, not an AssertionError
    run_dir.check_init_checkpoint(options.init_checkpoint)
  model = model or tasks.ModelOptions(preset=None)
  if model.preset is None and task_class.default_preset is not None:
    model = (_inherit_model(model, options.init_checkpoint, log)
             if options.init_checkpoint else default_model(task_class, model))
  task_class.check_model(model)
  if options.init_checkpoint:
    _check_positions(options.init_checkpoint, options.sequence_length)
  return model


def make_task(task_class, *, model_dir, model, data, options, log,
              tokenizer_dir=None):
  """One run of `task_class`, with its files in model_dir; `tokenizer_dir`:
  a tokenizer it must take (a cluster's chief's), else the usual one."""
  init_dir = (run_dir.run_dir_of(options.init_checkpoint)
              if options.init_checkpoint else None)
  if tokenizer_dir is None and init_dir:
    tokenizer_dir = run_dir.path(init_dir, run_dir.TOKENIZER)
  files = tasks.TaskFiles(
      tokenizer_dir=run_dir.path(model_dir, run_dir.TOKENIZER),
      init_tokenizer_dir=tokenizer_dir)
  return task_class(model=model, data=data, files=files,
                    batch_size=options.batch_size,
                    sequence_length=options.sequence_length,
                    seed=options.seed, log=log)


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
