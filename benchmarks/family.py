"""The family after talking heads against multi-head attention: step time
and memory, side by side in one process.

For each variant of the registry's family (talking heads, DCMHA, gated
attention element-wise and head-wise, differential attention) and
multi-head attention, at the same shape (h heads of d_k = width / h):

- `layer`: one self-attention layer's forward and backward pass (the
  gradient of mean(Y^2) with respect to the input and every weight),
  causal, on tf_keras (`thattn.layers`, in a `tf.function`) and on Keras 3
  (`thattn.keras3` on JAX, under `jax.jit`);
- `lm_tiny`: one gradient step of the `lm_tiny` decoder LM (its
  next-token cross-entropy, no optimizer) on both fronts.

Configurations are interleaved round by round, so that a noisy machine's
drift hits them all alike; the median of --rounds rounds is reported,
with each variant's ratio to multi-head attention's time beside the ratio
of multiplies that `thattn-complexity` counts for the layer. Memory: on
JAX, what XLA's compiled step holds (its arguments, outputs and
temporaries, `memory_analysis()`); on TensorFlow, the CPU allocator's
peak during one step after a reset (each configuration in turn, in this
process).

    KERAS_BACKEND=jax python benchmarks/family.py --out DIR
    KERAS_BACKEND=jax python benchmarks/family.py --quick --out DIR  # smoke
"""

import argparse
import json
import os
import pathlib
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# TensorFlow's CPU allocator keeps memory statistics with oneDNN on
# (benchmarks/attention.py says why it is pinned).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import jax  # pylint: disable=g-import-not-at-top
import keras  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

from thattn import models  # pylint: disable=g-import-not-at-top
from thattn.core import complexity  # pylint: disable=g-import-not-at-top
from thattn.core import variants  # pylint: disable=g-import-not-at-top
from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top

tf.get_logger().setLevel("ERROR")  # each configuration traces its own step

VARIANTS = ("multi_head", "talking_heads", "dcmha", "gated",
            "gated_headwise", "differential")
FULL = dict(batch=8, length=256, width=256, heads=8, lm_batch=16,
            lm_length=64)
QUICK = dict(batch=2, length=16, width=32, heads=4, lm_batch=2,
             lm_length=8)


def _layer_steps(variant, sizes, rng):
  """{front: (step function, its arguments, memory bytes or None)}."""
  x = rng.normal(size=(sizes["batch"], sizes["length"],
                       sizes["width"])).astype("float32")
  key_dim = sizes["width"] // sizes["heads"]
  steps = {}
  tf_layer = variants.make_attention("tf_keras", variant, sizes["heads"],
                                     key_dim)
  tf_layer(x, x)
  tf_x = tf.constant(x)

  @tf.function
  def tf_step(inputs):
    with tf.GradientTape() as tape:
      tape.watch(inputs)
      loss = tf.reduce_mean(tf.square(tf_layer(inputs, inputs,
                                               use_causal_mask=True)))
    return tape.gradient(loss, [inputs] + tf_layer.trainable_weights)

  steps["tf_keras"] = (lambda: [g.numpy() for g in tf_step(tf_x)][0], None)
  k_layer = variants.make_attention("keras3", variant, sizes["heads"],
                                    key_dim)
  k_layer(x, x)
  values = [w.value for w in k_layer.trainable_weights]
  compiled = jax.jit(jax.grad(
      lambda weights, inputs: _stateless_loss(k_layer, weights, inputs),
      argnums=(0, 1))).lower(values, jax.numpy.asarray(x)).compile()
  jx = jax.numpy.asarray(x)
  steps["keras3 (JAX)"] = (
      lambda: jax.block_until_ready(compiled(values, jx)),
      _xla_bytes(compiled))
  return steps


def _stateless_loss(layer, weights, inputs):
  """mean(Y^2) of `layer` with its trainable weights set to `weights`,
  without touching its variables (Keras 3's stateless_call)."""
  output, _ = layer.stateless_call(
      weights, [w.value for w in layer.non_trainable_weights], inputs,
      inputs, use_causal_mask=True)
  return keras.ops.mean(keras.ops.square(output))


