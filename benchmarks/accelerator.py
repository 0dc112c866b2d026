"""Talking heads on a GPU: the Pallas kernel, keras.ops and flash MHA.

Forward+backward (the gradient with respect to the input and every weight,
under jax.jit) of one self-attention layer, bfloat16 compute
(`mixed_bfloat16`: float32 weights), width 768, at a constant number of
tokens (the batch shrinks as the sequence grows), for:

- `TH kernel`: thattn.keras3.TalkingHeadsAttention on the Pallas kernel
  (`thattn.kernels.pallas_kernel`), which never holds [b, h, n, m];
- `TH keras.ops`: the same layer with `fused_kernel=False` (einsums that
  hold the logits and weights, [b, h, n, m], forward and backward);
- `MHA flash`: keras.layers.MultiHeadAttention(flash_attention=True), which
  Keras routes through `keras.ops.dot_product_attention` to cuDNN's flash
  attention.

Each (heads, kind) and group of lengths runs in a process of its own (a
hung compile or an out-of-memory error stops only it), lengths
ascending, so the process's peak device memory after each length is
that length's peak. Also reported:
XLA's own plan of the step's memory (arguments + outputs + temporaries).
A first `check` process compares the compiled kernel with a float32 jnp
reference, forward and every gradient, on small cases.

Needs JAX with a GPU, and Keras 3; not TensorFlow. Run from the repository
root:

    python benchmarks/accelerator.py --out /tmp/accel      # the full run
    python benchmarks/accelerator.py --quick --out /tmp/q  # tiny sizes

It writes results.json and results.md into --out, after every measurement,
so a run stopped by its --budget (seconds) keeps what it measured.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = ("MHA flash", "TH kernel", "TH keras.ops")
FULL = dict(tokens=16384, width=768, heads=(12, 24, 48),
            lengths=(1024, 2048, 4096, 8192, 16384))
QUICK = dict(tokens=256, width=64, heads=(4,), lengths=(64, 128))


# ---- in the child processes ------------------------------------------------


def _layer(kind, heads, width):
  import keras  # pylint: disable=g-import-not-at-top
  from thattn import keras3  # pylint: disable=g-import-not-at-top
  policy = "mixed_bfloat16"
  if kind == "MHA flash":
    return keras.layers.MultiHeadAttention(heads, width // heads,
                                           use_bias=False,
                                           flash_attention=True,
                                           dtype=policy)
  return keras3.TalkingHeadsAttention(
      heads, width // heads, dtype=policy,
      fused_kernel=True if kind == "TH kernel" else False)


def _step(layer, x):
  """A jitted forward+backward step of `layer` and its inputs."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def loss(trainable, non_trainable, x):
    y, _ = layer.stateless_call(trainable, non_trainable, x, x)
    return jnp.mean(jnp.square(y.astype(jnp.float32)))

  trainable = [v.value for v in layer.trainable_variables]
  non_trainable = [v.value for v in layer.non_trainable_variables]
  step = jax.jit(jax.grad(loss, argnums=(0, 2)))
  return step, (trainable, non_trainable, x)


def _planned_bytes(compiled):
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes +
             analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)


