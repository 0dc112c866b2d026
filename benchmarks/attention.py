"""Speed and memory of attention layers, side by side with the anchors.

Times a forward+backward pass of self-attention (the gradient with respect
to the input and every weight) for each configuration, in one process,
interleaving the configurations round by round so that drift on a noisy
machine hits them all alike. Then measures the peak memory of one training
step of each configuration in a fresh subprocess, so the numbers do not mix.

    TF_USE_LEGACY_KERAS=1 python benchmarks/attention.py            # full
    TF_USE_LEGACY_KERAS=1 python benchmarks/attention.py --quick    # smoke

Anchors: tf_keras.layers.MultiHeadAttention (biases off) and Model Garden's
TalkingHeadsAttention (tf-models-official, see benchmarks/README.md; skipped
if it is not installed). Writes a markdown table and JSON.

thattn's talking heads run as a user gets them (fused_kernel=None: the fused
CPU kernel wherever it applies) and, in the "TF ops" rows, with
fused_kernel=False, so the table shows what the kernel buys. The output
says whether the kernel was available. At h = 12 and 24 it also times the
variants (each dynamic projection alone and all four, head groups G = 2
and 4, a mixed_bfloat16 policy) and puts each against thattn's multi-head
attention beside the ratio of multiplies that `thattn-complexity` counts.
"""

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

# TensorFlow turns oneDNN on by default only on some x86 CPUs; without it,
# its CPU allocator keeps no memory statistics (reset_memory_stats("CPU:0")
# fails), which the peak-memory measurements need. Pin it on, before
# TensorFlow is imported, so every machine measures the same way.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

import tensorflow as tf
import tf_keras

from thattn.core import complexity
from thattn import layers
from thattn.kernels import talking_heads_softmax

FULL = dict(batch=8, length=512, width=768)
QUICK = dict(batch=2, length=64, width=96)


@dataclasses.dataclass(frozen=True)
class Config:
  name: str
  kind: str  # tf_keras_mha | thattn_mha | thattn_th | model_garden_th
  num_heads: int
  num_key_heads: int = 0
  num_value_heads: int = 0
  dynamic: tuple = ()  # Appendix A's dynamic projections, by name
  head_groups: int = 1  # G of grouped talking heads
  policy: str = ""  # a tf-keras mixed precision policy, e.g. mixed_bfloat16
  chunk_size: int = 0
  tensorflow_ops: bool = False  # thattn TH with fused_kernel=False

  def key_dim(self, width):
    return width // self.num_heads


def configs(chunk_size):
  out = []
  for h in (12, 24, 48):
    out += [Config(f"tf_keras MHA h={h}", "tf_keras_mha", h),
            Config(f"thattn MHA h={h}", "thattn_mha", h),
            Config(f"thattn TH h={h}", "thattn_th", h),
            Config(f"thattn TH h={h} TF ops", "thattn_th", h,
                   tensorflow_ops=True),
            Config(f"thattn MHA h={h} chunked", "thattn_mha", h,
                   chunk_size=chunk_size),
            Config(f"thattn TH h={h} chunked", "thattn_th", h,
                   chunk_size=chunk_size),
            Config(f"Model Garden TH h={h}", "model_garden_th", h)]
  out += [Config("thattn TH 6/24/6 h=24", "thattn_th", 24, 6, 6),
          Config("thattn TH 6/24/6 h=24 chunked", "thattn_th", 24, 6, 6,
                 chunk_size=chunk_size)]
  for h in (12, 24):  # the variants beyond static talking heads
    out += [Config(f"thattn TH {name} h={h}", "thattn_th", h,
                   dynamic=(name,)) for name in layers.DYNAMIC_PROJECTIONS]
    out += [Config(f"thattn TH dynamic h={h}", "thattn_th", h,
                   dynamic=layers.DYNAMIC_PROJECTIONS),
            Config(f"thattn TH dynamic h={h} TF ops", "thattn_th", h,
                   dynamic=layers.DYNAMIC_PROJECTIONS, tensorflow_ops=True)]
    out += [Config(f"thattn TH G={groups} h={h}", "thattn_th", h,
                   head_groups=groups) for groups in (2, 4)]
    out += [Config(f"thattn {kind} h={h} bfloat16", f"thattn_{kind.lower()}",
                   h, policy="mixed_bfloat16") for kind in ("MHA", "TH")]
    out += [Config(f"thattn TH h={h} bfloat16 TF ops", "thattn_th", h,
                   policy="mixed_bfloat16", tensorflow_ops=True)]
  return out


