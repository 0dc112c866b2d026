"""Saving a keras3 run at BERT-base size: Orbax, safetensors, the twin path.

What a keras3 run saves is its weights, its optimizer's slots and a few
scalars. Until issue 54, `--backend=keras3` saved them by copying every
Keras 3 value to the host (`keras.ops.convert_to_numpy`) into a tf_keras
twin's TensorFlow variables and writing those with
`tf.train.CheckpointManager`; the replacement writes the JAX arrays with
Orbax (`thattn.io.orbax_checkpoints.RunCheckpoints`), synchronously
or asynchronously, and on Keras 3's TensorFlow and PyTorch backends (where
Orbax cannot run) one safetensors file of the host copies
(`thattn.io.safetensors_checkpoints.RunCheckpoints`). This measures, in
one process, with rounds alternating:

- the twin path's save (the host copy, the assign into tf.Variables of the
  same shapes, `CheckpointManager.save`) and its restore (read, then
  assign back into the Keras 3 variables);
- Orbax's save, synchronous (until the files are final), and asynchronous
  (until `save` returns: the time a training step waits; then until the
  files are final), and its restore into the variables' shardings;
- the safetensors save (the host copy, one file written in a staging
  folder and renamed into place) and its restore (read, checked, assigned);
- each checkpoint's size on disk;
- whether the asynchronous write slows the compute it overlaps: a save
  followed by 4 forward passes of the model (batch 8 x 128), until both
  are done, synchronous against asynchronous, beside the passes alone.

The state: the Keras 3 BERT-base (`bert_base`, 110M weights) with thattn's
Adafactor slots built (factored second moments: small), on JAX's CPU.

    python benchmarks/keras3_checkpoints.py            # ~3 minutes, 2 cores
    python benchmarks/keras3_checkpoints.py --quick    # bert_tiny, seconds

Must run in a fresh Python (it sets KERAS_BACKEND=jax before Keras loads).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")


def _state(preset):
  """{key: Keras 3 variable}: the model's weights and Adafactor's slots."""
  from thattn.keras3 import models  # pylint: disable=g-import-not-at-top
  from thattn.keras3 import optimizers  # pylint: disable=g-import-not-at-top
  model = models.create_model(preset)
  optimizer = optimizers.Adafactor(1e-3)
  optimizer.build(model.trainable_variables)
  state = {f"weight.{i:04d}": v for i, v in enumerate(model.weights)}
  state.update({f"optimizer.{i:04d}": v
                for i, v in enumerate(optimizer.variables)})
  return state, model


def _work(model, steps):
  """`steps` forward passes of the model on a batch of 8 x 128 (or the
  model's longest; compiled once): compute that a save's background write
  competes with."""
  import jax  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  length = min(128, model.get_layer("position_embedding").max_length)
  batch = {"input_word_ids": rng.integers(1, 100, (8, length)).astype(
      "int32"), "input_mask": np.ones((8, length), "int32"),
           "input_type_ids": np.zeros((8, length), "int32")}
  values = ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables])
  forward = jax.jit(lambda values, inputs: model.stateless_call(
      *values, inputs)[0]["sequence_output"])
  jax.block_until_ready(forward(values, batch))

  def run():
    for _ in range(steps):
      jax.block_until_ready(forward(values, batch))
  return run


class TwinPath:
  """The save being replaced: host copies into tf.Variables, then
  tf.train.CheckpointManager."""

  def __init__(self, state, directory):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    import keras  # pylint: disable=g-import-not-at-top
    self.tf, self.keras, self.state = tf, keras, state
    self.twin = {key: tf.Variable(keras.ops.convert_to_numpy(v.value),
                                  trainable=False)
                 for key, v in state.items()}
    module = tf.Module()
    module.by_key = self.twin
    self.manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(state=module), directory, max_to_keep=1)

  def save(self, step):
    for key, variable in self.state.items():
      self.twin[key].assign(self.keras.ops.convert_to_numpy(variable.value))
    return self.manager.save(checkpoint_number=step)

  def restore(self, path):
    self.manager.checkpoint.restore(path).assert_consumed()
    for key, variable in self.state.items():
      variable.assign(self.twin[key].numpy())


def _size(path):
  return int(subprocess.run(["du", "-sb", path], capture_output=True,
                            text=True, check=True).stdout.split()[0])


def _timed(function):
  start = time.perf_counter()
  result = function()
  return time.perf_counter() - start, result


def _round(state, root, step, work):
  """One round's times (seconds) and sizes (bytes)."""
  from thattn.io import orbax_checkpoints  # pylint: disable=g-import-not-at-top
  from thattn.io import safetensors_checkpoints  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  row = {}
  twin = TwinPath(state, os.path.join(root, f"twin{step}"))
  row["twin save"], path = _timed(lambda: twin.save(step))
  row["twin restore"], _ = _timed(lambda: twin.restore(path))
  row["twin size"] = sum(_size(p) for p in (path + ".index",
                                            path + ".data-00000-of-00001"))
  files = safetensors_checkpoints.RunCheckpoints(
      os.path.join(root, f"safetensors{step}"))
  row["safetensors save"], path = _timed(lambda: files.save(step, state))
  row["safetensors restore"], _ = _timed(
      lambda: (files.restore(step, state),
               jax.block_until_ready([v.value for v in state.values()])))
  row["safetensors size"] = _size(path)
  for mode in ("sync", "async"):
    directory = os.path.join(root, f"orbax_{mode}{step}")
    checkpoints = orbax_checkpoints.RunCheckpoints(
        directory, async_save=mode == "async")
    start = time.perf_counter()
    checkpoints.save(step, state)
    row[f"orbax {mode} save returns"] = time.perf_counter() - start
    checkpoints.wait()
    row[f"orbax {mode} save final"] = time.perf_counter() - start
    row[f"orbax {mode} restore"], _ = _timed(
        lambda: (checkpoints.restore(step, state),  # pylint: disable=cell-var-from-loop
                 jax.block_until_ready([v.value for v in state.values()])))
    row["orbax size"] = _size(checkpoints.path(step))
    checkpoints.close()
  # Does the background write slow the steps it overlaps? A save followed
  # by the same compute, synchronous against asynchronous, until both the
  # compute and the files are done.
  row["work alone"], _ = _timed(work)
  for mode in ("sync", "async"):
    checkpoints = orbax_checkpoints.RunCheckpoints(
        os.path.join(root, f"overlap_{mode}{step}"),
        async_save=mode == "async")
    start = time.perf_counter()
    checkpoints.save(step, state)
    work()
    checkpoints.wait()
    row[f"orbax {mode} save + work"] = time.perf_counter() - start
    checkpoints.close()
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  import keras  # pylint: disable=g-import-not-at-top
  assert keras.backend.backend() == "jax", "run in a fresh Python"
  preset = "bert_tiny" if args.quick else "bert_base"
  state, model = _state(preset)
  work = _work(model, 2 if args.quick else 4)
  count = sum(int(np.prod(v.shape)) for v in state.values())
  print(f"{preset}: {len(state)} values, {count / 1e6:.1f}M numbers")
  rows = []
  with tempfile.TemporaryDirectory() as root:
    for step in range(1, (1 if args.quick else args.rounds) + 1):
      rows.append(_round(state, root, step, work))
      print(json.dumps({k: round(v, 3) for k, v in rows[-1].items()}))
  medians = {key: statistics.median(row[key] for row in rows)
             for key in rows[0]}
  for key, value in medians.items():
    if "size" in key:
      print(f"{key:28s} {value / 1e6:8.2f} MB")
      continue
    # An Orbax or safetensors save or restore against the twin path's.
    anchor = None if key.startswith("twin") or "work" in key else (
        "twin restore" if key.endswith("restore") else "twin save")
    ratio = f"  ({value / medians[anchor]:.2f}x twin)" if anchor else ""
    print(f"{key:28s} {value:8.2f} s{ratio}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"preset": preset, "numbers": count, "rounds": rows,
                 "medians": medians}, f, indent=2)


if __name__ == "__main__":
  main()