def _measure(kind, heads, length, sizes, repeats):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  batch = max(1, sizes["tokens"] // length)
  x = jax.numpy.asarray(np.random.default_rng(0).normal(
      size=(batch, length, sizes["width"])).astype("float32"))
  layer = _layer(kind, heads, sizes["width"])
  layer(x[:1, :16], x[:1, :16])  # builds the weights
  step, args = _step(layer, x)
  start = time.perf_counter()
  compiled = step.lower(*args).compile()
  compile_s = time.perf_counter() - start
  result = dict(kind=kind, heads=heads, length=length, batch=batch,
                compile_s=round(compile_s, 1),
                planned_bytes=_planned_bytes(compiled))
  jax.block_until_ready(compiled(*args))  # warm-up
  times = []
  deadline = time.perf_counter() + 4.0
  while len(times) < repeats or (len(times) < 2 * repeats and
                                 time.perf_counter() < deadline):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  result["ms"] = round(1e3 * statistics.median(times), 3)
  result["ms_spread"] = round(1e3 * (max(times) - min(times)), 3)
  stats = jax.devices()[0].memory_stats() or {}
  result["peak_bytes"] = stats.get("peak_bytes_in_use")
  return result


def child_measure(spec):
  """Measures one (kind, heads) over the lengths; prints a JSON line each."""
  sizes = spec["sizes"]
  for length in spec["lengths"]:
    try:
      result = _measure(spec["kind"], spec["heads"], length, sizes,
                        spec["repeats"])
    except Exception as error:  # pylint: disable=broad-except
      text = f"{type(error).__name__}: {error}"
      out_of_memory = any(word in text for word in
                          ("RESOURCE_EXHAUSTED", "Out of memory",
                           "out of memory", "OOM"))
      result = dict(kind=spec["kind"], heads=spec["heads"], length=length,
                    batch=max(1, sizes["tokens"] // length),
                    error="out of memory" if out_of_memory else text[:2000])
      if not out_of_memory:
        traceback.print_exc()
    print("RESULT " + json.dumps(result), flush=True)
    if "error" in result:
      break  # longer sequences need more


def _reference(q, k, v, pre, post, mask, bias, causal):
  """The talking-heads core in float32 jnp (HIGHEST precision einsums)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  hi = jax.lax.Precision.HIGHEST
  q, k, v = (t.astype(jnp.float32) for t in (q, k, v))
  logits = jnp.einsum("bnik,bmik->binm", q, k, precision=hi)
  if pre is not None:
    logits = jnp.einsum("binm,ih->bhnm", logits, pre, precision=hi)
  if bias is not None:
    logits = logits + bias
  n, m = q.shape[1], k.shape[1]
  allowed = jnp.ones((1, 1, n, m), bool)
  if causal:
    allowed = allowed & (jnp.arange(m)[None, :] <= jnp.arange(n)[:, None])
  if mask is not None:
    allowed = allowed & (mask[:, None, None, :] if mask.ndim == 2 else
                         mask[:, None])
  weights = jax.nn.softmax(jnp.where(allowed, logits, -1e9), axis=-1)
  if post is not None:
    weights = jnp.einsum("bhnm,hj->bjnm", weights, post, precision=hi)
  return jnp.einsum("bjnm,bmjv->bnjv", weights, v, precision=hi)


CHECKS = (
    # name, dtype, (b, n, m, h_k, h, h_v, d), options
    ("bf16 h=12 d=64", "bfloat16", (2, 300, 300, 12, 12, 12, 64), {}),
    ("f32 3/4/5 causal+bias ragged", "float32", (2, 100, 77, 3, 4, 5, 40),
     dict(causal=True, bias=True)),
    ("f16 logits-only key mask", "float16", (2, 64, 90, 4, 6, 6, 32),
     dict(post=False, mask="keys")),
    ("bf16 weights-only full mask", "bfloat16", (1, 50, 70, 6, 6, 3, 16),
     dict(pre=False, mask="full")),
    # Programs per slice of heads, the default above 16 heads, at a size
    # that compiles fast: slices of 8 of 12 heads.
    ("bf16 h=12 slices of 8, key mask", "bfloat16",
     (2, 130, 130, 12, 12, 12, 64), dict(mask="keys", heads_per_program=8)),
)


def child_check(spec):
  """The compiled kernel against `_reference`: forward and all gradients."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from thattn.kernels import pallas_kernel  # pylint: disable=g-import-not-at-top
  from thattn.kernels import pallas_tiles  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  for name, dtype, (b, n, m, hk, h, hv, d), options in CHECKS[:spec["cases"]]:
    start = time.perf_counter()
    try:
      def normal(*shape, scale=1.0):
        return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)
      q = normal(b, n, hk, d, scale=d ** -0.5).astype(dtype)
      k, v = normal(b, m, hk, d).astype(dtype), normal(b, m, hv, d).astype(
          dtype)
      pre = (normal(hk, h, scale=hk ** -0.5) if options.get("pre", True)
             else None)
      post = (normal(h, hv, scale=h ** -0.5) if options.get("post", True)
              else None)
      bias = normal(1, h, n, m) if options.get("bias") else None
      mask = None
      if options.get("mask") == "keys":
        mask = jnp.asarray(rng.random((b, m)) > 0.3)
      elif options.get("mask") == "full":
        mask = jnp.asarray(rng.random((b, n, m)) > 0.3)
      causal = options.get("causal", False)
      cotangent = normal(b, n, hv, d)

      def kernel_loss(q, k, v, pre, post, bias):
        tiles = None
        if options.get("heads_per_program"):
          tiles = dataclasses.replace(
              pallas_tiles.default_tiles(max(hk, h, hv)),
              heads_per_program=options["heads_per_program"])
        out = pallas_kernel.talking_heads_attention(
            q, k, v, pre, post, mask=mask, bias=bias, causal=causal,
            tiles=tiles,
            interpret=os.environ.get("THATTN_PALLAS") == "interpret")
        return jnp.sum(out.astype(jnp.float32) * cotangent), out

      def reference_loss(q, k, v, pre, post, bias):
        out = _reference(q, k, v, pre, post, mask, bias, causal)
        return jnp.sum(out * cotangent), out

      def both(loss):
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4, 5),
                                          has_aux=True))

      args = (q, k, v, pre, post, bias)
      (_, out), grads = both(kernel_loss)(*args)
      (_, ref_out), ref_grads = both(reference_loss)(
          *(None if t is None else t.astype(jnp.float32) for t in args))
      errors = {"out": out.astype(jnp.float32) - ref_out}
      for label, g, r in zip(("dq", "dk", "dv", "dpre", "dpost", "dbias"),
                             grads, ref_grads):
        if r is not None:
          errors[label] = (g.astype(jnp.float32) - r, r)
      relative = {}
      for label, value in errors.items():
        diff, ref = (value, ref_out) if label == "out" else value
        relative[label] = float(jnp.linalg.norm(diff) /
                                jnp.maximum(jnp.linalg.norm(ref), 1e-30))
      result = dict(check=name, seconds=round(time.perf_counter() - start, 1),
                    relative_errors={k: f"{v:.1e}" for k, v in
                                     relative.items()},
                    finite=bool(all(np.isfinite(v) for v in
                                    relative.values())))
    except Exception as error:  # pylint: disable=broad-except
      traceback.print_exc()
      result = dict(check=name, error=f"{type(error).__name__}: "
                                      f"{str(error)[:2000]}")
    print("RESULT " + json.dumps(result), flush=True)


