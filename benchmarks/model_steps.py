"""Keras 3 models on a GPU: thattn's BERT-base and T5-base steps against a
plain-JAX BERT and KerasHub's BertBackbone, in one process.

Timed under `jax.jit`, `mixed_bfloat16` (float32 weights, bfloat16
compute), a constant number of tokens per step (the batch shrinks as the
sequence grows), dropout 0, median of --repeats steps after two warm-ups:

- `fwd+bwd`: the gradient of mean(sequence_output^2) with respect to every
  weight (the encoder alone; no optimizer), for
  - `JAX reference (cuDNN)`: BERT written here in plain JAX, attention by
    `jax.nn.dot_product_attention(implementation="cudnn")` with key
    lengths; the word embedding by a gather, token types by selection (as
    original BERT avoids a scatter for them), layer norms in float32;
  - `JAX reference (XLA)`: the same with `implementation="xla"` and the
    padding mask;
  - `KerasHub BertBackbone` (keras-hub), where it imports;
  - `thattn MHA`, `thattn TH h=12/24/48`: `thattn.keras3.models.
    create_model("bert_base", attention=..., num_heads=h)` (width 768, so
    d_k = 768 / h);
  - diagnostics: the thattn and reference models with the token types
    looked up by a gather (the constant this benchmark was written to
    find), thattn MHA with `cudnn.VERIFY_PREFIX = False` (the padding
    mask trusted to be a prefix: what making it one costs), and with
    `cudnn.REORDER_KEYS = False` (the prefix check's `lax.cond` instead
    of reordering the keys);
- `train step`: one step of `--backend=keras3`'s training (`thattn.
  training.keras3_steps.Steps`: masked LM on BERT, span corruption on T5,
  Adafactor with the inverse-square-root schedule), batch from the host.

Also measured: each embedding gradient alone (gather against selection),
the cuDNN path of thattn's multi-head attention against its keras.ops core
for the masks models use, whether the compiled steps call cuDNN's fused
attention or a Pallas kernel, and every warning logged while timing.

Needs JAX and Keras 3; not TensorFlow. From the repository root:

    python benchmarks/model_steps.py --out DIR          # the full run
    python benchmarks/model_steps.py --quick --out DIR  # tiny sizes (CPU)

It writes results.json and results.md into --out after every measurement;
--budget (seconds) stops starting new ones.
"""

import argparse
import contextlib
import json
import logging
import os
import pathlib
import statistics
import sys
import time
import traceback

os.environ.setdefault("KERAS_BACKEND", "jax")
# Allocate on demand: a step's peak is then what it needs, and Triton's
# spilled registers (Pallas) find memory outside JAX's pool.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import keras  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

# accelerator.py sits beside this script (sys.path[0] when it runs).
from accelerator import table_cell  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.kernels import cudnn  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.keras3 import lookups  # pylint: disable=g-import-not-at-top,wrong-import-position

FULL = dict(tokens=16384, lengths=(512, 128), heads=(12, 24, 48),
            model={}, vocab_size=30522, d_model=768, num_heads=12,
            num_layers=12, d_ff=3072, repeats=10)
QUICK = dict(tokens=64, lengths=(16,), heads=(4,),
             model=dict(d_model=32, num_layers=1, d_ff=64, num_heads=2,
                        vocab_size=128),
             vocab_size=128, d_model=32, num_heads=2, num_layers=1, d_ff=64,
             repeats=2)
POLICY = "mixed_bfloat16"


class WarningCounter(logging.Handler):
  """Counts the warnings any logger emits (Keras logs a failed cuDNN call
  and its fallback this way)."""

  def __init__(self):
    super().__init__(level=logging.WARNING)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage()[:200])


def median_ms(run, repeats):
  """Compile-and-first-run seconds, and the median ms of `repeats` runs
  after a second warm-up; `run()` returns something to block on."""
  start = time.perf_counter()
  jax.block_until_ready(run())
  first = time.perf_counter() - start
  jax.block_until_ready(run())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(run())
    times.append((time.perf_counter() - start) * 1e3)
  return first, statistics.median(times)


