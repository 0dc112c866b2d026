"""Runs `trainer.train` under DTensor on logical CPU devices; prints JSON.

Logical devices must be configured before TensorFlow initializes them, so
`dtensor_train_test.py` runs this file in a fresh Python per device count:

    python tests/training/dtensor_train_script.py --devices 4 \
        --data_dir <train.txt and tokenizer/> --out_dir /tmp/runs \
        --case cross:batch:2,model:2

Each case prints one JSON line that the test asserts on:

- `cross:<mesh>` (Adafactor): an unsharded and a sharded run, each stopped
  by an exception after step 5 (checkpoint 4 saved); each checkpoint
  restored into a model of the other kind and saved again (the round trip
  must give the same bits); then each run continued to step 8 the other way
  (sharded -> unsharded, unsharded -> sharded). Reports every step's loss,
  the held-out losses, the layouts the sharded run wrote, and how far the
  two final checkpoints are apart.
- `mesh_change:<mesh>/<mesh>` (Adam): an unsharded reference run, and a
  sharded run stopped after step 5 and continued on the second mesh;
  losses, both meshes' layouts, and the final checkpoints' distance.
- `bfloat16:<mesh>` (Adafactor, --mixed_precision=bfloat16): an unsharded
  and a sharded run of 3 steps; losses, held-out losses and the sharded
  layouts (the weights stay float32 DVariables under the policy).
- `error:<name>`: a run that must fail before any step; the message.
"""

import argparse
import glob
import json
import os
import re
import shutil
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

STEPS = 8
STOP_AFTER = 5  # checkpoint 4 is saved; step 5 runs and is not saved
# A tiny talking-heads BERT (the vocabulary is the test tokenizer's 1000).
MODEL = dict(d_model=32, d_ff=64, num_layers=1, num_heads=4,
             dropout_rate=0.0, attention="talking_heads")
# Wide enough that Adafactor factors the embedding table, the feed-forward
# and the MLM transform kernels (min_dim_size_to_factor=128), so factored
# slots run on the mesh too.
WIDE = dict(d_model=128, d_ff=256)


class _Stop(Exception):
  pass


def _configure_devices(count):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def _data(data_dir):
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  return tasks.DataOptions(
      train_files=os.path.join(data_dir, "train.txt"),
      tokenizer=os.path.join(data_dir, "tokenizer"))


def _options(mesh=None, **kwargs):
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  settings = dict(train_steps=STEPS, batch_size=8, sequence_length=32,
                  warmup_steps=2, log_every=1, checkpoint_every=4,
                  eval_steps=2, learning_rate=0.03)
  if mesh:
    settings.update(strategy="dtensor", mesh_shape=mesh)
  return options_lib.TrainOptions(**dict(settings, **kwargs))


def _train(model_dir, data_dir, mesh=None, stop=False, model=None,
           task="mlm", **kwargs):
  """trainer.train; with `stop`, raises _Stop at step STOP_AFTER's line."""
  # pylint: disable=g-import-not-at-top
  from thattn import tasks
  from thattn.training import trainer
  # pylint: enable=g-import-not-at-top
  lines = []

  def log(line):
    lines.append(line)
    if stop and line.startswith(f"step {STOP_AFTER:>6}/"):
      raise _Stop()

  try:
    summary = trainer.train(
        model_dir=model_dir, task=task, data=_data(data_dir),
        model=tasks.ModelOptions(preset="bert_tiny",
                                      overrides=dict(MODEL, **(model or {}))),
        options=_options(mesh, **kwargs), log=log)
  except _Stop:
    summary = None
  return summary, lines


