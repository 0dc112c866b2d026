"""Training step time of `--backend=mtf` against the Keras backend.

Trains the same T5 (span corruption, talking heads, Adafactor, the same
batches and initial weights) with both backends in one process, on one
device and on a batch:2,model:2 mesh of 4 logical CPU devices (the Keras
backend with `--strategy=dtensor`, mtf with its `PlacementMeshImpl`), and
reports each run's steady training rate (tokens/s after the first step, from
its summary.json) and the ratio mtf / Keras. Rounds alternate the
configurations so that drift on a noisy machine hits them all alike.

    python benchmarks/mtf_backend.py            # ~5 minutes on 2 cores
    python benchmarks/mtf_backend.py --quick    # seconds: a smoke run

Must run in a fresh Python (it splits the CPU into 4 logical devices before
TensorFlow starts). Logical devices share the machine's cores: the 4-device
numbers show the cost of sharding, not a speedup. Uses the embedded corpus
(built and cached on first use, as the README's first command does).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import tensorflow as tf

DEVICES = 4
MESH = "batch:2,model:2"
FULL = dict(d_model=128, d_ff=512, num_heads=8, batch_size=16,
            sequence_length=64, train_steps=40, rounds=3)
QUICK = dict(d_model=32, d_ff=64, num_heads=4, batch_size=4,
             sequence_length=16, train_steps=3, rounds=1)


def _split_cpu():
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * DEVICES)


def _train(backend, mesh, size, model_dir):
  """tokens/s of one run."""
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.mtf import training as mtf_training  # pylint: disable=g-import-not-at-top
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  from thattn.training import trainer  # pylint: disable=g-import-not-at-top
  layout = {}
  if mesh and backend == "keras":
    layout = dict(strategy="dtensor", mesh_shape=MESH)
  elif mesh:
    layout = dict(mesh_shape=MESH)
  options = options_lib.TrainOptions(
      train_steps=size["train_steps"], batch_size=size["batch_size"],
      sequence_length=size["sequence_length"], warmup_steps=10,
      eval_steps=1, log_every=size["train_steps"],
      checkpoint_every=size["train_steps"], backend=backend, **layout)
  model = tasks.ModelOptions(preset="t5_tiny", overrides=dict(
      attention="talking_heads", d_model=size["d_model"], d_ff=size["d_ff"],
      num_heads=size["num_heads"], dropout_rate=0.0))
  train = mtf_training.train if backend == "mtf" else trainer.train
  summary = train(model_dir=model_dir, task="span_corruption", model=model,
                  options=options, log=lambda line: None)
  return summary["tokens_per_second"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  size = QUICK if args.quick else FULL
  _split_cpu()
  configs = [(backend, mesh) for mesh in (False, True)
             for backend in ("keras", "mtf")]
  rates = {config: [] for config in configs}
  with tempfile.TemporaryDirectory() as temp:
    for round_index in range(size["rounds"]):
      for backend, mesh in configs:
        model_dir = os.path.join(temp, f"{backend}_{mesh}_{round_index}")
        rates[(backend, mesh)].append(_train(backend, mesh, size, model_dir))
        print(f"round {round_index + 1}: {backend:5} "
              f"{'4 devices' if mesh else '1 device'}: "
              f"{rates[(backend, mesh)][-1]:,.0f} tokens/s", flush=True)
  rows = []
  print(f"\nT5 d_model {size['d_model']}, d_ff {size['d_ff']}, "
        f"{size['num_heads']} talking heads, 2+2 layers; batch "
        f"{size['batch_size']} x {size['sequence_length']} tokens; median "
        f"of {size['rounds']} runs of {size['train_steps']} steps.\n")
  print("| devices | Keras tokens/s | mtf tokens/s | mtf / Keras time |")
  print("|---|---:|---:|---:|")
  for mesh in (False, True):
    keras = statistics.median(rates[("keras", mesh)])
    mtf = statistics.median(rates[("mtf", mesh)])
    name = f"4 ({MESH}; Keras: DTensor)" if mesh else "1"
    print(f"| {name} | {keras:,.0f} | {mtf:,.0f} | {keras / mtf:.2f}x |")
    rows.append({"devices": DEVICES if mesh else 1, "keras": keras,
                 "mtf": mtf, "mtf_over_keras_time": keras / mtf})
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"size": size, "results": rows}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
