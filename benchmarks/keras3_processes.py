"""A Keras 3 training step on JAX across processes (issue 54's groundwork).

Measures one `keras3_steps.Steps` train step of a masked-LM BERT (thattn's
`TaskLoss`, talking heads, Adafactor) laid out on a `batch` mesh of two
JAX CPU devices, in two topologies:

- 1 process x 2 devices (XLA's host platform split in two), and
- 2 processes x 1 device, joined by `jax.distributed.initialize` on
  localhost with gloo collectives, each process given the global batch's
  rows it holds (`jax.make_array_from_process_local_data`).

The same seed makes the same weights and batches in both, so the losses
of each step must agree (printed side by side): the check that the
multi-process layout computes what the single-process one does. Step time
is the median after 3 warm-up steps; the difference between the two is
what crossing a process costs a step (gloo's all-reduce of the gradients
over TCP against XLA's in-process one).

    python benchmarks/keras3_processes.py            # tiny and bert_base 1 layer
    python benchmarks/keras3_processes.py --quick    # tiny only, few steps

Runs each worker as a fresh Python (`--worker`), KERAS_BACKEND=jax.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

SIZES = {
    "tiny": dict(preset="bert_tiny", overrides={}, batch=8, length=64),
    "bert_base_1_layer": dict(preset="bert_base",
                              overrides={"num_layers": 1}, batch=8,
                              length=128),
}


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _batch(size, vocab, rng):
  batch, length = size["batch"], size["length"]
  masked = length // 8
  import numpy as np  # pylint: disable=g-import-not-at-top
  return {
      "input_word_ids": rng.integers(5, vocab, (batch, length)).astype(
          "int32"),
      "input_mask": np.ones((batch, length), "int32"),
      "input_type_ids": np.zeros((batch, length), "int32"),
      "masked_lm_positions": np.sort(rng.choice(
          length, (batch, masked)), axis=1).astype("int32"),
      "masked_lm_ids": rng.integers(5, vocab, (batch, masked)).astype(
          "int32"),
      "masked_lm_weights": np.ones((batch, masked), "float32")}


def worker(args):
  """One process of a topology: prints a JSON line of its losses and step
  times."""
  os.environ["XLA_FLAGS"] = (
      f"--xla_force_host_platform_device_count={args.local_devices}")
  os.environ["KERAS_BACKEND"] = "jax"
  import jax  # pylint: disable=g-import-not-at-top
  if args.processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"localhost:{args.port}", args.processes, args.process_id,
        initialization_timeout=120, heartbeat_timeout_seconds=30)
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from thattn.keras3 import distribution as distribution_lib  # pylint: disable=g-import-not-at-top
  from thattn.keras3 import optimizers  # pylint: disable=g-import-not-at-top
  from thattn.models import presets  # pylint: disable=g-import-not-at-top
  from thattn.sharding import rules as rules_lib  # pylint: disable=g-import-not-at-top
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.training import keras3_steps  # pylint: disable=g-import-not-at-top

  size = SIZES[args.size]
  config = presets.model_config(size["preset"], attention="talking_heads",
                                dropout_rate=0.0, **size["overrides"])
  mesh = keras.distribution.DeviceMesh((2,), ["batch"], jax.devices())
  rules = rules_lib.LayoutRules.parse("batch:batch")  # data parallel
  keras.utils.set_random_seed(0)
  reference = keras3_steps.TaskLoss(tasks.get("mlm"), config)
  distribution = keras.distribution.ModelParallel(
      layout_map=distribution_lib.model_layout_map(mesh, reference, rules),
      batch_dim_name="batch")
  with distribution.scope():
    keras.utils.set_random_seed(0)
    loss_layer = keras3_steps.TaskLoss(tasks.get("mlm"), config)
    steps = keras3_steps.Steps(
        loss_layer, optimizers.Adafactor(1e-3),
        batch_layout=lambda shape: keras.distribution.TensorLayout(
            ("batch",) + (None,) * (len(shape) - 1), mesh))
  rows = size["batch"] // args.processes
  mine = slice(args.process_id * rows, (args.process_id + 1) * rows)

  def local_inputs(batch):
    """This process's rows, assembled into the global arrays."""
    arrays = {key: np.asarray(batch[key]).astype(
        loss_layer.input_dtypes[key]) for key in loss_layer.input_keys}
    return {key: jax.make_array_from_process_local_data(
        steps.batch_layout(array.shape).backend_layout, array[mine],
        array.shape) for key, array in arrays.items()}

  steps.inputs = local_inputs  # what the keras3 run will do per process
  rng = np.random.default_rng(1)
  losses, times = [], []
  for _ in range(args.steps):
    batch = _batch(size, config.vocab_size, rng)
    start = time.perf_counter()
    losses.append(steps.train_step(batch))
    times.append(time.perf_counter() - start)
  allreduce = _allreduce_time(
      mesh, [tuple(v.shape) for v in loss_layer.trainable_variables],
      args.process_id)
  if args.processes > 1:
    jax.distributed.shutdown()
  print(json.dumps({"process": args.process_id, "losses": losses,
                    "step_s": statistics.median(times[3:]),
                    "allreduce_s": allreduce}), flush=True)


