"""Training speed in one process against the same run over 2 processes.

Two pairs, each run with `thattn-train` in fresh processes on this machine
(the workers on loopback ports, started by the tests' own helper,
`tests/training/local_cluster.py`):

- Keras: masked LM on a small talking-heads BERT, one process against 2
  `--strategy=multi_worker_mirrored` workers (the global batch split
  between them, gradients all-reduced over gRPC);
- Mesh TensorFlow: span corruption on a small talking-heads T5 on a
  `model:2` mesh (heads and d_ff split), in one process on 2 logical CPUs
  against 2 processes of one TF_CONFIG cluster, one mesh device each
  (`thattn.mtf.cluster`).

Each run's steady rate is read from its summary.json (tokens/s after the
first step); rounds alternate the configurations so that drift hits all of
them alike. On one 2-core machine no speed-up is expected: the ratio is
the cost of crossing processes.

    python benchmarks/processes.py            # ~10 minutes on 2 cores
    python benchmarks/processes.py --quick    # a smoke run, ~2 minutes
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.training import local_cluster  # pylint: disable=g-import-not-at-top,wrong-import-position

FULL = dict(train_steps=200, rounds=2)
QUICK = dict(train_steps=5, rounds=1)
KERAS = ["--task=mlm", "--preset=bert_tiny", "--d_model=64", "--d_ff=256",
         "--num_layers=2", "--batch_size=32", "--sequence_length=64"]
MTF = ["--backend=mtf", "--task=span_corruption", "--preset=t5_tiny",
       "--d_model=128", "--d_ff=512", "--num_heads=8", "--batch_size=16",
       "--sequence_length=64", "--mesh_shape=model:2",
       "--layout_rules=heads:model;d_ff:model"]
CONFIGS = {  # name: (flags, processes)
    "keras, 1 process": (KERAS, 1),
    "keras, 2 workers": (KERAS + ["--strategy=multi_worker_mirrored"], 2),
    "mtf model:2, 1 process": (MTF, 1),
    "mtf model:2, 2 processes": (MTF, 2),
}


def _run(flags, processes, model_dir, size):
  """tokens/s of one run (from its summary.json)."""
  argv = [sys.executable, "-m", "thattn.bin.train", "--noexport",
          f"--model_dir={model_dir}", f"--train_steps={size['train_steps']}",
          "--eval_steps=2", "--eval_every=0", "--warmup_steps=10",
          f"--log_every={size['train_steps']}",
          f"--checkpoint_every={size['train_steps']}"] + flags
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  with local_cluster.LocalCluster(
      argv, processes, env=env, timeout=1800,
      envs=None if processes > 1 else [{}]) as cluster:
    outputs = cluster.wait()
  for code, stdout, stderr in outputs:
    if code:
      raise RuntimeError(f"{argv} failed:\n{stdout[-2000:]}{stderr[-3000:]}")
  return local_cluster.summary(model_dir)["tokens_per_second"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  size = QUICK if args.quick else FULL
  rates = {name: [] for name in CONFIGS}
  with tempfile.TemporaryDirectory() as temp:
    for round_index in range(size["rounds"]):
      for index, (name, (flags, processes)) in enumerate(CONFIGS.items()):
        model_dir = os.path.join(temp, f"run{round_index}_{index}")
        rates[name].append(_run(flags, processes, model_dir, size))
        print(f"round {round_index + 1}: {name}: {rates[name][-1]:,} "
              "tokens/s", flush=True)
  print(f"\nmedian of {size['rounds']} runs of {size['train_steps']} steps "
        "each, tokens/s after the first step\n")
  print("| run | tokens/s (each run) | median | time / 1 process |")
  print("|---|---|---:|---:|")
  rows = {}
  for name, values in rates.items():
    median = statistics.median(values)
    reference = statistics.median(rates[name.split(",")[0] + ", 1 process"])
    rows[name] = dict(runs=values, median=median,
                      time_ratio=reference / median)
    print(f"| {name} | {', '.join(f'{v:,}' for v in values)} | "
          f"{median:,.0f} | {reference / median:.2f}x |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"size": size, "results": rows}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