def scatter_shapes(hlo_text):
  """The result shapes of the scatters in an HLO module's text, e.g.
  ["f32[30522,768]"]: each an embedding gradient written by scatter-add."""
  shapes = []
  for line in hlo_text.splitlines():
    if " scatter(" in line and "=" in line:
      shapes.append(line.split("=", 1)[1].split()[0].split("{")[0])
  return shapes


def compiled_calls(compiled):
  """Which fused attention kernels a compiled step calls, and its
  scatters."""
  text = compiled.as_text()
  return {"cudnn_attention": "fmha" in text,
          # A Pallas kernel is a custom call to Triton (XLA's own Triton
          # fusions are not).
          "pallas": "__gpu$xla.gpu.triton" in text,
          "scatter": " ".join(sorted(set(scatter_shapes(text)))) or "none"}


# ---- the inputs ------------------------------------------------------------


def bert_inputs(batch, length, vocab_size, seed=0):
  """Word ids, a padding mask with lengths in [length / 2, length] (a
  prefix, as BERT's), and two token types split at a random point."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(length // 2, length + 1, size=batch)
  positions = np.arange(length)
  mask = (positions[None] < lengths[:, None]).astype("int32")
  words = rng.integers(1, vocab_size, size=(batch, length)) * mask
  split = rng.integers(1, length, size=batch)
  types = (positions[None] >= split[:, None]).astype("int32") * mask
  return {"input_word_ids": words.astype("int32"), "input_mask": mask,
          "input_type_ids": types}


# ---- the plain-JAX reference -----------------------------------------------


def reference_params(sizes, seed=0):
  """BERT's weights, float32, normal(0.02) as BERT initializes them."""
  d, f = sizes["d_model"], sizes["d_ff"]
  keys = iter(jax.random.split(jax.random.PRNGKey(seed),
                               8 * sizes["num_layers"] + 8))

  def normal(*shape):
    return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

  def norm():
    return {"scale": jnp.ones((d,)), "bias": jnp.zeros((d,))}

  layers = [{"qkv": normal(d, 3 * d), "qkv_bias": jnp.zeros((3 * d,)),
             "out": normal(d, d), "out_bias": jnp.zeros((d,)),
             "norm1": norm(), "ff1": normal(d, f), "ff1_bias": jnp.zeros((f,)),
             "ff2": normal(f, d), "ff2_bias": jnp.zeros((d,)), "norm2": norm()}
            for _ in range(sizes["num_layers"])]
  return {"words": normal(sizes["vocab_size"], d), "positions": normal(512, d),
          "types": normal(2, d), "norm": norm(), "layers": layers,
          "pooler": normal(d, d), "pooler_bias": jnp.zeros((d,))}


def _layer_norm(x, params, epsilon=1e-12):
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, -1, keepdims=True)
  variance = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
  y = (x - mean) * jax.lax.rsqrt(variance + epsilon)
  return (y * params["scale"] + params["bias"]).astype(jnp.bfloat16)


def _dense(x, kernel, bias):
  return x @ kernel.astype(jnp.bfloat16) + bias.astype(jnp.bfloat16)


