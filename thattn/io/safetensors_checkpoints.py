"""Safetensors checkpoints of a Keras 3 run's values, on TensorFlow and PyTorch.

A keras3 run's state is a flat {key: Keras 3 variable}, keyed as in
`thattn.io.orbax_checkpoints` (the weights under
`thattn.core.weight_names.checkpoint_key`, the optimizer's variables, the
random state). On JAX it is saved with Orbax, which needs JAX; on Keras 3's
TensorFlow and PyTorch backends `RunCheckpoints` saves it as one
safetensors file per step, a format NumPy alone reads (as every framework
does):

    model_dir/checkpoints/<step>/state.safetensors

The step's small JSON dict (the held-out loss at step 0) rides in the
file's own header metadata, under `meta`.

A step is written into a staging folder beside its target
(`thattn.io.staged_writes`, `.<step>.incomplete-<pid>`), synced to disk
and renamed into place, so a save cut short (killed, a full disk, a power
cut) is never listed as a step, and the next save removes what a killed one
left. The newest `max_to_keep` steps are kept; only step folders holding
this module's file are ever deleted. Saving a step that exists (a run
resumed before it, because it could not be read) replaces it.

Restoring is strict, as Orbax's is here: every saved value must find its
variable and every variable its value, with the same shape
(`checkpoint_reading.check_matches`), or nothing is assigned.

The steps are local files (os and a rename): a model_dir on another file
system (gs://) is for Orbax's steps on JAX, whose writes span file systems.

Importing this module imports no framework: the tools that read a run
whole read a step as NumPy arrays (`read`) with safetensors and NumPy only.
"""

import json
import os
import shutil

import numpy as np

from thattn.io import staged_writes

STATE_FILE = "state.safetensors"
_META = "meta"
_PROGRAM = "thattn-train (a keras3 checkpoint)"


def _safetensors():
  try:
    from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "keras3 checkpoints on TensorFlow and PyTorch need safetensors, "
        "which every Keras 3 extra brings: pip install -e '.[torch]' (or "
        "'.[tensorflow]', '.[jax]') in a thattn checkout, or pip install "
        "safetensors") from None
  return safetensors_numpy


def is_step(path):
  """Whether `path` is a step folder `RunCheckpoints` finished."""
  return os.path.isfile(os.path.join(path, STATE_FILE))


def read(path):
  """(values, meta) of the step folder `path`: {key: NumPy array} and its
  JSON dict.

  Raises:
    ValueError naming the step and the cause when its file cannot be read
    (damaged, cut short).
  """
  safetensors_numpy = _safetensors()
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  file_path = os.path.join(path, STATE_FILE)
  try:
    values = safetensors_numpy.load_file(file_path)
    with safe_open(file_path, framework="numpy") as opened:
      header = opened.metadata() or {}
    meta = json.loads(header.get(_META, "{}"))
  except Exception as error:  # pylint: disable=broad-except
    # safetensors raises its own SafetensorError (an Exception) for a
    # damaged header, OSError for a file it cannot open.
    raise ValueError(f"{path} cannot be read: {type(error).__name__}: "
                     f"{str(error).splitlines()[0][:200]}") from None
  return values, meta


def saved_shapes(path):
  """{key: shape} of what the step folder `path` holds, from its header."""
  _safetensors()  # without it, the ImportError that says how to install it
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(os.path.join(path, STATE_FILE), framework="numpy") as opened:
    return {key: tuple(opened.get_slice(key).get_shape())
            for key in opened.keys()}


class RunCheckpoints:
  """The safetensors checkpoints of one run's state; see the module. The
  methods are `orbax_checkpoints.RunCheckpoints`'s, so the keras3 backend
  saves through either.

  Args:
    directory: where the numbered step folders go (created if missing).
    max_to_keep: how many of the newest steps to keep.
  """

  def __init__(self, directory, *, max_to_keep=5):
    if "://" in str(directory):
      raise ValueError(
          f"{directory}: a keras3 run on TensorFlow or PyTorch keeps its "
          "checkpoints as local files (safetensors); expected a local or "
          "mounted folder. Keras 3 on JAX (KERAS_BACKEND=jax) saves Orbax "
          "checkpoints to other file systems.")
    self.directory = os.path.abspath(directory)
    self.max_to_keep = max_to_keep
    os.makedirs(self.directory, exist_ok=True)

  def steps(self):
    """The finished steps, oldest first."""
    return sorted(int(name) for name in os.listdir(self.directory)
                  if name.isdigit() and is_step(self.path(int(name))))

  def latest_step(self):
    steps = self.steps()
    return steps[-1] if steps else None

  def path(self, step):
    return os.path.join(self.directory, str(step))

  def save(self, step, variables, meta=None):
    """Saves {key: Keras 3 variable} (and the JSON dict `meta`) as `step`;
    returns the step's folder. Older steps beyond `max_to_keep` go."""
    import keras  # pylint: disable=g-import-not-at-top
    # order="C": safetensors writes C-ordered buffers (and, unlike
    # np.ascontiguousarray, a 0-d value such as the iteration stays 0-d).
    values = {key: np.asarray(keras.ops.convert_to_numpy(variable.value),
                              order="C")
              for key, variable in variables.items()}
    target = self.path(step)
    with staged_writes.staged(target, program=_PROGRAM) as staging:
      state_path = os.path.join(staging, STATE_FILE)
      _safetensors().save_file(
          values, state_path, metadata={_META: json.dumps(dict(meta or {}))})
      # On disk before the rename makes it a step, so that after a power
      # cut a step folder holds its whole file or is not there.
      with open(state_path, "rb") as written:
        os.fsync(written.fileno())
      staged_writes.unmark(staging)
      if is_step(target):
        # A step saved before, which a resumed run reaches again (it
        # resumed from an earlier step because this one could not be read).
        shutil.rmtree(target)
      os.rename(staging, target)
    if self.max_to_keep:  # None: keep every step, as Orbax's manager does
      for old in self.steps()[:-self.max_to_keep]:
        shutil.rmtree(self.path(old))
    return target

  def saved_shapes(self, step):
    """{key: shape} of what `step` holds, read from its header."""
    return saved_shapes(self.path(step))

  def restore(self, step, variables):
    """Reads `step` into {key: variable}; returns the saved `meta` dict.
    Checked first (`checkpoint_reading.check_matches`): nothing is
    assigned unless everything matches."""
    # Here, not at the top: checkpoint_reading imports this module.
    from thattn.io import checkpoint_reading  # pylint: disable=g-import-not-at-top
    values, meta = read(self.path(step))
    checkpoint_reading.check_matches(
        self.path(step), {key: value.shape for key, value in values.items()},
        {key: tuple(variable.shape) for key, variable in variables.items()})
    for key, variable in variables.items():
      variable.assign(values[key])
    return meta

  def read(self, step):
    """(values, meta) of `step` as NumPy arrays, for the tools that read a
    run whole (export, conversion, fine-tuning)."""
    return read(self.path(step))

  def close(self):
    pass  # every save is finished when `save` returns
