"""How long Triton takes to compile thattn's Pallas kernel, with no GPU.

A GPU runs the kernel only after compiling its Triton programs (the
forward, or its statistics and a program per slice of heads; the
backward's row sums, logits pair sums, rows, key columns and value
columns, the last three per slice of heads) on the host, once per shape. This script measures that step on any machine:

1. it lowers jax.jit(jax.grad) of `pallas_kernel.talking_heads_attention`
   for a CUDA GPU (lowering needs no GPU) at the benchmark's shapes: width
   768, bfloat16, 16,384 tokens at n = 4096, P_l and P_w present;
2. it keeps each Triton program that Pallas hands to the backend (Triton's
   own IR, "TTIR", as text);
3. it compiles each with the `triton` package, in a subprocess, for an
   H100 (sm_90) to PTX and then a cubin, as XLA's and jaxlib's copies of
   Triton do on the GPU machine's host; and runs ptxas on the PTX for the
   registers and spilled bytes (spills cost memory traffic at run time).

The `triton` package is not a thattn dependency, and belongs in a venv of
its own (benchmarks/requirements-triton.txt says why); give its Python:

    python3 -m venv .venv-triton
    .venv-triton/bin/pip install -r benchmarks/requirements-triton.txt
    python benchmarks/pallas_compile.py --triton_python .venv-triton/bin/python

Step 2 reads Pallas's Triton lowering through a private JAX function
(`jax._src.pallas.triton.lowering.lower_jaxpr_to_triton_module`): a JAX
without it is named. The compile runs single-threaded; a GPU host's CPU may
be faster or slower than this one, so compare programs within one run.
"""

import argparse
import collections
from concurrent import futures
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs in the Python that has `triton`: compiles one TTIR file, prints JSON.
_COMPILE = r"""
import json, os, re, subprocess, sys, time, warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
path, warps = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
kernel = triton.compile(path, target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=warps, num_stages=1))
seconds = time.perf_counter() - start
ptx = path + ".ptx"
open(ptx, "w").write(kernel.asm["ptx"])
bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                       "bin")
report = ""
for name in ("ptxas-blackwell", "ptxas"):  # the newer one reads newer PTX
  tool = os.path.join(bin_dir, name)
  if os.path.exists(tool):
    report = subprocess.run([tool, "-v", "--gpu-name", "sm_90a", ptx, "-o",
                             os.devnull], capture_output=True, text=True).stderr
    if "Used" in report:
      break
registers = re.findall(r"Used (\d+) registers", report)
spills = re.findall(r"(\d+) bytes spill stores", report)
text = kernel.asm["ptx"]
# Instructions: the PTX lines that end in ';' and are not declarations.
instructions = [line for line in text.splitlines()
                if line.strip().endswith(";") and not line.strip().startswith(
                    (".", "//", "{", "}"))]
print(json.dumps(dict(seconds=round(seconds, 1), triton=triton.__version__,
                      registers=int(registers[0]) if registers else None,
                      spill_bytes=int(spills[0]) if spills else None,
                      ptx_instructions=len(instructions),
                      mma_sync=sum("mma.sync" in i for i in instructions),
                      wgmma=sum("wgmma.mma_async" in i for i in instructions))))
"""


def triton_programs(heads, width, length, tokens, tiles):
  """{name: TTIR text} of the kernel's forward and backward at these
  sizes, lowered for CUDA."""
  os.environ.setdefault("KERAS_BACKEND", "jax")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  try:
    from jax._src.pallas.triton import lowering  # pylint: disable=g-import-not-at-top
    original = lowering.lower_jaxpr_to_triton_module
  except (ImportError, AttributeError) as error:
    raise SystemExit(f"this JAX ({jax.__version__}) has no "
                     f"lower_jaxpr_to_triton_module to read: {error}")
  from thattn.kernels import pallas_kernel  # pylint: disable=g-import-not-at-top
  programs = {}

  def keep(*args, **kwargs):
    result = original(*args, **kwargs)
    text = result.module.operation.get_asm()
    name = re.search(r"tt\.func public @(\w+)", text).group(1)
    programs[name] = text
    return result

  batch, d = tokens // length, width // heads
  inputs = jax.ShapeDtypeStruct((batch, length, heads, d), jnp.bfloat16)
  mix = jax.ShapeDtypeStruct((heads, heads), jnp.float32)

  def loss(q, k, v, pre, post):
    out = pallas_kernel.talking_heads_attention(q, k, v, pre, post,
                                                tiles=tiles)
    return jnp.sum(out.astype(jnp.float32))

  lowering.lower_jaxpr_to_triton_module = keep
  try:
    jax.jit(jax.grad(loss, argnums=range(5))).trace(
        inputs, inputs, inputs, mix, mix).lower(lowering_platforms=("cuda",))
  finally:
    lowering.lower_jaxpr_to_triton_module = original
  return programs