# ---- in the parent ---------------------------------------------------------


def _run_child(spec, timeout, log):
  # Memory on demand: a kernel's local memory (register spills) comes from
  # the driver, outside JAX's pool, so JAX must not take the card up front.
  env = {**os.environ, "KERAS_BACKEND": "jax",
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
         "PYTHONPATH": os.pathsep.join(
             [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH",
                                                       "").split(os.pathsep)
                            if p])}
  results = []
  try:
    completed = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], env=env,
        capture_output=True, text=True, timeout=timeout, check=False)
    stdout, stderr, status = completed.stdout, completed.stderr, \
        completed.returncode
  except subprocess.TimeoutExpired as expired:
    stdout = (expired.stdout or b"").decode() if isinstance(
        expired.stdout, bytes) else (expired.stdout or "")
    stderr = (expired.stderr or b"").decode() if isinstance(
        expired.stderr, bytes) else (expired.stderr or "")
    status = f"timed out after {timeout} s"
  for line in stdout.splitlines():
    if line.startswith("RESULT "):
      results.append(json.loads(line[len("RESULT "):]))
  log.write(f"=== {json.dumps(spec)}: {status}\n{stdout}\n{stderr}\n")
  log.flush()
  if status != 0:
    results.append(dict(spec=spec, status=str(status),
                        stderr_tail=stderr[-1500:]))
  return results