def make_layer(config, width):
  """The configuration's layer (under its mixed precision policy, if any)."""
  if not config.policy:
    return _make_layer(config, width)
  tf_keras.mixed_precision.set_global_policy(config.policy)
  try:
    return _make_layer(config, width)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")


def _make_layer(config, width):
  key_dim = config.key_dim(width)
  if config.kind == "tf_keras_mha":
    return tf_keras.layers.MultiHeadAttention(config.num_heads, key_dim,
                                              use_bias=False)
  chunking = {"query_chunk_size": config.chunk_size or None}
  if config.kind == "thattn_mha":
    return layers.MultiHeadAttention(config.num_heads, key_dim, **chunking)
  if config.kind == "thattn_th":
    # For 6/24/6, keep the parameters of the square case: d_k scales up.
    h_k = config.num_key_heads or config.num_heads
    return layers.TalkingHeadsAttention(
        config.num_heads, width // h_k, num_key_heads=h_k,
        num_value_heads=config.num_value_heads or config.num_heads,
        dynamic_projections=config.dynamic,
        num_head_groups=config.head_groups,
        fused_kernel=False if config.tensorflow_ops else None, **chunking)
  if config.kind == "model_garden_th":
    from official.nlp.modeling.layers import TalkingHeadsAttention  # pylint: disable=g-import-not-at-top
    return TalkingHeadsAttention(config.num_heads, key_dim, use_bias=False)
  raise ValueError(f"Unknown kind {config.kind!r}.")


def model_garden_available():
  try:
    import official.nlp.modeling.layers  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


def make_step(layer, x, jit_compile=False):
  """A compiled forward+backward step; returns the loss."""
  layer(x, x)  # create the weights eagerly

  @tf.function(jit_compile=jit_compile)
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      # float32 under a mixed precision policy too.
      loss = tf.reduce_sum(tf.square(tf.cast(layer(x, x), tf.float32)))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    # Reduce each gradient so nothing can be pruned, cheaply.
    return loss + tf.add_n(
        [tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads]) * 0.0

  return step


def time_all(selected, sizes, repeats, jit_compile):
  x = tf.random.normal([sizes["batch"], sizes["length"], sizes["width"]])
  steps = {}
  for config in selected:
    steps[config.name] = make_step(make_layer(config, sizes["width"]), x,
                                   jit_compile)
    for _ in range(2):  # trace, then warm up
      steps[config.name](x).numpy()
  times = {name: [] for name in steps}
  for _ in range(repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      step(x).numpy()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(values) for name, values in times.items()}


def measure_memory_in_this_process(config, sizes):
  """Peak allocator bytes of one training step beyond its inputs and weights.

  TensorFlow's CPU allocator keeps its own statistics, which count exactly
  the tensors a step allocates (unlike RSS, which also sees thread pools,
  kernels and the C heap). The step runs once to warm up, then the peak is
  reset and measured over a second run.
  """
  x = tf.random.normal([sizes["batch"], sizes["length"], sizes["width"]])
  step = make_step(make_layer(config, sizes["width"]), x)
  step(x).numpy()
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  step(x).numpy()
  return tf.config.experimental.get_memory_info("CPU:0")["peak"] - before