def ttir_counts(text, tiles):
  """What a Triton program (TTIR text) of bfloat16 or float16 inputs
  holds: its operations, its tensor loads and stores, and its matrix
  products by kind: `head_mixes` (float32 products over a tile's (query,
  key) pairs whose contraction runs over heads, a chunk of 8 or all H:
  L = J P_l, U = W P_w, dW, dJ), `pair_sums` (float32 products that
  contract the pairs: dP_l, dP_w) and `per_head` (the products with Q, K,
  V and dO: in the input dtype, or in float32 where they contract a tile
  side shorter than 16, [Bq, Bk] x [Bk, d], `pallas_tiles.dot`)."""
  operations = collections.Counter(re.findall(r"= ([a-z_]+\.[a-z_]+)", text))
  dots = re.findall(r"tt\.dot [^:]*: tensor<(\d+)x(\d+)x(\w+)> \* "
                    r"tensor<(\d+)x(\d+)x\w+>", text)
  kinds = collections.Counter()
  tile_sides = {str(tiles.block_q), str(tiles.block_k)}
  for rows, inner, dtype, _, _ in dots:  # [rows, inner] x [inner, cols]
    if dtype != "f32" or {rows, inner} <= tile_sides:
      kinds["per_head"] += 1
    elif int(inner) > int(rows):
      kinds["pair_sums"] += 1
    else:
      kinds["head_mixes"] += 1
  return dict(operations=sum(operations.values()),
              tensor_memory_ops=len(re.findall(
                  r"tt\.(?:load|store) [^\n]*tensor<[^\n]*!tt\.ptr", text)),
              **{kind: kinds[kind] for kind in ("head_mixes", "pair_sums",
                                                "per_head")})


def measure(program, text, tiles, triton_python, folder, timeout):
  """The program's size, and (with a `triton_python`) its compile time,
  registers and spills."""
  path = pathlib.Path(folder) / f"{program}.ttir"
  path.write_text(text)
  row = dict(program=program.replace("thattn_talking_heads_", ""),
             **ttir_counts(text, tiles))
  if triton_python is None:
    return row
  try:
    # A cache of its own: Triton's default cache would answer a second
    # run from disk.
    done = subprocess.run([triton_python, "-c", _COMPILE, str(path),
                           str(tiles.num_warps)], capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env=dict(os.environ, TRITON_CACHE_DIR=str(
                              pathlib.Path(folder) / "triton_cache")))
  except subprocess.TimeoutExpired:
    return dict(row, error=f"not compiled in {timeout} s")
  if done.returncode != 0:
    return dict(row, error=done.stderr.strip().splitlines()[-1][:300])
  return dict(row, **json.loads(done.stdout.strip().splitlines()[-1]))


def markdown(rows):
  lines = ["| h | tiles (Bq x Bk, warps) | program | TTIR ops | tensor "
           "loads+stores | dots: head mixes, pair sums, per head | PTX "
           "instructions | mma.sync, wgmma | compile s | registers | "
           "spilled bytes |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['heads']} | {r['tiles']} | {r['program']} | {r['operations']}"
        f" | {r['tensor_memory_ops']} | {r['head_mixes']}, {r['pair_sums']},"
        f" {r['per_head']} | {r.get('ptx_instructions', '-')} | "
        f"{r.get('mma_sync', '-')}, {r.get('wgmma', '-')} | "
        f"{r.get('seconds', r.get('error', '-'))} | "
        f"{r.get('registers', '-')} | {r.get('spill_bytes', '-')} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--heads", default="12,24,48")
  parser.add_argument("--width", type=int, default=768)
  parser.add_argument("--length", type=int, default=4096)
  parser.add_argument("--tokens", type=int, default=16384)
  parser.add_argument("--tiles", default=None,
                      help="Bq,Bk,warps[,heads per program] (default: the "
                      "kernel's default_tiles)")
  parser.add_argument("--triton_python", default=sys.executable)
  parser.add_argument("--timeout", type=int, default=900,
                      help="seconds per program's compile")
  parser.add_argument("--jobs", type=int, default=1,
                      help="programs compiled at once (each on one core; "
                      "their compile seconds then share the machine)")
  parser.add_argument("--lower_only", action="store_true",
                      help="count the programs' operations; compile nothing")
  parser.add_argument("--out", default=None, help="a .json to write")
  args = parser.parse_args()
  if args.jobs < 1:
    parser.error(f"--jobs={args.jobs}: at least 1 program at a time")
  sys.path.insert(0, str(ROOT))
  from thattn.kernels import pallas_tiles  # pylint: disable=g-import-not-at-top
  rows = []
  for heads in (int(h) for h in args.heads.split(",")):
    tiles = pallas_tiles.default_tiles(heads)
    if args.tiles:
      block_q, block_k, warps, *per_program = (
          int(x) for x in args.tiles.split(","))
      tiles = pallas_tiles.Tiles(
          block_q, block_k, num_warps=warps,
          heads_per_program=per_program[0] if per_program else None)
    start = time.perf_counter()
    programs = triton_programs(heads, args.width, args.length, args.tokens,
                               tiles)
    print(f"h={heads}: lowered in {time.perf_counter() - start:.1f} s",
          flush=True)
    with tempfile.TemporaryDirectory() as folder, \
        futures.ThreadPoolExecutor(args.jobs) as pool:
      measure_one = functools.partial(
          measure, tiles=tiles,
          triton_python=None if args.lower_only else args.triton_python,
          folder=folder, timeout=args.timeout)
      measured = pool.map(measure_one, programs, programs.values())
      for row in measured:  # in the programs' order, as each is done
        rows.append(dict(row, heads=heads, tiles=(
            f"{tiles.block_q} x {tiles.block_k}, {tiles.num_warps}" + (
                f", {tiles.heads_per_program} heads per program"
                if tiles.heads_per_program else ""))))
        print(json.dumps(rows[-1]), flush=True)
  print(markdown(rows))
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