def _lm_steps(variant, sizes, rng):
  tokens = rng.integers(0, 128, size=(sizes["lm_batch"],
                                      sizes["lm_length"])).astype("int32")
  inputs, labels = tokens[:, :-1], tokens[:, 1:]
  steps = {}
  tf_model = models.create_model("lm_tiny", attention=variant)
  tf_inputs = {"decoder_input_tokens": tf.constant(inputs)}
  tf_labels = tf.constant(labels)

  @tf.function
  def tf_step():
    with tf.GradientTape() as tape:
      logits = tf_model(tf_inputs, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          tf_labels, logits))
    return tape.gradient(loss, tf_model.trainable_weights)

  steps["tf_keras"] = (lambda: [g.numpy() for g in tf_step()][0], None)
  k_model = keras3_models.create_model("lm_tiny", attention=variant)
  k_inputs = {"decoder_input_tokens": jax.numpy.asarray(inputs)}
  k_model(k_inputs)
  trainable = [w.value for w in k_model.trainable_weights]
  frozen = [w.value for w in k_model.non_trainable_weights]
  jl = jax.numpy.asarray(labels)

  def loss(weights):
    logits, _ = k_model.stateless_call(weights, frozen, k_inputs,
                                       training=True)
    return keras.ops.mean(keras.ops.sparse_categorical_crossentropy(
        jl, logits, from_logits=True))

  compiled = jax.jit(jax.grad(loss)).lower(trainable).compile()
  steps["keras3 (JAX)"] = (
      lambda: jax.block_until_ready(compiled(trainable)),
      _xla_bytes(compiled))
  return steps


def _xla_bytes(compiled):
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes +
          analysis.temp_size_in_bytes)


def _tf_peak(step):
  """The TensorFlow CPU allocator's peak bytes during one call of `step`
  (called once before, so that tracing is not in it)."""
  step()
  try:
    tf.config.experimental.reset_memory_stats("CPU:0")
    step()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"]
  except (ValueError, tf.errors.InvalidArgumentError):
    return None


def _median_times(steps, rounds):
  """{key: median seconds}, the keys' steps interleaved round by round,
  after a warm-up call each."""
  for step, _ in steps.values():
    step()
  times = {key: [] for key in steps}
  for _ in range(rounds):
    for key, (step, _) in steps.items():
      start = time.perf_counter()
      step()
      times[key].append(time.perf_counter() - start)
  return {key: statistics.median(values) for key, values in times.items()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--rounds", type=int, default=15)
  args = parser.parse_args()
  sizes = QUICK if args.quick else FULL
  rng = np.random.default_rng(0)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  results = []
  for what, make in (("layer", _layer_steps), ("lm_tiny", _lm_steps)):
    steps, memory = {}, {}
    for variant in VARIANTS:
      for front, (step, xla_bytes) in make(variant, sizes, rng).items():
        steps[variant, front] = (step, None)
        memory[variant, front] = (xla_bytes if xla_bytes is not None
                                  else _tf_peak(step))
    medians = _median_times(steps, args.rounds)
    for (variant, front), seconds in medians.items():
      shape = complexity.variant_shape(
          variant, num_heads=sizes["heads"] if what == "layer" else 4,
          d_model=sizes["width"] if what == "layer" else 32,
          query_length=sizes["length"] if what == "layer" else
          sizes["lm_length"] - 1,
          memory_length=sizes["length"] if what == "layer" else
          sizes["lm_length"] - 1)
      results.append(dict(
          what=what, variant=variant, front=front, ms=1000 * seconds,
          ratio=seconds / medians["multi_head", front],
          memory_bytes=memory[variant, front],
          multiplies=complexity.multiplies(shape)))
  for row in results:
    base = next(r for r in results if r["what"] == row["what"] and
                r["front"] == row["front"] and r["variant"] == "multi_head")
    row["multiplies_ratio"] = row["multiplies"] / base["multiplies"]
    row["memory_ratio"] = (None if not row["memory_bytes"] or
                           not base["memory_bytes"] else
                           row["memory_bytes"] / base["memory_bytes"])
  (out / "results.json").write_text(json.dumps(
      dict(sizes=sizes, rounds=args.rounds, results=results), indent=2))
  lines = ["| step | front | variant | ms | time / MHA's | memory (MiB) | "
           "memory / MHA's | multiplies / MHA's (layer) |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
  for row in results:
    memory = ("-" if not row["memory_bytes"] else
              f"{row['memory_bytes'] / 2**20:.1f}")
    memory_ratio = ("-" if row["memory_ratio"] is None else
                    f"{row['memory_ratio']:.2f}x")
    lines.append(
        f"| {row['what']} | {row['front']} | {row['variant']} | "
        f"{row['ms']:.2f} | {row['ratio']:.2f}x | {memory} | "
        f"{memory_ratio} | {row['multiplies_ratio']:.2f}x |")
  (out / "results.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