def table_cell(value, limit=300):
  """`value` as one table cell: Keras's errors span lines and carry ANSI
  bold codes, which would break the Markdown row (model_steps.py uses it
  too)."""
  text = re.sub(r"\x1b\[[0-9;]*m", "", str(value))
  text = " ".join(text.split()).replace("|", "/")
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _kernel_choice_rows(report, index):
  """`kernel_choice.Measurement(...)` lines for each (h, n) where the
  kernel was timed and keras.ops was timed or ran out of memory."""
  rows = []
  device_kind = report.get("device_kind", report["machine"])
  for (heads, length, kind), kernel in sorted(index.items()):
    if kind != "TH kernel" or "ms" not in kernel:
      continue
    ops = index.get((heads, length, "TH keras.ops"), {})
    if "ms" in ops:
      ops_ms = ops["ms"]
    elif ops.get("error") == "out of memory":
      ops_ms = None
    else:
      continue
    rows.append(f"    Measurement({device_kind!r}, {heads}, "
                f"{length}, {ops_ms}, {kernel['ms']}),")
  return rows


def _markdown(report):
  lines = [f"# {report['machine']}", "",
           f"jax {report['jax']}, keras {report['keras']}; "
           f"{report['sizes']['tokens']} tokens per step, width "
           f"{report['sizes']['width']}, bfloat16 compute; forward+backward "
           "of one self-attention layer under jax.jit.", ""]
  lines += ["## Kernel check (compiled on the GPU, against float32 jnp)", "",
            "| case | relative errors (L2) |", "|---|---|"]
  for check in report["checks"]:
    detail = check.get("error") or ", ".join(
        f"{k} {v}" for k, v in check.get("relative_errors", {}).items())
    lines.append(f"| {check.get('check')} | {table_cell(detail)} |")
  lines += ["", "## Time and memory", "",
            "| h | n | batch | kind | ms | vs MHA flash | vs TH keras.ops | "
            "peak GiB (runtime) | planned GiB (XLA) | compile s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  rows = [r for r in report["results"] if "kind" in r]
  index = {(r["heads"], r["length"], r["kind"]): r for r in rows}
  for r in sorted(rows, key=lambda r: (r["heads"], r["length"],
                                       KINDS.index(r["kind"]))):
    def ratio(other):
      base = index.get((r["heads"], r["length"], other), {})
      if "ms" in r and "ms" in base:
        return f"{r['ms'] / base['ms']:.2f}x"
      return "-"

    def gib(value):
      return "-" if value is None else f"{value / 2 ** 30:.2f}"

    lines.append(
        f"| {r['heads']} | {r['length']} | {r['batch']} | {r['kind']} | "
        f"{table_cell(r.get('ms', r.get('error', '-')))} | {ratio('MHA flash')} | "
        f"{ratio('TH keras.ops')} | {gib(r.get('peak_bytes'))} | "
        f"{gib(r.get('planned_bytes'))} | {r.get('compile_s', '-')} |")
  measured = _kernel_choice_rows(report, index)
  if measured:
    lines += ["", "## For thattn/kernels/kernel_choice.py", "",
              "The default switch's table (`MEASUREMENTS`) reads these "
              "rows: the kernel and keras.ops at each (h, n) where the "
              "kernel ran (None: out of memory).", "", "```python"]
    lines += measured + ["```"]
  failures = [r for r in report["results"] if "status" in r]
  if failures:
    lines += ["", "## Processes that failed", ""]
    lines += [f"- {json.dumps(f['spec'])}: {f['status']}" for f in failures]
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/results/accelerator")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--budget", type=float, default=480.0,
                      help="seconds; no new process starts after this")
  parser.add_argument("--heads", default=None,
                      help="comma-separated head counts (default 12,24,48)")
  parser.add_argument("--lengths", default=None,
                      help="comma-separated sequence lengths")
  parser.add_argument("--kinds", default=",".join(KINDS),
                      help="comma-separated kinds to time")
  parser.add_argument("--baseline_lengths", default=None,
                      help="time 'TH keras.ops' only at these lengths")
  parser.add_argument("--check_cases", type=int, default=len(CHECKS))
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    spec = json.loads(args.child)
    (child_check if spec.get("check") else child_measure)(spec)
    return
  sizes = dict(QUICK if args.quick else FULL)
  if args.heads:
    sizes["heads"] = tuple(int(h) for h in args.heads.split(","))
  if args.lengths:
    sizes["lengths"] = tuple(int(n) for n in args.lengths.split(","))
  kinds = tuple(k for k in KINDS if k in args.kinds.split(","))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  os.environ.setdefault("KERAS_BACKEND", "jax")
  import jax  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  report = dict(machine=f"{device.device_kind} ({device.platform})",
                device_kind=device.device_kind,
                jax=jax.__version__, keras=keras.__version__,
                sizes={k: list(v) if isinstance(v, tuple) else v
                       for k, v in sizes.items()},
                checks=[], results=[])
  started = time.monotonic()

  def save():
    (out / "results.json").write_text(json.dumps(report, indent=1))
    (out / "results.md").write_text(_markdown(report))

  with open(out / "log.txt", "w") as log:
    # The checks print each case as it ends, so a cut keeps the cases
    # done; at most half the budget leaves the timings room.
    report["checks"] = _run_child(
        dict(check=True, cases=args.check_cases),
        int(min(240, max(60, args.budget / 2))), log)
    save()
    # What the kernel issue's targets and the default switch
    # (thattn.kernels.kernel_choice) need first, in case compiling runs
    # long and the budget ends the run: h = 12 and then the second head
    # count at the middle length, h = 12 at the shortest and longest, the
    # other head counts (whose programs compile longest) at the middle
    # length; then the lengths in between, and the rest. Each entry is a
    # process per kind, its lengths ascending.
    lengths = sizes["lengths"]
    first, *others = sizes["heads"]
    middle = lengths[len(lengths) // 2]
    ends = tuple(sorted({lengths[0], lengths[-1]} - {middle}))
    phases = [[(first, (middle,))], [(h, (middle,)) for h in others[:1]],
              [(first, ends)], [(h, (middle,)) for h in others[1:]],
              [(first, tuple(n for n in lengths
                             if n not in ends and n != middle))],
              [(h, tuple(n for n in lengths if n != middle)) for h in others]]
    plan = [(kind, heads, chosen) for phase in phases
            for heads, chosen in phase if chosen for kind in kinds]
    if args.baseline_lengths:
      only = {int(n) for n in args.baseline_lengths.split(",")}
      plan = [(kind, heads, tuple(n for n in chosen if n in only)
               if kind == "TH keras.ops" else chosen)
              for kind, heads, chosen in plan]
      plan = [entry for entry in plan if entry[2]]
    for kind, heads, lengths in plan:
      left = args.budget - (time.monotonic() - started)
      if left < 30:
        report["skipped_for_budget"] = report.get("skipped_for_budget", []) + [
            [kind, heads, list(lengths)]]
        continue
      spec = dict(kind=kind, heads=heads, lengths=list(lengths), sizes=sizes,
                  repeats=5)
      report["results"] += _run_child(spec, int(left), log)
      save()
  save()
  print(_markdown(report))


if __name__ == "__main__":
  main()