def _losses(model_dir):
  """{step: training loss}, the last value written for each step.

  A stopped run's step 5 is run again on resume; the resumed value, written
  later, wins.
  """
  latest = {}
  for path in glob.glob(os.path.join(model_dir, "train", "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == "loss":
          earlier = latest.get(event.step)
          if earlier is None or event.wall_time >= earlier[0]:
            latest[event.step] = (event.wall_time,
                                  float(tf.make_ndarray(value.tensor)))
  return {step: loss for step, (_, loss) in sorted(latest.items())}


def _checkpoint_values(path):
  """{checkpoint key: (variable name, value)} of every saved tensor.

  The names (weights, and slots such as "v/block_0/...") come from the
  checkpoint's object graph, for the report; tensors are matched by key,
  since a name may differ where the key does not (tf-keras names Adam's
  learning-rate variable "learning_rate" under DTensor, else
  "current_learning_rate").
  """
  reader = tf.train.load_checkpoint(path)
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  names = {attribute.checkpoint_key: attribute.full_name
           for node in graph.nodes for attribute in node.attributes}
  return {key: (names.get(key) or key, reader.get_tensor(key))
          for key in reader.get_variable_to_shape_map()
          if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _relative_differences(reference_path, path):
  """{name: max |a - b| / max |reference|} over every saved tensor."""
  reference, other = _checkpoint_values(reference_path), _checkpoint_values(
      path)
  assert set(reference) == set(other), set(reference) ^ set(other)
  differences = {}
  for key, (name, value) in reference.items():
    other_value = other[key][1]
    if value.dtype.kind != "f":
      differences[name] = float(not np.array_equal(value, other_value))
      continue
    scale = max(float(np.abs(value).max()), 1e-30)
    differences[name] = float(np.abs(value - other_value).max() / scale)
  return differences


def _round_trip(source_dir, scratch_dir, data_dir, mesh, model):
  """Restores source_dir's latest checkpoint sharded (mesh) or not, saves it.

  Builds the objective and optimizer as the trainer does, restores with
  assert_consumed (every saved value found its variable), writes a new
  checkpoint of the same objects, and returns whether every saved tensor
  (weights, slots, step) came back bit for bit.
  """
  # pylint: disable=g-import-not-at-top
  from thattn import tasks
  from thattn.training import devices as devices_lib
  from thattn.training import dtensor as dtensor_training
  from thattn.training import optimizer as optimizer_lib
  # pylint: enable=g-import-not-at-top
  options = _options(mesh)
  objective = tasks.mlm.MaskedLM(
      batch_size=options.batch_size, sequence_length=options.sequence_length,
      seed=options.seed, log=lambda line: None, data=_data(data_dir),
      files=tasks.TaskFiles(
          tokenizer_dir=os.path.join(source_dir, "tokenizer")),
      model=tasks.ModelOptions(preset="bert_tiny",
                                    overrides=dict(MODEL, **model)))
  make = lambda **kwargs: optimizer_lib.make_optimizer(options, **kwargs)
  os.makedirs(scratch_dir)
  if mesh:
    devices = dtensor_training.DTensorDevices(options, scratch_dir)
  else:
    devices = devices_lib.StrategyDevices(tf.distribute.get_strategy())
  optimizer, _ = devices.build(objective, make, seed=options.seed)
  checkpoint = tf.train.Checkpoint(
      optimizer=optimizer, initial_eval=tf.Variable(float("nan")),
      **objective.checkpoint_items())
  source = tf.train.latest_checkpoint(os.path.join(source_dir, "checkpoints"))
  checkpoint.restore(source).assert_consumed()
  written = checkpoint.write(os.path.join(scratch_dir, "round_trip"))
  differences = _relative_differences(source, written)
  return {"source": os.path.basename(source), "tensors": len(differences),
          "bitwise_equal": max(differences.values()) == 0.0}


def _layouts(model_dir):
  with open(os.path.join(model_dir, "dtensor_layouts.json")) as f:
    return json.load(f)


def _summary_losses(summary):
  return {key: summary[key] for key in ("held_out_ln_ppl_before",
                                        "held_out_ln_ppl_after")}


def cross_case(mesh, out_dir, data_dir):
  """Sharded <-> unsharded through checkpoints (Adafactor, WIDE model)."""
  runs = {name: os.path.join(out_dir, name) for name in (
      "unsharded_first", "sharded_first")}
  _train(runs["unsharded_first"], data_dir, stop=True, model=WIDE)
  _, sharded_lines = _train(runs["sharded_first"], data_dir, mesh=mesh,
                            stop=True, model=WIDE)
  first_losses = {name: _losses(path) for name, path in runs.items()}
  layouts = _layouts(runs["sharded_first"])
  round_trips = {
      "sharded_to_unsharded": _round_trip(
          runs["sharded_first"], os.path.join(out_dir, "rt_unsharded"),
          data_dir, None, WIDE),
      "unsharded_to_sharded": _round_trip(
          runs["unsharded_first"], os.path.join(out_dir, "rt_sharded"),
          data_dir, mesh, WIDE),
  }
  # Continue each the other way, from checkpoint 4.
  to_unsharded, to_unsharded_lines = _train(runs["sharded_first"], data_dir,
                                            model=WIDE)
  to_sharded, to_sharded_lines = _train(runs["unsharded_first"], data_dir,
                                        mesh=mesh, model=WIDE)
  return {
      "case": f"cross:{mesh}",
      "losses": {"unsharded_first": first_losses["unsharded_first"],
                 "sharded_first": first_losses["sharded_first"],
                 "sharded_then_unsharded": _losses(runs["sharded_first"]),
                 "unsharded_then_sharded": _losses(runs["unsharded_first"])},
      "held_out": {"sharded_then_unsharded": _summary_losses(to_unsharded),
                   "unsharded_then_sharded": _summary_losses(to_sharded)},
      "resumed_from": [to_unsharded["resumed_from_step"],
                       to_sharded["resumed_from_step"]],
      "resume_lines": [line for line in to_unsharded_lines +
                       to_sharded_lines if line.startswith("Resumed from")],
      "describe_lines": [line for line in sharded_lines + to_sharded_lines
                         if "DTensor mesh" in line],
      "layouts": layouts,
      "round_trips": round_trips,
      "final_difference": _relative_differences(
          to_unsharded["checkpoint"], to_sharded["checkpoint"]),
  }


def mesh_change_case(first, second, out_dir, data_dir):
  """Adam: a sharded run stopped after step 5, continued on another mesh."""
  reference, _ = _train(os.path.join(out_dir, "reference"), data_dir,
                        optimizer="adam", learning_rate=3e-3)
  model_dir = os.path.join(out_dir, "mesh_change")
  _train(model_dir, data_dir, mesh=first, stop=True, optimizer="adam",
         learning_rate=3e-3)
  first_layouts = _layouts(model_dir)
  summary, lines = _train(model_dir, data_dir, mesh=second,
                          optimizer="adam", learning_rate=3e-3)
  return {"case": f"mesh_change:{first}/{second}",
          "losses": {"reference": _losses(os.path.join(out_dir,
                                                       "reference")),
                     "sharded": _losses(model_dir)},
          "held_out": {"reference": _summary_losses(reference),
                       "sharded": _summary_losses(summary)},
          "resumed_from": summary["resumed_from_step"],
          "describe_lines": [line for line in lines if "DTensor mesh" in line],
          "layouts": [first_layouts, _layouts(model_dir)],
          "final_difference": _relative_differences(reference["checkpoint"],
                                                    summary["checkpoint"])}


# Runs that must stop before any step: (mesh, model overrides, options).
ERRORS = {
    # 12 query/key heads on a model axis of 8.
    "heads": ("batch:1,model:8", {"num_heads": 12, "key_dim": 8}, {}),
    # A global batch of 6 on a batch axis of 4.
    "batch": ("batch:4,model:2", {}, {"batch_size": 6}),
    # Dropout draws stateful random numbers.
    "dropout": ("batch:2,model:2", {"dropout_rate": 0.1}, {}),
    # More devices than there are.
    "devices": ("batch:4,model:4", {}, {}),
    # A rule naming a mesh axis the mesh does not have.
    "rule_axis": ("batch:2,model:2", {}, {"layout_rules": "heads:modle"}),
}


def bfloat16_case(mesh, out_dir, data_dir):
  """Mixed bfloat16, sharded against unsharded, 3 steps."""
  runs = {name: os.path.join(out_dir, name) for name in ("unsharded",
                                                          "sharded")}
  summaries = {
      name: _train(path, data_dir, mesh=mesh if name == "sharded" else None,
                   train_steps=3, mixed_precision="bfloat16")[0]
      for name, path in runs.items()}
  return {"case": f"bfloat16:{mesh}",
          "losses": {name: _losses(path) for name, path in runs.items()},
          "held_out": {name: _summary_losses(summary)
                       for name, summary in summaries.items()},
          "layouts": _layouts(runs["sharded"])}


def error_case(name, out_dir, data_dir):
  mesh, model, options = ERRORS[name]
  model_dir = os.path.join(out_dir, f"error_{name}")
  try:
    _, lines = _train(model_dir, data_dir, mesh=mesh, model=model, **options)
  except ValueError as error:
    message = str(error)
  else:
    message = None
    del lines
  return {"case": f"error:{name}", "error": message,
          "checkpoints": glob.glob(os.path.join(model_dir, "checkpoints",
                                                "ckpt-*"))}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--data_dir", required=True)
  parser.add_argument("--out_dir", required=True)
  parser.add_argument("--case", action="append", required=True,
                      help="cross:<mesh>, mesh_change:<mesh>/<mesh>, "
                      f"bfloat16:<mesh> or error:<{'|'.join(ERRORS)}>")
  args = parser.parse_args(argv)
  _configure_devices(args.devices)  # first, before anything touches devices
  for case in args.case:
    kind, _, rest = case.partition(":")
    out_dir = os.path.join(args.out_dir, re.sub(r"\W", "_", case))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    if kind == "cross":
      result = cross_case(rest, out_dir, args.data_dir)
    elif kind == "mesh_change":
      first, second = rest.split("/")
      result = mesh_change_case(first, second, out_dir, args.data_dir)
    elif kind == "bfloat16":
      result = bfloat16_case(rest, out_dir, args.data_dir)
    else:
      result = error_case(rest, out_dir, args.data_dir)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  sys.exit(main())
