"""Memory of a talking-heads training step as the sequence grows.

For each length, one fresh process builds a TalkingHeadsAttention layer
(width 256, h = 4, d_k = 64, batch 1, causal self-attention), runs a
forward+backward step once to warm up, then measures the peak bytes that
TensorFlow's CPU allocator holds during a second step, beyond what was live
before it. Plain path versus `query_chunk_size` (scores recomputed chunk by
chunk in the backward pass).

    python benchmarks/long_sequence.py                       # 512 .. 8192
    python benchmarks/long_sequence.py --lengths 512,1024 --chunk_size 256
"""

import argparse
import json
import os
import subprocess
import sys
import time

# TensorFlow turns oneDNN on by default only on some x86 CPUs; without it,
# its CPU allocator keeps no memory statistics (reset_memory_stats("CPU:0")
# fails), which the peak-memory measurements need. Pin it on, before
# TensorFlow is imported, so every machine measures the same way.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

WIDTH, HEADS, BATCH = 256, 4, 1


def measure(length, chunk_size):
  """Runs in the child process: (peak bytes, step seconds)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from thattn import layers  # pylint: disable=g-import-not-at-top

  layer = layers.TalkingHeadsAttention(HEADS, WIDTH // HEADS,
                                       query_chunk_size=chunk_size or None)
  x = tf.random.normal([BATCH, length, WIDTH])

  @tf.function
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(tf.square(layer(x, x, use_causal_mask=True)))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0.0

  step(x).numpy()
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  start = time.perf_counter()
  step(x).numpy()
  seconds = time.perf_counter() - start
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before, seconds


def run_child(length, chunk_size):
  result = subprocess.run(
      [sys.executable, __file__, "--child", f"{length},{chunk_size}"],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  if result.returncode != 0:
    return None
  peak, seconds = json.loads(result.stdout.strip().splitlines()[-1])
  return {"peak_bytes": peak, "seconds": seconds}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
  parser.add_argument("--chunk_size", type=int, default=256)
  parser.add_argument("--plain_max_length", type=int, default=8192,
                      help="skip the plain path above this length")
  parser.add_argument("--out", default="benchmarks/results/long_sequence")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    length, chunk_size = (int(v) for v in args.child.split(","))
    print(json.dumps(measure(length, chunk_size)))
    return

  rows = []
  for length in (int(v) for v in args.lengths.split(",")):
    chunked = run_child(length, args.chunk_size)
    plain = (run_child(length, 0) if length <= args.plain_max_length
             else None)
    rows.append({"length": length, "chunked": chunked, "plain": plain})
    print(rows[-1], flush=True)

  def cell(result, key, scale, fmt):
    return "not run" if result is None else fmt.format(result[key] / scale)

  lines = [f"Talking heads, width {WIDTH}, h={HEADS}, d_k={WIDTH // HEADS}, "
           f"batch {BATCH}, causal self-attention; one training step.", "",
           f"| length | plain peak (MiB) | chunked (c={args.chunk_size}) "
           "peak (MiB) | plain step (s) | chunked step (s) |",
           "|---|---|---|---|---|"]
  for row in rows:
    lines.append(
        f"| {row['length']} "
        f"| {cell(row['plain'], 'peak_bytes', 2**20, '{:.0f}')} "
        f"| {cell(row['chunked'], 'peak_bytes', 2**20, '{:.0f}')} "
        f"| {cell(row['plain'], 'seconds', 1, '{:.2f}')} "
        f"| {cell(row['chunked'], 'seconds', 1, '{:.2f}')} |")
  table = "\n".join(lines) + "\n"
  print(table)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out + ".md", "w") as f:
    f.write(table)
  with open(args.out + ".json", "w") as f:
    json.dump({"chunk_size": args.chunk_size, "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()
