"""Step times of sharded attention on 4 logical CPU devices (DTensor).

Times a forward+backward pass of self-attention (the gradient with respect
to every weight) for multi-head attention, talking heads and grouped talking
heads (num_head_groups=2), unsharded on one device and under DTensor on a
batch:2,model:2 mesh of 4 logical CPU devices, interleaving the
configurations round by round so that drift on a noisy machine hits them
all alike. It also counts the collective operations each sharded step runs
(from a profiler trace), which is where the variants differ.

    TF_USE_LEGACY_KERAS=1 python benchmarks/dtensor_step_times.py
    TF_USE_LEGACY_KERAS=1 python benchmarks/dtensor_step_times.py --quick

The script creates its 4 logical CPU devices itself, before TensorFlow
initializes its devices, so it must run in a fresh Python. Prints a markdown
table. Logical devices share the machine's cores: the numbers show the cost
of communication and SPMD overhead, not speedups.

Layout rules (thattn.sharding):
- multi-head and talking heads: "batch:batch;key_heads:model;value_heads:model".
  Talking heads' P_l[key_heads, heads] then contracts a sharded axis, so its
  logits need an all-reduce over model (and P_w's gradients likewise).
- grouped talking heads, G = 2 = the model-axis size: the same rules plus
  "head_groups:model"; each device holds whole groups and the attention core
  has no communication on the model axis.
"""

import argparse
import collections
import dataclasses
import glob
import statistics
import sys
import tempfile
import time

import numpy as np
import tensorflow as tf

DEVICES = 4
MESH = "batch:2,model:2"
FULL = dict(batch=8, length=128, width=256, heads=8)
QUICK = dict(batch=4, length=16, width=32, heads=8)
RULES = "batch:batch;key_heads:model;value_heads:model"
GROUPED_RULES = RULES + ";head_groups:model"


@dataclasses.dataclass(frozen=True)
class Config:
  name: str
  variant: str  # multi_head | talking_heads
  groups: int = 1

  @property
  def rules(self):
    return GROUPED_RULES if self.groups > 1 else RULES


CONFIGS = (Config("multi-head", "multi_head"),
           Config("talking heads", "talking_heads"),
           Config("grouped talking heads (G=2)", "talking_heads", groups=2))


def _configure_devices():
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * DEVICES)


def _build(config, sizes):
  from thattn import layers  # pylint: disable=g-import-not-at-top
  heads = sizes["heads"]
  key_dim = sizes["width"] // heads
  if config.variant == "multi_head":
    layer = layers.MultiHeadAttention(heads, key_dim, name="attention")
  else:
    layer = layers.TalkingHeadsAttention(heads, key_dim,
                                         num_head_groups=config.groups,
                                         name="attention")
  shape = [None, None, sizes["width"]]
  layer.build_from_shapes(shape, shape)
  return layer


def _make_step(layer):
  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(layer(x, x)))
    grads = tape.gradient(loss, layer.trainable_variables)
    # Reduce each gradient so that nothing can be pruned, cheaply.
    return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0.0
  return step


def _runs(sizes):
  """{(config name, placement): step thunk returning a host float}."""
  from thattn import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(MESH)
  x = np.random.RandomState(0).randn(
      sizes["batch"], sizes["length"], sizes["width"]).astype(np.float32)
  runs = {}
  for config in CONFIGS:
    rules = sharding.LayoutRules.parse(config.rules)
    sharded, reference = sharding.build_sharded(
        lambda config=config: _build(config, sizes), rules, mesh, strict=True)
    plain_step, sharded_step = _make_step(reference), _make_step(sharded)
    x_plain = tf.constant(x)
    x_sharded = sharding.shard(x, mesh, rules, (sharding.BATCH,), "x")
    runs[config.name, "unsharded"] = (
        lambda step=plain_step, x=x_plain: float(step(x).numpy()))
    runs[config.name, MESH] = (
        lambda step=sharded_step, x=x_sharded: float(sharding.to_numpy(
            step(x))))
  return runs


def _time(runs, repeats):
  losses = {}
  for key, run in runs.items():
    for _ in range(2):  # trace, then warm up
      losses[key] = run()
  times = collections.defaultdict(list)
  for _ in range(repeats):
    for key, run in runs.items():
      start = time.perf_counter()
      run()
      times[key].append(time.perf_counter() - start)
  return {key: statistics.median(values) for key, values in times.items()}, \
      losses


def _count_collectives(run, steps=2):
  """Collective kernels each device runs per step, or None.

  Reads the profiler's trace (an XSpace protobuf); the trace format is an
  implementation detail of TensorFlow, so any failure gives None.
  """
  try:
    from tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  except ImportError:
    try:
      from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
    except ImportError:
      return None
  with tempfile.TemporaryDirectory() as logdir:
    tf.profiler.experimental.start(logdir)
    try:
      for _ in range(steps):
        run()
    finally:
      tf.profiler.experimental.stop()
    paths = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
    if not paths:
      return None
    with open(paths[0], "rb") as f:
      space = xplane_pb2.XSpace.FromString(f.read())
  count = 0
  for plane in space.planes:
    kernels = {key for key, meta in plane.event_metadata.items()
               if meta.name.startswith("CollectiveOpV2Kernel")}
    count += sum(event.metadata_id in kernels
                 for line in plane.lines for event in line.events)
  return count / (steps * DEVICES)


def markdown(seconds, collectives, sizes, repeats):
  lines = [
      f"Forward+backward self-attention, batch {sizes['batch']}, length "
      f"{sizes['length']}, width {sizes['width']}, h = {sizes['heads']} "
      f"heads of d_k = {sizes['width'] // sizes['heads']}, float32; median "
      f"of {repeats} interleaved steps.", "",
      f"| attention | unsharded, 1 device (ms) | DTensor {MESH} (ms) | "
      "ratio | collectives per device and step |",
      "|---|---|---|---|---|"]
  for config in CONFIGS:
    plain = seconds[config.name, "unsharded"]
    sharded = seconds[config.name, MESH]
    count = collectives.get(config.name)
    lines.append(f"| {config.name} | {plain * 1e3:.1f} | {sharded * 1e3:.1f} "
                 f"| {sharded / plain:.2f}x | "
                 f"{'n/a' if count is None else f'{count:g}'} |")
  lines += ["", "Layout rules: " + ", ".join(
      f"{config.name}: `{config.rules}`" for config in CONFIGS) + "."]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes, for smoke runs")
  parser.add_argument("--repeats", type=int, default=None)
  args = parser.parse_args(argv)
  _configure_devices()  # first, before anything touches the devices
  sizes = QUICK if args.quick else FULL
  repeats = args.repeats or (3 if args.quick else 50)
  runs = _runs(sizes)
  seconds, losses = _time(runs, repeats)
  for config in CONFIGS:  # the sharded step computes the same loss
    plain, sharded = losses[config.name, "unsharded"], losses[config.name,
                                                              MESH]
    if not np.isclose(plain, sharded, rtol=1e-4):
      raise AssertionError(f"{config.name}: sharded loss {sharded} != "
                           f"unsharded {plain}")
  collectives = {config.name: _count_collectives(runs[config.name, MESH])
                 for config in CONFIGS}
  print(markdown(seconds, collectives, sizes, repeats))


if __name__ == "__main__":
  sys.exit(main())
