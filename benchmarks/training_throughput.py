"""Training tokens/s of two thattn checkouts, job by job, side by side.

Runs `thattn-train` (as `python -m thattn.bin.train`) for the default job
(talking-heads BERT, masked LM) and the T5 span-corruption job (with the
Keras backend and with `--backend=mtf`; `--jobs` picks some), once with
this checkout's code and once with another checkout's (`--before`, e.g. a
`git worktree` of an older commit), alternating round by round so that
drift on a noisy machine hits both alike. Reads each run's steady
tokens/s from its summary.json (the first step, which traces and
compiles, is left out) and prints medians and the after/before ratio.

    git worktree add /tmp/thattn_before <commit>
    python benchmarks/training_throughput.py --before=/tmp/thattn_before

The same installed TensorFlow serves both; each checkout compiles its own
kernel on first use (the cache key hashes the source).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    "default job (mlm, bert_tiny talking heads)": [],
    "T5 span corruption (t5_tiny talking heads)": [
        "--task=span_corruption", "--preset=t5_tiny"],
    "T5 span corruption, --backend=mtf": [
        "--task=span_corruption", "--preset=t5_tiny", "--backend=mtf"],
}


def tokens_per_second(tree, flags, steps):
  """Steady tokens/s of one run of `thattn-train` with `tree` on the path."""
  with tempfile.TemporaryDirectory() as folder:
    model_dir = os.path.join(folder, "run")
    result = subprocess.run(
        [sys.executable, "-m", "thattn.bin.train", *flags,
         f"--train_steps={steps}", f"--model_dir={model_dir}", "--noexport"],
        capture_output=True, text=True, check=False,
        env=dict(os.environ, PYTHONPATH=tree, TF_CPP_MIN_LOG_LEVEL="2"))
    if result.returncode != 0:
      raise RuntimeError(f"{tree} {flags} failed:\n{result.stderr[-3000:]}")
    with open(os.path.join(model_dir, "summary.json")) as f:
      return json.load(f)["tokens_per_second"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--before", required=True,
                      help="another thattn checkout (its repository root)")
  parser.add_argument("--steps", type=int, default=300)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--jobs", default=None, help="comma-separated "
                      "1-based job numbers to run (default: all)")
  args = parser.parse_args()
  jobs = list(JOBS.items())
  if args.jobs:
    jobs = [jobs[int(number) - 1] for number in args.jobs.split(",")]
  trees = {"before": os.path.abspath(args.before), "after": HERE}
  rates = {(job, name): [] for job, _ in jobs for name in trees}
  for round_index in range(args.rounds):
    for job, flags in jobs:
      for name, tree in trees.items():
        rate = tokens_per_second(tree, flags, args.steps)
        rates[job, name].append(rate)
        print(f"round {round_index + 1}: {job}, {name}: {rate:,} tokens/s",
              flush=True)
  print("\n| job | before (tokens/s) | after (tokens/s) | after / before |")
  print("|---|---:|---:|---:|")
  for job, _ in jobs:
    before = statistics.median(rates[job, "before"])
    after = statistics.median(rates[job, "after"])
    print(f"| {job} | {before:,.0f} | {after:,.0f} | {after / before:.2f}x |")


if __name__ == "__main__":
  main()