def measure_memory(config, sizes):
  """Runs `measure_memory_in_this_process` in a fresh interpreter."""
  payload = json.dumps({"config": dataclasses.asdict(config), "sizes": sizes})
  result = subprocess.run(
      [sys.executable, __file__, "--memory_child", payload],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  if result.returncode != 0:
    raise RuntimeError(f"memory child for {config.name} failed:\n"
                       f"{result.stderr[-2000:]}")
  return int(result.stdout.strip().splitlines()[-1])


def ratio_rows(results):
  """Ratios that the issue asks for, where both sides were measured."""
  t = {name: r["seconds"] for name, r in results.items()}
  rows = []
  for h in (12, 24, 48):
    pairs = [(f"thattn TH / thattn MHA, h={h}", f"thattn TH h={h}",
              f"thattn MHA h={h}"),
             (f"thattn TH / thattn MHA, both chunked, h={h}",
              f"thattn TH h={h} chunked", f"thattn MHA h={h} chunked"),
             (f"Model Garden TH / thattn TH chunked, h={h}",
              f"Model Garden TH h={h}", f"thattn TH h={h} chunked"),
             (f"thattn MHA chunked / tf_keras MHA, h={h}",
              f"thattn MHA h={h} chunked", f"tf_keras MHA h={h}"),
             (f"Model Garden TH / thattn TH, h={h}",
              f"Model Garden TH h={h}", f"thattn TH h={h}"),
             (f"thattn MHA / tf_keras MHA, h={h}", f"thattn MHA h={h}",
              f"tf_keras MHA h={h}"),
             (f"thattn TH TF ops / thattn TH (fused kernel), h={h}",
              f"thattn TH h={h} TF ops", f"thattn TH h={h}"),
             (f"thattn TH TF ops / thattn MHA, h={h}",
              f"thattn TH h={h} TF ops", f"thattn MHA h={h}"),
             (f"thattn TH dynamic TF ops / thattn TH dynamic (fused), h={h}",
              f"thattn TH dynamic h={h} TF ops", f"thattn TH dynamic h={h}"),
             (f"thattn TH G=2 / thattn TH, h={h}", f"thattn TH G=2 h={h}",
              f"thattn TH h={h}"),
             (f"thattn TH bfloat16 / thattn TH float32, h={h}",
              f"thattn TH h={h} bfloat16", f"thattn TH h={h}"),
             (f"thattn TH bfloat16 TF ops / thattn TH bfloat16 (fused), h={h}",
              f"thattn TH h={h} bfloat16 TF ops", f"thattn TH h={h} bfloat16")]
    for label, top, bottom in pairs:
      if top in t and bottom in t:
        rows.append((label, t[top] / t[bottom]))
  return rows


def multiplies(config, sizes):
  """Multiplies of one example's attention, as `thattn-complexity` counts."""
  return complexity.multiplies(complexity.AttentionShape(
      variant="talking_heads" if config.kind == "thattn_th" else "multi_head",
      num_heads=config.num_heads, key_dim=config.key_dim(sizes["width"]),
      dynamic_projections=config.dynamic,
      num_head_groups=config.head_groups, d_model=sizes["width"],
      query_length=sizes["length"], memory_length=sizes["length"]))


def variant_rows(results, sizes):
  """(label, time ratio, multiplies ratio) of each talking-heads variant
  against thattn's multi-head attention at the same h and precision."""
  by_name = {c.name: c for c in configs(0)}
  rows = []
  for name, result in results.items():
    config = by_name.get(name)
    plain = (config and config.kind == "thattn_th" and not config.chunk_size
             and not config.num_key_heads and (
                 config.dynamic or config.head_groups > 1 or config.policy))
    suffix = " bfloat16" if config and config.policy else ""
    anchor = f"thattn MHA h={config.num_heads}{suffix}" if config else ""
    if plain and anchor in results:
      rows.append((f"{name} / {anchor}",
                   result["seconds"] / results[anchor]["seconds"],
                   multiplies(config, sizes) /
                   multiplies(by_name[anchor], sizes)))
  return rows


def memory_ratio_rows(results):
  """Peak training-step memory of talking heads relative to multi-head."""
  rows = []
  for h in (12, 24, 48):
    for top, bottom in ((f"thattn TH h={h}", f"thattn MHA h={h}"),
                        (f"thattn TH h={h} TF ops", f"thattn MHA h={h}"),
                        (f"thattn TH h={h} chunked",
                         f"thattn MHA h={h} chunked")):
      top_bytes = results.get(top, {}).get("peak_bytes")
      bottom_bytes = results.get(bottom, {}).get("peak_bytes")
      if top_bytes and bottom_bytes:
        rows.append((f"memory: {top} / {bottom}", top_bytes / bottom_bytes))
  return rows


def kernel_status():
  """"available", or why thattn's fused kernel cannot run here."""
  reason = talking_heads_softmax.unsupported_reason(tf.zeros([1, 1, 1, 1]))
  return reason or "available"


def markdown(results, sizes, ratios, kernel, variants=()):
  lines = [f"Forward+backward self-attention, batch {sizes['batch']}, length "
           f"{sizes['length']}, width {sizes['width']}, float32.",
           f"Fused talking-heads kernel: {kernel}.", "",
           "| configuration | median step (ms) | peak step memory (MiB) |",
           "|---|---|---|"]
  for name, r in results.items():
    memory = r.get("peak_bytes")
    memory_text = "" if memory is None else f"{memory / 2**20:.0f}"
    lines.append(f"| {name} | {r['seconds'] * 1e3:.0f} | {memory_text} |")
  lines += ["", "| ratio | value |", "|---|---|"]
  lines += [f"| {label} | {value:.2f}x |" for label, value in ratios]
  if variants:
    lines += ["", "| variant / multi-head | time | multiplies |",
              "|---|---|---|"]
    lines += [f"| {label} | {time_ratio:.2f}x | {multiply_ratio:.2f}x |"
              for label, time_ratio, multiply_ratio in variants]
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes, for smoke runs")
  parser.add_argument("--repeats", type=int, default=None)
  parser.add_argument("--only", default="",
                      help="comma-separated substrings of config names")
  parser.add_argument("--skip", default="",
                      help="comma-separated substrings of config names to "
                      "leave out (applied after --only)")
  parser.add_argument("--no_memory", action="store_true")
  parser.add_argument("--chunk_size", type=int, default=128,
                      help="query_chunk_size of the chunked configurations")
  parser.add_argument("--jit_compile", action="store_true",
                      help="compile the steps with XLA")
  parser.add_argument("--out", default="benchmarks/results/attention")
  parser.add_argument("--memory_child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()

  if args.memory_child:
    payload = json.loads(args.memory_child)
    print(measure_memory_in_this_process(Config(**payload["config"]),
                                         payload["sizes"]))
    return

  sizes = QUICK if args.quick else FULL
  repeats = args.repeats or (3 if args.quick else 7)
  selected = [c for c in configs(args.chunk_size)
              if c.kind != "model_garden_th" or model_garden_available()]
  if args.only:
    wanted = args.only.split(",")
    selected = [c for c in selected if any(w in c.name for w in wanted)]
  if args.skip:
    unwanted = args.skip.split(",")
    selected = [c for c in selected
                if not any(w in c.name for w in unwanted)]
  seconds = time_all(selected, sizes, repeats, args.jit_compile)
  results = {c.name: {"seconds": seconds[c.name]} for c in selected}
  if not args.no_memory:
    for config in selected:
      results[config.name]["peak_bytes"] = measure_memory(config, sizes)
  ratios = ratio_rows(results) + memory_ratio_rows(results)
  variants = variant_rows(results, sizes)
  kernel = kernel_status()
  table = markdown(results, sizes, ratios, kernel, variants)
  print(table)
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with open(args.out + ".md", "w") as f:
    f.write(table)
  with open(args.out + ".json", "w") as f:
    json.dump({"sizes": sizes, "repeats": repeats,
               "jit_compile": args.jit_compile, "fused_kernel": kernel,
               "results": results, "ratios": dict(ratios),
               "variants": {label: {"time": time_ratio,
                                    "multiplies": multiply_ratio}
                            for label, time_ratio, multiply_ratio in variants}},
              f, indent=2)


if __name__ == "__main__":
  main()
