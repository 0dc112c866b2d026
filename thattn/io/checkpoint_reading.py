"""Reading a run's checkpoint into tf_keras objects, whichever wrote it.

A `--backend=keras` run (and a conversion) saves `tf.train.Checkpoint`s of
its tf_keras objects: `checkpoints/ckpt-N.*`. A `--backend=keras3` run
saves step folders of its Keras 3 values, `checkpoints/N/`, each weight
under `thattn.core.weight_names.checkpoint_key` of its name: Orbax steps
on JAX (`thattn.io.orbax_checkpoints`), one safetensors file on
TensorFlow and PyTorch (`thattn.io.safetensors_checkpoints`). The tools
that read a run whole (`thattn-export`, `thattn.models.load`,
`thattn-convert --to=mtf`, `--init_checkpoint`) read any of them through
`latest` and `restore`: a step folder is read into this process as NumPy
arrays (`read_step`) and each tf_keras weight takes its value by name at
that moment.

Importing this module imports no framework: finding checkpoints and
reading a step folder (Orbax's on JAX, safetensors' with NumPy) need none,
so the Keras 3 models load a keras3 run without TensorFlow
(`thattn.keras3.models.load`); a `tf.train.Checkpoint` needs TensorFlow,
loaded when one is read. (The keras3 runs of earlier thattn versions on
TensorFlow and PyTorch saved `tf.train` checkpoints of a tf_keras twin;
they are read as a Keras run's.)
"""

import os

from etils import epath

from thattn.core import requirements
from thattn.core import weight_names
from thattn.io import safetensors_checkpoints

with requirements.lazy_imports("reading a tf.train checkpoint",
                               ("tensorflow",)):
  import tensorflow as tf

# What Orbax writes into a step's folder when the step is final.
ORBAX_MARKER = "_CHECKPOINT_METADATA"
# The file tf.train.CheckpointManager keeps beside its checkpoints, naming
# the latest.
TF_CHECKPOINT_STATE = "checkpoint"


def is_orbax_step(path):
  """Whether `path` is a finished Orbax step folder."""
  return (epath.Path(path).is_dir() and
          epath.Path(path, ORBAX_MARKER).exists())


def is_step(path):
  """Whether `path` is a finished step folder of a keras3 run: Orbax's or
  safetensors' (its values keyed by name, `read_step`)."""
  return is_orbax_step(path) or safetensors_checkpoints.is_step(path)


def steps(folder):
  """The finished step folders of `folder` (`is_step`), oldest first."""
  if not epath.Path(folder).is_dir():
    return []
  numbers = sorted(int(entry.name) for entry in epath.Path(folder).iterdir()
                   if entry.name.isdigit() and is_step(entry))
  return [os.path.join(folder, str(number)) for number in numbers]


def latest(folder):
  """The newest checkpoint in `folder`: a step folder (`is_step`) or a
  `tf.train.Checkpoint` prefix; None if it holds neither."""
  found = steps(folder)
  if found:
    return found[-1]
  if not epath.Path(folder, TF_CHECKPOINT_STATE).exists():
    return None  # no tf.train checkpoint either: TensorFlow not needed
  return tf.train.latest_checkpoint(folder)


def step_of(checkpoint):
  """The step a checkpoint path names (`.../ckpt-12`, `.../12`), or 0."""
  tail = os.path.basename(checkpoint.rstrip("/")).rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else 0


def read_values(checkpoint):
  """{name: NumPy array} of every value a checkpoint holds: a step
  folder's keys, or a `tf.train.Checkpoint`'s variable names."""
  if is_step(checkpoint):
    return read_step(checkpoint)
  reader = tf.train.load_checkpoint(checkpoint)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def read_step(path):
  """{key: NumPy array} of a step folder (`is_step`), in this process.

  Raises:
    ValueError naming the step and the cause when it cannot be read.
  """
  if safetensors_checkpoints.is_step(path):
    return safetensors_checkpoints.read(path)[0]
  from thattn.io import orbax_checkpoints  # pylint: disable=g-import-not-at-top
  checkpoints = orbax_checkpoints.RunCheckpoints(os.path.dirname(path),
                                                 alone=True)
  try:
    return checkpoints.read(step_of(path))[0]
  finally:
    checkpoints.close()


def restore(checkpoint, **objects):
  """Restores the tf_keras `objects` (backbone=, head=) from `checkpoint`.

  Raises:
    ValueError (a step folder) naming the weights the checkpoint has no
    value for;
    TensorFlow's errors for a `tf.train.Checkpoint` that does not match.
  """
  if not is_step(checkpoint):
    tf.train.Checkpoint(**objects).restore(
        checkpoint).expect_partial().assert_existing_objects_matched()
    return
  weights = [weight for obj in objects.values() for weight in obj.weights]
  assign_by_name(checkpoint, read_step(checkpoint), weights,
                 [weight.name for weight in weights], f"{sorted(objects)}")


def assign_by_name(checkpoint, values, weights, names, owner):
  """Gives each of `weights` its value in `values` ({checkpoint key: NumPy
  array}, `read_values`), found by `weight_names.checkpoint_key` of its
  name in `names` (a tf_keras weight's `name`, a Keras 3 weight's `path`).

  Raises:
    ValueError naming the weights of `owner` that `checkpoint` has no
    value for, or whose shapes differ.
  """
  keys = [weight_names.checkpoint_key(name) for name in names]
  missing = sorted(key for key in keys if key not in values)
  if missing:
    raise ValueError(f"{checkpoint} has no value for {missing[:6]}"
                     f"{' ...' if len(missing) > 6 else ''} of {owner}.")
  for weight, name, key in zip(weights, names, keys):
    if tuple(weight.shape) != tuple(values[key].shape):
      raise ValueError(f"{checkpoint}: {key} is {values[key].shape}, the "
                       f"weight {name} {tuple(weight.shape)}.")
    weight.assign(values[key])


def check_matches(checkpoint, saved, wanted):
  """ValueError naming every key of `saved` ({key: shape} of what
  `checkpoint` holds) without a variable in `wanted` ({key: shape} of a
  run's state), every variable without a saved value, and every shape
  that differs; a run restores its state only when all match."""
  saved = {key: tuple(shape) for key, shape in saved.items()}
  wanted = {key: tuple(shape) for key, shape in wanted.items()}
  problems = []
  unused = sorted(set(saved) - set(wanted))
  missing = sorted(set(wanted) - set(saved))
  if unused:
    problems.append(f"saved values no variable takes: {unused}")
  if missing:
    problems.append(f"variables the checkpoint has no value for: {missing}")
  problems += [f"{key}: saved {saved[key]}, variable {wanted[key]}"
               for key in sorted(set(saved) & set(wanted))
               if saved[key] != wanted[key]]
  if problems:
    raise ValueError(f"{checkpoint} does not match this run's state "
                     "(nothing was restored): " + "; ".join(problems))
