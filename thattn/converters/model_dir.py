"""Writing a converted model as a thattn model_dir, whole or not at all.

Every conversion ends here (Mesh TensorFlow's too): `run_config.json` (a
preset and overrides that rebuild the backbone, the task, where it came
from), `checkpoints/` (the backbone, as `thattn.models.load`,
`thattn-train --init_checkpoint` and `thattn-export` restore it) and, given
one, `tokenizer/`. It is written into a hidden staging folder beside the
output and renamed into place at the end: a failed conversion leaves
nothing at the output, and an output that exists and is not empty is never
touched.
"""

import contextlib
import dataclasses
import json
import os

import tensorflow as tf

from thattn import models
from thattn.io import run_dir
from thattn.io import staged_writes

# run_config.json's record of the source.
CONVERTED_FROM = "converted_from"


def check_output(target, what):
  """Refuses an output that exists (a file, or a folder not empty) or whose
  parent cannot be written, before anything is read or written."""
  target = os.path.abspath(target)
  if os.path.isfile(target):
    raise ValueError(f"{what}={target!r} is a file; expected a new folder "
                     "(nothing was written).")
  if os.path.isdir(target) and os.listdir(target):
    raise ValueError(f"{target} exists and is not empty; choose a new "
                     f"{what} (nothing was written).")
  existing = os.path.dirname(target)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not (os.path.isdir(existing) and
          os.access(existing, os.W_OK | os.X_OK)):
    raise ValueError(f"{what}={target!r}: cannot write into {existing} "
                     "(permission denied, or not a folder); choose a folder "
                     "you can write to (nothing was written).")


@contextlib.contextmanager
def staged(target, what, log=print):
  """Yields a staging folder that becomes `target` when the block succeeds.

  `thattn.io.staged_writes`: the folder is `.<name>.incomplete-<pid>` beside target,
  and what killed conversions into target left there is removed first.
  """
  check_output(target, what)
  target = os.path.abspath(target)
  with staged_writes.staged(target, program="thattn-convert", log=log) as folder:
    yield folder
    staged_writes.unmark(folder)
    if os.path.exists(target):
      os.rmdir(target)  # empty, checked above; fails if a writer came since
    os.rename(folder, target)


def overrides(config):
  """Every field of a model config (BertConfig, T5Config) as JSON-ready
  overrides of its preset."""
  result = {}
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if isinstance(value, models.AttentionConfig):
      value = dataclasses.asdict(value)
    elif isinstance(value, tuple) and value and isinstance(
        value[0], models.AttentionConfig):
      value = [dataclasses.asdict(item) for item in value]
    result[field.name] = value
  return json.loads(json.dumps(result))  # tuples -> lists, as on disk


def write(model_dir, *, keras_model, step, tokenizer, run_config, log=print):
  """The thattn model_dir, staged and renamed into place."""
  with staged(model_dir, "--model_dir", log) as folder:
    # CheckpointManager records relative paths in its `checkpoint` state
    # file, so tf.train.latest_checkpoint still resolves after the rename.
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(backbone=keras_model),
        run_dir.path(folder, run_dir.CHECKPOINTS), max_to_keep=1)
    manager.save(checkpoint_number=step)
    if tokenizer is not None:
      tokenizer.save(run_dir.path(folder, run_dir.TOKENIZER))
    run_dir.write_json(run_dir.path(folder, run_dir.RUN_CONFIG), run_config,
                       sort_keys=True)