def reference_forward(params, inputs, heads, implementation,
                      types_by_gather=False):
  """BERT's sequence output [b, n, d] in plain JAX, bfloat16 compute."""
  words, mask = inputs["input_word_ids"], inputs["input_mask"]
  batch, length = words.shape
  if types_by_gather:
    types = jnp.take(params["types"], inputs["input_type_ids"], axis=0)
  else:
    types = jnp.where(inputs["input_type_ids"][..., None] == 1,
                      params["types"][1], params["types"][0])
  x = (jnp.take(params["words"], words, axis=0) +
       params["positions"][:length][None] + types)
  x = _layer_norm(x, params["norm"])
  lengths = jnp.sum(mask, -1, dtype=jnp.int32)
  key_mask = mask.astype(bool)[:, None, None, :]
  for layer in params["layers"]:
    q, k, v = jnp.split(_dense(x, layer["qkv"], layer["qkv_bias"]), 3, -1)
    q, k, v = (t.reshape(batch, length, heads, -1) for t in (q, k, v))
    if implementation == "cudnn":
      context = jax.nn.dot_product_attention(
          q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
    else:
      context = jax.nn.dot_product_attention(q, k, v, mask=key_mask,
                                             implementation="xla")
    attended = _dense(context.reshape(batch, length, -1), layer["out"],
                      layer["out_bias"])
    x = _layer_norm(x + attended, layer["norm1"])
    hidden = jax.nn.gelu(_dense(x, layer["ff1"], layer["ff1_bias"]),
                         approximate=False)
    x = _layer_norm(x + _dense(hidden, layer["ff2"], layer["ff2_bias"]),
                    layer["norm2"])
  jnp.tanh(_dense(x[:, 0], params["pooler"], params["pooler_bias"]))
  return x


def reference_step(sizes, inputs, implementation, types_by_gather=False):
  params = reference_params(sizes)

  def loss(params, inputs):
    out = reference_forward(params, inputs, sizes["num_heads"],
                            implementation, types_by_gather)
    return jnp.mean(jnp.square(out.astype(jnp.float32)))

  return jax.jit(jax.grad(loss)), (params, inputs)


# ---- Keras models ----------------------------------------------------------


def keras_step(model, inputs):
  """jit(grad) of mean(sequence_output^2) over a Keras model's weights."""

  def loss(trainable, non_trainable, inputs):
    outputs, _ = model.stateless_call(trainable, non_trainable, inputs)
    return jnp.mean(jnp.square(outputs["sequence_output"].astype(
        jnp.float32)))

  trainable = [v.value for v in model.trainable_variables]
  non_trainable = [v.value for v in model.non_trainable_variables]
  return jax.jit(jax.grad(loss)), (trainable, non_trainable, inputs)


def thattn_bert(sizes, attention="multi_head", heads=None):
  from thattn.keras3 import models  # pylint: disable=g-import-not-at-top
  overrides = dict(sizes["model"], attention=attention, dropout_rate=0.0)
  if heads is not None:
    overrides["num_heads"] = heads
  with policy_scope():
    return models.create_model("bert_base", **overrides)


def kerashub_bert(sizes):
  import keras_hub  # pylint: disable=g-import-not-at-top
  return keras_hub.models.BertBackbone(
      vocabulary_size=sizes["vocab_size"], num_layers=sizes["num_layers"],
      num_heads=sizes["num_heads"], hidden_dim=sizes["d_model"],
      intermediate_dim=sizes["d_ff"], max_sequence_length=512,
      num_segments=2, dropout=0.0, dtype=POLICY)


def kerashub_inputs(inputs):
  return {"token_ids": inputs["input_word_ids"],
          "segment_ids": inputs["input_type_ids"],
          "padding_mask": inputs["input_mask"]}


def policy_scope():
  """Keras 3's global dtype policy mixed_bfloat16 while models are made
  (the scope `--backend=keras3 --mixed_precision=bfloat16` makes them in)."""
  from thattn.training import keras3_steps  # pylint: disable=g-import-not-at-top
  return keras3_steps.dtype_policy("bfloat16")


@contextlib.contextmanager
def gather_for_types():
  """Models traced inside look every table up by a gather (the lookup
  before `thattn.keras3.lookups`)."""
  previous, lookups.SMALL_VOCABULARY = lookups.SMALL_VOCABULARY, 0
  try:
    yield
  finally:
    lookups.SMALL_VOCABULARY = previous


def autocast_tables(model, *names):
  """The model with the named embedding layers autocast again (their
  tables gathered from a bfloat16 copy, as before TokenEmbedding read them
  in float32)."""
  for name in names:
    model.get_layer(name).autocast = True
  return model


@contextlib.contextmanager
def cudnn_switch(name, value):
  """Steps traced inside see `thattn.kernels.cudnn.<name> = value`
  (VERIFY_PREFIX False: key masks passed as lengths unchecked;
  REORDER_KEYS False: checked by a lax.cond, keys not reordered)."""
  previous = getattr(cudnn, name)
  setattr(cudnn, name, value)
  try:
    yield
  finally:
    setattr(cudnn, name, previous)


def under(context, run):
  """`run` with `context()` entered around it."""
  def wrapped():
    with context():
      return run()
  return wrapped


def train_step(sizes, family, attention, heads, batch, length):
  """One `--backend=keras3` train step of thattn's model (Steps), and its
  batch."""
  from thattn.keras3 import optimizers  # pylint: disable=g-import-not-at-top
  from thattn.models import presets  # pylint: disable=g-import-not-at-top
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.training import keras3_steps  # pylint: disable=g-import-not-at-top
  overrides = dict(sizes["model"], attention=attention, dropout_rate=0.0)
  if heads is not None:
    overrides["num_heads"] = heads
  preset = "bert_base" if family == "BERT" else "t5_base"
  if family == "T5" and "max_position_embeddings" in overrides:
    del overrides["max_position_embeddings"]
  config = presets.model_config(preset, **overrides)
  with policy_scope():
    task = keras3_steps.TaskLoss(
        tasks.get("mlm" if family == "BERT" else "span_corruption"), config)
  optimizer = optimizers.Adafactor(optimizers.InverseSqrtSchedule(
      warmup_steps=100, scale=0.01 * 10))
  steps = keras3_steps.Steps(task, optimizer)
  rng = np.random.default_rng(1)
  vocab = config.vocab_size
  if family == "BERT":
    data = bert_inputs(batch, length, vocab)
    predictions = max(1, int(0.15 * length))
    data.update(
        masked_lm_positions=np.sort(rng.integers(
            1, length // 2, size=(batch, predictions)), -1).astype("int32"),
        masked_lm_ids=rng.integers(1, vocab, size=(
            batch, predictions)).astype("int32"),
        masked_lm_weights=np.ones((batch, predictions), "float32"))
  else:
    data = {"inputs": rng.integers(1, vocab, size=(batch, length)),
            "targets": rng.integers(1, vocab, size=(batch, length))}
  return steps, data


# ---- diagnostics -----------------------------------------------------------


def embedding_gradients(sizes, batch, length):
  """ms of the gradient of each table lookup alone: gather against
  selection (what `thattn.keras3.lookups` chooses)."""
  rng = np.random.default_rng(2)
  d, heads = sizes["d_model"], sizes["num_heads"]
  words = rng.integers(1, sizes["vocab_size"], size=(batch, length))
  padded = np.where(rng.random((batch, length)) < 0.5, 0, words)
  cases = {
      "token types, 2 x d": ((2, d), rng.integers(0, 2, (batch, length))),
      "T5 buckets, 32 x h, n x n ids": ((32, heads),
                                        rng.integers(0, 32, (length, length))),
      "words, random ids": ((sizes["vocab_size"], d), words),
      "words, half padding (id 0)": ((sizes["vocab_size"], d), padded),
  }
  results = {}
  for name, (shape, ids) in cases.items():
    table = jnp.asarray(rng.normal(size=shape), jnp.float32)
    ids = jnp.asarray(ids, jnp.int32)
    row = {}
    for how, lookup in (("gather", lambda t, i: jnp.take(t, i, axis=0)),
                        ("selection", lookups.select_rows)):
      if how == "selection" and shape[0] > 64:
        continue  # selection is for small tables

      def loss(table, ids, lookup=lookup):
        return jnp.sum(jnp.square(lookup(table, ids).astype(jnp.bfloat16)
                                  .astype(jnp.float32)))

      step = jax.jit(jax.grad(loss))
      _, row[how] = median_ms(lambda step=step: step(table, ids),
                              sizes["repeats"])
    results[name] = row
  return results


def cudnn_against_core(sizes):
  """thattn's multi-head attention on its default path (cuDNN on a GPU)
  against its keras.ops core (flash_attention=False), forward and the
  input's gradient, for BERT's and T5's masks: relative L2 errors."""
  from thattn import keras3  # pylint: disable=g-import-not-at-top
  heads, d = sizes["num_heads"], sizes["d_model"]
  batch, length = 4, 64
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(batch, length, d)), jnp.float32)
  lengths = np.array([64, 40, 17, 1])
  prefix = np.arange(length)[None] < lengths[:, None]
  holes = prefix.copy()
  holes[1, 5] = False  # not a prefix: keys reordered, or XLA with a bias
  empty = prefix.copy()
  empty[3] = False  # no key at all: the mean of V
  bias = jnp.asarray(rng.normal(size=(1, heads, length, length)), jnp.float32)
  cases = {"padding (prefix)": dict(mask=prefix),
           "padding with a hole": dict(mask=holes),
           "padding with an empty row": dict(mask=empty),
           "causal": dict(causal=True),
           "causal + padding": dict(mask=prefix, causal=True),
           "T5 bias + causal": dict(bias=bias, causal=True),
           "T5 bias + padding": dict(bias=bias, mask=prefix),
           "T5 bias + padding with a hole": dict(bias=bias, mask=holes)}
  with policy_scope():
    fast = keras3.MultiHeadAttention(heads, d // heads, name="fast")
    core = keras3.MultiHeadAttention(heads, d // heads, name="core",
                                     flash_attention=False)
  fast.build((batch, length, d), (batch, length, d))
  core.build((batch, length, d), (batch, length, d))
  core.set_weights(fast.get_weights())
  results = {}
  for name, case in cases.items():
    mask = case.get("mask")
    mask = None if mask is None else jnp.asarray(mask[:, None, :])

    def run(layer, x, case=case, mask=mask):
      return layer(x, x, attention_mask=mask,
                   use_causal_mask=case.get("causal", False),
                   position_bias=case.get("bias")).astype(jnp.float32)

    def grad(layer, x, run=run):
      return jax.grad(lambda x: jnp.sum(jnp.square(run(layer, x))))(x)

    errors = {}
    for what, fn in (("output", run), ("grad", grad)):
      got = np.asarray(fn(fast, x), np.float32)
      want = np.asarray(fn(core, x), np.float32)
      errors[what] = float(np.linalg.norm(got - want) /
                           max(np.linalg.norm(want), 1e-30))
    results[name] = errors
  return results


# ---- the report ------------------------------------------------------------


def markdown(report):
  lines = [f"# Keras 3 models: {report['device']}", "",
           f"jax {report['jax']}, keras {report['keras']}, {POLICY}, "
           f"{report['tokens']} tokens per step; ms = median.", ""]
  lines += ["## fwd+bwd (encoder, mean square of sequence_output)", "",
            "| n | model | ms | / JAX cuDNN | / KerasHub | compile s | "
            "cuDNN attention | Pallas | scatter | warnings |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for length, rows in report["fwd_bwd"].items():
    anchor = rows.get("JAX reference (cuDNN)", {}).get("ms")
    hub = rows.get("KerasHub BertBackbone", {}).get("ms")
    for name, row in rows.items():
      if "ms" not in row:
        lines.append(f"| {length} | {name} | {row.get('error', '-')} |"
                     " | | | | | | |")
        continue
      ratio = (lambda a, ms=row["ms"]: f"{ms / a:.2f}x" if a else "-")
      calls = row.get("calls", {})
      lines.append(
          f"| {length} | {name} | {row['ms']:.2f} | {ratio(anchor)} | "
          f"{ratio(hub)} | {row['compile_s']:.1f} | "
          f"{calls.get('cudnn_attention', '-')} | "
          f"{calls.get('pallas', '-')} | "
          f"{calls.get('scatter', '-')} | {row.get('warnings', '-')} |")
  lines += ["", "## train step (Steps, Adafactor)", "",
            "| n | model | ms | compile s |", "|---|---|---|---|"]
  for length, rows in report["train"].items():
    for name, row in rows.items():
      if "ms" in row:
        lines.append(f"| {length} | {name} | {row['ms']:.2f} | "
                     f"{row['compile_s']:.1f} |")
      else:
        lines.append(f"| {length} | {name} | {row.get('error')} | |")
  lines += ["", "## Embedding gradients alone (ms)", "",
            "| table | gather | selection |", "|---|---|---|"]
  for name, row in report["embedding_gradients"].items():
    cells = [f"{row[how]:.3f}" if how in row else "-"
             for how in ("gather", "selection")]
    lines.append(f"| {name} | {' | '.join(cells)} |")
  lines += ["", "## thattn MHA default path against its keras.ops core "
            "(relative L2)", "", "| mask | output | grad |", "|---|---|---|"]
  for name, row in report["cudnn_against_core"].items():
    lines.append(f"| {name} | {row['output']:.1e} | {row['grad']:.1e} |")
  lines += ["", f"Warnings logged while timing: {len(report['warnings'])}"]
  lines += [f"- {message}" for message in report["warnings"][:10]]
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--quick", action="store_true",
                      help="tiny sizes (the CPU test)")
  parser.add_argument("--budget", type=float, default=540.0,
                      help="seconds after which no measurement starts")
  parser.add_argument("--lengths", default=None,
                      help="comma-separated sequence lengths")
  args = parser.parse_args(argv)
  sizes = dict(QUICK if args.quick else FULL)
  if args.lengths:
    sizes["lengths"] = tuple(int(n) for n in args.lengths.split(","))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  device = jax.devices()[0]
  report = {"device": f"{device.platform}: {device.device_kind}",
            "jax": jax.__version__, "keras": keras.__version__,
            "tokens": sizes["tokens"], "fwd_bwd": {}, "train": {},
            "embedding_gradients": {}, "cudnn_against_core": {},
            "warnings": []}
  started = time.perf_counter()
  warnings_seen = WarningCounter()
  logging.getLogger().addHandler(warnings_seen)

  def save():
    report["warnings"] = warnings_seen.messages
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(markdown(report))

  def within_budget():
    return time.perf_counter() - started < args.budget

  def measure(table, key, name, make):
    if not within_budget():
      return
    if "cuDNN" in name and not cudnn.available():
      table.setdefault(key, {})[name] = {"error": "no cuDNN on this device"}
      return
    print(f"[{time.perf_counter() - started:6.1f}s] {key} {name}",
          flush=True)
    seen = len(warnings_seen.messages)
    try:
      row = make()
      row["warnings"] = len(warnings_seen.messages) - seen
      table.setdefault(key, {})[name] = row
    except Exception as error:  # pylint: disable=broad-except
      traceback.print_exc()
      table.setdefault(key, {})[name] = {
          "error": table_cell(f"{type(error).__name__}: {error}")}
    save()

  def fwd_bwd(make_step):
    def run():
      step, args_ = make_step()
      # Compiled once, ahead of time: the same executable is timed and
      # read for the kernels it calls.
      start = time.perf_counter()
      compiled = step.lower(*args_).compile()
      compile_s = time.perf_counter() - start
      _, ms = median_ms(lambda: compiled(*args_), sizes["repeats"])
      return {"ms": ms, "compile_s": compile_s,
              "calls": compiled_calls(compiled)}
    return run

  first_length = sizes["lengths"][0]
  for key, make in (
      ("cudnn_against_core", lambda: cudnn_against_core(sizes)),
      ("embedding_gradients", lambda: embedding_gradients(
          sizes, sizes["tokens"] // first_length, first_length))):
    scratch = {}
    measure(scratch, key, "cases", make)
    cases = dict(scratch.get(key, {}).get("cases", {}))
    cases.pop("warnings", None)
    report[key] = {} if "error" in cases else cases
    report.setdefault("errors", {})[key] = cases.get("error")
    save()
  # The comparison at every length first, then the diagnostics
  # at the first length: a run stopped by --budget keeps the former.
  table = report["fwd_bwd"]
  inputs_at = {}
  for length in sizes["lengths"]:
    batch = sizes["tokens"] // length
    inputs = inputs_at[length] = {k: jnp.asarray(v) for k, v in bert_inputs(
        batch, length, sizes["vocab_size"]).items()}
    for name, make_step in (
        ("JAX reference (cuDNN)",
         lambda: reference_step(sizes, inputs, "cudnn")),
        ("JAX reference (XLA)",
         lambda: reference_step(sizes, inputs, "xla")),
        ("thattn MHA", lambda: keras_step(thattn_bert(sizes), inputs)),
        ("KerasHub BertBackbone",
         lambda: keras_step(kerashub_bert(sizes), kerashub_inputs(inputs))),
        (f"thattn TH h={sizes['heads'][0]}",
         lambda: keras_step(thattn_bert(sizes, "talking_heads",
                                        sizes["heads"][0]), inputs)),
    ):
      measure(table, length, name, fwd_bwd(make_step))
  inputs = inputs_at[first_length]
  # Each diagnostic holds its setting while the step is traced.
  measure(table, first_length, "thattn MHA as before: tables autocast to "
          "bf16, token types by gather",
          under(gather_for_types, fwd_bwd(lambda: keras_step(
              autocast_tables(thattn_bert(sizes), "word_embeddings",
                              "type_embeddings"), inputs))))
  measure(table, first_length, "thattn MHA, word table autocast to bf16",
          fwd_bwd(lambda: keras_step(autocast_tables(
              thattn_bert(sizes), "word_embeddings"), inputs)))
  measure(table, first_length, "JAX reference (cuDNN), token types by "
          "gather", fwd_bwd(lambda: reference_step(
              sizes, inputs, "cudnn", types_by_gather=True)))
  for name, switch in (
      ("thattn MHA, key lengths unverified", ("VERIFY_PREFIX", False)),
      ("thattn MHA, prefix check by lax.cond", ("REORDER_KEYS", False))):
    measure(table, first_length, name, under(
        lambda switch=switch: cudnn_switch(*switch),
        fwd_bwd(lambda: keras_step(thattn_bert(sizes), inputs))))

  def train(family, attention, heads, length):
    def run():
      steps, data = train_step(sizes, family, attention, heads,
                               sizes["tokens"] // length, length)
      start = time.perf_counter()
      steps.train_step(data)
      first = time.perf_counter() - start
      steps.train_step(data)
      times = []
      for _ in range(sizes["repeats"]):
        start = time.perf_counter()
        steps.train_step(data)  # returns a float: synchronous
        times.append((time.perf_counter() - start) * 1e3)
      return {"ms": statistics.median(times), "compile_s": first}
    name = f"thattn {family} " + ("MHA" if heads is None else
                                  f"TH h={heads}")
    measure(report["train"], length, name, run)

  # Most wanted first: a run stopped by --budget keeps those.
  # --quick (the CPU test) trains one model of each family, one of each
  # attention: the code paths, in half the time.
  for length in sizes["lengths"]:
    train("BERT", "multi_head", None, length)
    if not args.quick:
      train("BERT", "talking_heads", sizes["heads"][0], length)
  for length in sizes["lengths"]:
    inputs = {k: jnp.asarray(v) for k, v in bert_inputs(
        sizes["tokens"] // length, length, sizes["vocab_size"]).items()}
    for heads in sizes["heads"][1:]:
      measure(report["fwd_bwd"], length, f"thattn TH h={heads}",
              fwd_bwd(lambda heads=heads, inputs=inputs: keras_step(
                  thattn_bert(sizes, "talking_heads", heads), inputs)))
  for length in sizes["lengths"]:
    if not args.quick:
      train("T5", "multi_head", None, length)
    train("T5", "talking_heads", sizes["heads"][0], length)
  save()
  print((out / "results.md").read_text())
  print(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
  main()
