"""The talking-heads attention core alone: TensorFlow ops against the kernel.

Times J -> U (mix by P_l, masked softmax, mix by P_w) forward and backward,
with the gradients of J, P_l and P_w, on [batch, h, n, n] scores: once as
the TensorFlow ops `thattn.layers` use without the kernel, once as
`thattn.kernels.talking_heads_softmax`. One process, the two interleaved
round by round; prints medians and their ratio.

    python benchmarks/fused_kernel.py                 # h = 12, 24, 48
    python benchmarks/fused_kernel.py --heads=24 --rows_per_block=8
"""

import argparse
import statistics
import time

import tensorflow as tf

from thattn.kernels import talking_heads_softmax
from thattn.layers import attention_ops


def tensorflow_ops(dots, pre, post, rows_per_block):
  del rows_per_block  # a kernel setting
  weights = attention_ops.masked_softmax(attention_ops.mix_heads(dots, pre))
  return attention_ops.mix_heads(weights, post)


def fused(dots, pre, post, rows_per_block):
  return talking_heads_softmax.talking_heads_softmax(
      dots, pre, post, rows_per_block=rows_per_block)


def make_step(core, upstream, rows_per_block):
  @tf.function
  def step(dots, pre, post):
    with tf.GradientTape() as tape:
      tape.watch([dots, pre, post])
      loss = tf.reduce_sum(core(dots, pre, post, rows_per_block) * upstream)
    return tape.gradient(loss, [dots, pre, post])
  return step


def time_heads(heads, batch, length, repeats, rows_per_block):
  shape = [batch, heads, length, length]
  dots = tf.random.stateless_normal(shape, seed=[1, 2])
  pre = tf.random.stateless_normal([heads, heads], seed=[3, 4]) * 0.3
  post = tf.random.stateless_normal([heads, heads], seed=[5, 6]) * 0.3
  upstream = tf.random.stateless_normal(shape, seed=[7, 8])
  steps = {name: make_step(core, upstream, rows_per_block)
           for name, core in (("TF ops", tensorflow_ops), ("fused", fused))}
  times = {name: [] for name in steps}
  for step in steps.values():
    [g.numpy() for g in step(dots, pre, post)]  # trace and warm up
  for _ in range(repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      [g.numpy() for g in step(dots, pre, post)]
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(values) for name, values in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--heads", default="12,24,48")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--rows_per_block", type=int, default=0,
                      help="query rows per kernel block; 0 picks by size")
  args = parser.parse_args()
  print(f"J -> U forward+backward, [{args.batch}, h, {args.length}, "
        f"{args.length}], medians of {args.repeats}\n")
  print("| h | TF ops (ms) | fused (ms) | TF ops / fused |")
  print("|---|---:|---:|---:|")
  for heads in map(int, args.heads.split(",")):
    t = time_heads(heads, args.batch, args.length, args.repeats,
                   args.rows_per_block)
    print(f"| {heads} | {t['TF ops'] * 1e3:.0f} | {t['fused'] * 1e3:.0f} | "
          f"{t['TF ops'] / t['fused']:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