def _allreduce_time(mesh, shapes, process_id):
  """Median time of summing, over the `batch` axis, one float32 copy per
  device of each of `shapes` (the trainable weights'): the all-reduce a
  data-parallel step makes of its gradients, alone."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  sharding = jax.sharding.NamedSharding(mesh.backend_mesh,
                                        jax.sharding.PartitionSpec("batch"))
  per_process = 2 // jax.process_count()
  rows = [jax.make_array_from_process_local_data(
      sharding, np.full((per_process,) + shape, process_id, "float32"),
      (2,) + shape) for shape in shapes]
  total = jax.jit(lambda arrays: [x.sum(0) for x in arrays])
  times = []
  for _ in range(8):
    start = time.perf_counter()
    jax.block_until_ready(total(rows))
    times.append(time.perf_counter() - start)
  return statistics.median(times[2:])


def _run_topology(size, processes, steps):
  port = _free_port()
  commands = [[sys.executable, __file__, "--worker", f"--size={size}",
               f"--processes={processes}", f"--process_id={index}",
               f"--local_devices={2 // processes}", f"--port={port}",
               f"--steps={steps}"] for index in range(processes)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
                 __file__))))
  running = [subprocess.Popen(command, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for command in commands]
  results = []
  for process in running:
    stdout, stderr = process.communicate(timeout=1200)
    if process.returncode:
      raise RuntimeError(stderr[-3000:])
    results.append(json.loads(stdout.strip().splitlines()[-1]))
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--worker", action="store_true")
  parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
  parser.add_argument("--processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--local_devices", type=int, default=2)
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--steps", type=int, default=13)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return
  sizes = ["tiny"] if args.quick else list(SIZES)
  steps = 5 if args.quick else args.steps
  report = {}
  for size in sizes:
    one = _run_topology(size, 1, steps)[0]
    two = _run_topology(size, 2, steps)
    worst = max(abs(a - b) for result in two
                for a, b in zip(one["losses"], result["losses"]))
    two_step = max(result["step_s"] for result in two)
    two_reduce = max(result["allreduce_s"] for result in two)
    report[size] = {"1x2_step_s": one["step_s"], "2x1_step_s": two_step,
                    "1x2_allreduce_s": one["allreduce_s"],
                    "2x1_allreduce_s": two_reduce,
                    "ratio": two_step / one["step_s"],
                    "largest_loss_difference": worst,
                    "losses_1x2": one["losses"],
                    "losses_2x1": two[0]["losses"]}
    print(f"{size}: 1 process x 2 devices {one['step_s'] * 1e3:.1f} ms, "
          f"2 processes x 1 device {two_step * 1e3:.1f} ms "
          f"({two_step / one['step_s']:.2f}x); the gradients' all-reduce "
          f"alone {one['allreduce_s'] * 1e3:.1f} ms against "
          f"{two_reduce * 1e3:.1f} ms; losses agree within {worst:.1e}",
          flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
