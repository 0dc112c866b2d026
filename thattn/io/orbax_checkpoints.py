"""Orbax checkpoints of a Keras 3 run's values.

A keras3 run's state is a flat {key: Keras 3 variable} (the weights, the
optimizer's slots and iteration, dropout's seed generators; the keys are
the run's own names, e.g. `weight.block_0.attention.query.kernel`).
`RunCheckpoints` saves it with Orbax's `CheckpointManager` into
`model_dir/checkpoints/<step>/`:

- `state/`: the values, each written by the processes that hold its
  shards (Orbax's `StandardSave` of JAX arrays; on a mesh nothing is
  gathered to one host), and
- `meta/`: a small JSON dict beside them (the held-out loss at step 0).

Orbax writes a step into a temporary folder and renames it when every
process has finished (`commit_success.txt` on file systems without atomic
rename), so a save cut short is never listed as a step; it keeps the last
`max_to_keep` steps and deletes only the step folders it wrote. Saving a
step that exists (a run resumed before it, because it could not be read)
replaces it.

Restoring is strict and explicit. Every saved value must find its variable
and every variable its value, with the same shape: otherwise a ValueError
names the keys (Keras's own `set_state_tree` skips what it cannot match,
keras#23251). Each value is read straight into its variable's current
sharding (a `jax.ShapeDtypeStruct` per value), so a checkpoint saved on
one mesh or number of processes restores onto another. On Keras 3's
TensorFlow and PyTorch backends the values are NumPy arrays, saved and
restored the same way.
"""

import gc
import os
import sys

import keras
import numpy as np

from thattn.io import checkpoint_reading

STATE = "state"
META = "meta"


def _orbax():
  try:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("Keras 3 checkpoints need orbax-checkpoint: pip "
                      "install 'thattn[jax]'") from None
  return ocp


def _on_jax():
  return keras.backend.backend() == "jax"


def _saved_value(variable, copy):
  """What Orbax writes for a variable: the JAX array (sharded as it is; a
  copy when `copy`), or elsewhere its NumPy value."""
  if _on_jax():
    if copy:
      import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
      return jnp.copy(variable.value)
    return variable.value
  return keras.ops.convert_to_numpy(variable.value)


def _target(variable):
  """The abstract value a restore reads into: the variable's shape, dtype
  and (on JAX) sharding."""
  dtype = keras.backend.standardize_dtype(variable.dtype)
  if _on_jax():
    import jax  # pylint: disable=g-import-not-at-top
    return jax.ShapeDtypeStruct(tuple(variable.shape), dtype,
                                sharding=variable.value.sharding)
  return np.zeros(tuple(variable.shape), dtype)


def _processes_options(ocp, alone):
  """Orbax's MultiprocessingOptions: every JAX process takes part, or with
  `alone` only this one."""
  if not (alone and _on_jax()):
    return ocp.options.MultiprocessingOptions()
  import jax  # pylint: disable=g-import-not-at-top
  index = jax.process_index()
  return ocp.options.MultiprocessingOptions(primary_host=index,
                                            active_processes={index})


class RunCheckpoints:
  """The Orbax checkpoints of one run's state; see the module.

  Args:
    directory: where the numbered step folders go (created if missing).
    max_to_keep: how many of the newest steps to keep.
    async_save: whether `save` returns while the files are still being
      written (they are finished by the next save, `wait` or `close`);
      it then writes copies of the values, which the caller may change
      at once.
    alone: whether this process reads the steps by itself (`read`), even
      where it is one of several JAX processes (a cluster's process 0
      exporting the run after training): Orbax then waits for no other.
  """

  def __init__(self, directory, *, max_to_keep=5, async_save=False,
               alone=False):
    ocp = _orbax()
    self.directory = os.path.abspath(directory)
    self.async_save = async_save
    self._ocp = ocp
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(
            # A reader alone reads steps that are there (Orbax creates a
            # folder only with every process).
            max_to_keep=max_to_keep, create=not alone,
            enable_async_checkpointing=async_save,
            multiprocessing_options=_processes_options(ocp, alone)),
        # Named here, so that a manager opened on saved steps reads their
        # metadata before anything is restored.
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       META: ocp.JsonCheckpointHandler()})

  def steps(self):
    """The finished steps, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self):
    return self._manager.latest_step()

  def path(self, step):
    return os.path.join(self.directory, str(step))

  def save(self, step, variables, meta=None):
    """Saves {key: variable} (and the JSON dict `meta`) as `step`; every
    process calls it. Returns the step's folder."""
    # Asynchronously, Orbax reads the arrays after `save` returns, while
    # the next steps run; a compiled step that donates its inputs' buffers
    # (keras3_steps does) would reuse them under it, so it writes copies.
    state = {key: _saved_value(variable, copy=self.async_save)
             for key, variable in variables.items()}
    ocp = self._ocp
    if step in self._manager.all_steps():
      # A step saved before, which a resumed run reaches again (it resumed
      # from an earlier step because this one could not be read).
      self._manager.delete(step)
    self._manager.save(step, args=ocp.args.Composite(**{
        STATE: ocp.args.StandardSave(state),
        META: ocp.args.JsonSave(dict(meta or {}))}), force=True)
    return self.path(step)

  def _metadata(self, step):
    tree = self._manager.item_metadata(step)[STATE]
    return getattr(tree, "tree", tree)

  def saved_shapes(self, step):
    """{key: shape} of what `step` holds, read from its metadata."""
    return {key: tuple(value.shape)
            for key, value in self._metadata(step).items()}

  def restore(self, step, variables):
    """Reads `step` into {key: variable}, each value in its variable's
    sharding; returns the saved `meta` dict. Checked first
    (`checkpoint_reading.check_matches`): nothing is assigned unless
    everything matches."""
    checkpoint_reading.check_matches(
        self.path(step), self.saved_shapes(step),
        {key: tuple(variable.shape) for key, variable in variables.items()})
    restored = self._restore(step, {key: _target(variable)
                                    for key, variable in variables.items()})
    for key, variable in variables.items():
      variable.assign(restored[STATE][key])
    return dict(restored[META] or {})

  def read(self, step):
    """(values, meta) of `step` as NumPy arrays in this process, for the
    tools that read a run whole (export, conversion, fine-tuning)."""
    restored = self._restore(step, {
        key: np.zeros(tuple(value.shape), value.dtype)
        for key, value in self._metadata(step).items()})
    return ({key: np.asarray(value) for key, value in
             restored[STATE].items()}, dict(restored[META] or {}))

  def _restore(self, step, targets):
    """Orbax's restore of `step` into `targets`; a step whose files cannot
    be read (damaged, cut short by a full disk) is a ValueError naming it
    and the cause, whatever the storage layer raised."""
    ocp = self._ocp
    try:
      return self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(targets),
          META: ocp.args.JsonRestore()}))
    except Exception as error:  # pylint: disable=broad-except
      # TensorStore appends its whole spec to the first line.
      first = str(error).splitlines()[0].split(" See full TensorStore")[0]
      cause = f"{type(error).__name__}: {first[:200]}"
    # Orbax reads the values in concurrent coroutines; when one fails, the
    # others' failures surface only as "Exception ignored in" tracebacks
    # when they are collected. The ValueError below says it once.
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    try:
      gc.collect()
    finally:
      sys.unraisablehook = hook
    raise ValueError(f"{self.path(step)} cannot be read: {cause}")

  def wait(self):
    """Blocks until an asynchronous save has finished."""
    self._manager.wait_until_finished()

  def close(self):
    self._manager.close()
