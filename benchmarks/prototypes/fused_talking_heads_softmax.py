"""Times the fused talking-heads softmax prototype against TensorFlow ops.

Build the op against the installed TensorFlow, then run this file:

    TF=$(python -c "import tensorflow as tf, os; print(os.path.dirname(tf.__file__))")
    g++ -O3 -march=native -shared -fPIC -Wno-deprecated-declarations \
        benchmarks/prototypes/fused_talking_heads_softmax.cc \
        -o /tmp/fused_talking_heads_softmax.so -I$TF/include \
        -D_GLIBCXX_USE_CXX11_ABI=1 --std=c++17 -DEIGEN_MAX_ALIGN_BYTES=64 \
        -L$TF -l:libtensorflow_framework.so.2
    H=24 python benchmarks/prototypes/fused_talking_heads_softmax.py

It checks the fused W and U against softmax(mix(J, P_l)) and its mix with
P_w as thattn computes them, then prints medians of 7 forward passes each,
at batch 8, length 512, h = h_k = h_v = $H.
"""

import os
import time

import numpy as np
import tensorflow as tf

LIBRARY = os.environ.get("FUSED_OP", "/tmp/fused_talking_heads_softmax.so")
HEADS = int(os.environ.get("H", "24"))
BATCH, LENGTH = 8, 512


def mix(scores, projection):
  """thattn.layers.attention_ops.mix_heads, inlined."""
  flat = tf.reshape(scores, [BATCH, HEADS, LENGTH * LENGTH])
  mixed = tf.linalg.matmul(projection, flat, transpose_a=True)
  return tf.reshape(mixed, [BATCH, HEADS, LENGTH, LENGTH])


def main():
  fused_op = tf.load_op_library(LIBRARY).talking_heads_softmax
  pre = tf.random.normal([HEADS, HEADS], seed=1) * 0.3
  post = tf.random.normal([HEADS, HEADS], seed=2) * 0.3
  dots = tf.random.normal([BATCH, HEADS, LENGTH, LENGTH], seed=3)

  @tf.function
  def tensorflow_ops(dots):
    weights = tf.nn.softmax(mix(dots, pre))
    return weights, mix(weights, post)

  @tf.function
  def fused(dots):
    return fused_op(dots, pre, post)

  for name, (expected, actual) in zip(
      ("W", "U"), zip(tensorflow_ops(dots), fused(dots))):
    print(f"max |fused - ops| {name}: "
          f"{float(tf.reduce_max(tf.abs(expected - actual))):.2e}")
  times = {"tensorflow ops": [], "fused": []}
  for _ in range(7):
    for name, function in (("tensorflow ops", tensorflow_ops),
                           ("fused", fused)):
      started = time.perf_counter()
      _ = [output.numpy() for output in function(dots)]
      times[name].append(time.perf_counter() - started)
  for name, values in times.items():
    print(f"{name}: {1000 * np.median(values):.1f} ms")


if __name__ == "__main__":
  main()
