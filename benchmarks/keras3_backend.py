"""Training rate of `thattn-train --backend=keras3` (JAX) against the Keras
backend, on the default job.

Trains the default job's model (masked LM, `bert_tiny` widened to d_model
128 and d_ff 512, talking heads, batch 32 of 128 tokens, Adafactor, no
dropout: what `thattn-train` trains with no flags) for a few hundred steps
with `--backend=keras` (tf-keras with thattn's fused TensorFlow kernel) and
`--backend=keras3` on JAX (jax.jit over stateless_call; talking heads on
JAX's CPU kernel), in one process, rounds alternating so that drift on a
noisy machine hits both alike. Reports each run's steady rate (tokens/s
after the first step, from its summary.json) and the ratio.

    python benchmarks/keras3_backend.py            # ~6 minutes on 2 cores
    python benchmarks/keras3_backend.py --quick    # seconds: a smoke run

Must run in a fresh Python: it sets KERAS_BACKEND=jax before TensorFlow
(which loads Keras 3) is imported. Uses the embedded corpus (built and
cached on first use, as the README's first command does).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

FULL = dict(train_steps=300, batch_size=32, sequence_length=128,
            d_model=128, d_ff=512, rounds=3)
QUICK = dict(train_steps=3, batch_size=4, sequence_length=32, d_model=32,
             d_ff=64, rounds=1)
BACKENDS = ("keras", "keras3")


def _train(backend, size, model_dir):
  """The summary of one run of the default job's model."""
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top
  from thattn.training import run  # pylint: disable=g-import-not-at-top
  options = options_lib.TrainOptions(
      train_steps=size["train_steps"], batch_size=size["batch_size"],
      sequence_length=size["sequence_length"],
      log_every=size["train_steps"], checkpoint_every=size["train_steps"],
      eval_steps=1, backend=backend)
  model = tasks.ModelOptions(preset="bert_tiny", overrides=dict(
      d_model=size["d_model"], d_ff=size["d_ff"], dropout_rate=0.0))
  return run.train(model_dir=model_dir, task="mlm", model=model,
                   options=options, log=lambda line: None)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args()
  size = QUICK if args.quick else FULL
  import keras  # pylint: disable=g-import-not-at-top
  if keras.backend.backend() != "jax":
    sys.exit(f"Keras 3 runs on {keras.backend.backend()}, not JAX: run in a "
             "fresh Python without another KERAS_BACKEND.")
  rates = {backend: [] for backend in BACKENDS}
  with tempfile.TemporaryDirectory() as root:
    for index in range(size["rounds"]):
      for backend in BACKENDS:
        summary = _train(backend, size,
                         os.path.join(root, f"{backend}_{index}"))
        rates[backend].append(summary["tokens_per_second"])
        print(f"round {index + 1}: {backend:6} "
              f"{summary['tokens_per_second']:>8,} tokens/s, held-out "
              f"ln(PPL) {summary['held_out_ln_ppl_after']:.4f}", flush=True)
  median = {backend: statistics.median(values)
            for backend, values in rates.items()}
  print("| backend | tokens/s (median) | time / Keras backend's |")
  print("|---|---:|---:|")
  for backend in BACKENDS:
    print(f"| {backend} | {median[backend]:,.0f} | "
          f"{median['keras'] / max(median[backend], 1):.2f}x |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"size": size, "rates": rates, "median": median}, f,
                indent=2)


if __name__ == "__main__":
  main()
