"""Quick runs of the benchmarks, at tiny sizes, so they cannot rot.

The real measurements (minutes, full sizes) stay out of the test suite.
The GPU scripts (accelerator.py, model_steps.py: benchmarks/gpu_session.sh
runs them on a device machine) run here where TensorFlow cannot be
imported, as there.
"""

import json
import os
import pathlib
import subprocess
import sys

from tests import forkserver
from tests.keras3 import processes

ROOT = pathlib.Path(__file__).resolve().parents[1]
# On PYTHONPATH, it makes TensorFlow and the other packages the GPU machines
# lack unimportable (tests/gpu_machine/sitecustomize.py).
GPU_MACHINE_IMPORTS = str(ROOT / "tests" / "gpu_machine")


def _run_as_on_the_gpu_machine(args, **env):
  """Runs a GPU benchmark script as the device machine would: a fresh
  Python (not a fork of the test server, which has TensorFlow imported)
  in which what that machine lacks, TensorFlow first, cannot be
  imported."""
  path = os.pathsep.join(
      filter(None, [GPU_MACHINE_IMPORTS, os.environ.get("PYTHONPATH")]))
  return subprocess.run(
      [sys.executable] + args, capture_output=True, text=True, timeout=600,
      check=False, env=dict(os.environ, PYTHONPATH=path, **env))


def test_the_gpu_scripts_smoke_runs_cannot_import_tensorflow():
  """What keeps the two GPU scripts' runs below honest: there, TensorFlow
  and its relatives fail to import, Keras 3 on JAX does not."""
  for module in ("tensorflow", "tf_keras", "tensorflow_text", "kagglehub"):
    result = _run_as_on_the_gpu_machine(["-c", f"import {module}"])
    assert result.returncode == 1, (module, result.stderr[-2000:])
    assert f"import of {module} halted" in result.stderr, result.stderr
  result = _run_as_on_the_gpu_machine(
      ["-c", "import keras, sys; print(keras.backend.backend(), "
       "sys.modules['tensorflow'])"], KERAS_BACKEND="jax")
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split() == ["jax", "None"], result.stdout


def test_attention_benchmark_quick_run_writes_its_table(tmp_path):
  out = tmp_path / "attention"
  result = forkserver.run(
      [sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--quick",
       "--repeats", "1",
       "--only", "thattn MHA h=12,thattn TH h=12,thattn TH dynamic h=12",
       # At the quick sizes every tensor of a bfloat16 step is under 256 KiB,
       # which oneDNN's CPU allocator serves from a pool it keeps no
       # statistics for: the peak would read 0. Two more rows are left out
       # for time (each row's memory is measured in a process of its own).
       "--skip", "bfloat16,MHA h=12 chunked,dynamic h=12 TF ops",
       "--out", str(out)],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "attention.json").read_text())
  names = set(report["results"])
  assert {"thattn MHA h=12", "thattn TH h=12", "thattn TH h=12 TF ops",
          "thattn TH h=12 chunked"} <= names
  # The talking-heads rows time the fused kernel, as users get it.
  assert report["fused_kernel"] == "available"
  assert all(r["seconds"] > 0 and r["peak_bytes"] > 0
             for r in report["results"].values())
  assert "thattn TH / thattn MHA, h=12" in report["ratios"]
  # Each variant beside thattn's multi-head: time ratio and multiply ratio.
  variant = report["variants"]["thattn TH dynamic h=12 / thattn MHA h=12"]
  assert variant["time"] > 0 and variant["multiplies"] > 1
  assert "| ratio | value |" in (tmp_path / "attention.md").read_text()


def test_fused_kernel_benchmark_quick_run_prints_its_table():
  result = forkserver.run(
      [sys.executable, str(ROOT / "benchmarks" / "fused_kernel.py"),
       "--heads", "2,3", "--batch", "1", "--length", "16", "--repeats", "1"],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [line for line in result.stdout.splitlines()
          if line.startswith("| 2 |") or line.startswith("| 3 |")]
  assert len(rows) == 2
  assert all(row.rstrip().endswith("x |") for row in rows)


def test_accelerator_benchmark_quick_run_writes_its_tables(tmp_path):
  """benchmarks/accelerator.py is meant for a GPU; here the Pallas kernel
  runs in interpret mode (THATTN_PALLAS=interpret) at tiny sizes, so the
  script's plumbing cannot rot between GPU sessions; with no TensorFlow
  to import, as on the GPU machines."""
  result = _run_as_on_the_gpu_machine(
      [str(ROOT / "benchmarks" / "accelerator.py"), "--quick",
       "--check_cases", "0", "--kinds", "TH kernel,TH keras.ops", "--out",
       str(tmp_path)],
      THATTN_PALLAS="interpret", JAX_PLATFORMS="cpu",
      XLA_FLAGS=processes.TEST_XLA_FLAGS)  # its plumbing, not speed
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "results.json").read_text())
  timed = {(r["kind"], r["length"]) for r in report["results"] if "ms" in r}
  assert timed == {(kind, n) for kind in ("TH kernel", "TH keras.ops")
                   for n in (64, 128)}, report["results"]
  table = (tmp_path / "results.md").read_text()
  assert "| 4 | 128 | 2 | TH kernel |" in table
  # The rows for the default switch's table, one per (h, n) timed both ways.
  ms = {(r["kind"], r["length"]): r["ms"] for r in report["results"]}
  for n in (64, 128):
    assert (f"    Measurement('cpu', 4, {n}, {ms['TH keras.ops', n]}, "
            f"{ms['TH kernel', n]}),") in table, table


def _expected_dots(program, heads, own, slicing):
  """(head mixes, pair sums, per-head products) of a program at h_k = h =
  h_v = `heads` with P_l and P_w, whose output covers `own` heads (all,
  or a slice), `slicing` telling whether the tiles set
  `heads_per_program`: a mix or pair sum per chunk of 8 heads, a
  per-head product per head."""
  full, part = -(-heads // 8), -(-own // 8)
  return {
      # Alone: the statistics' pass (J, L), then J, L, U and O; with
      # slices, a statistics program makes the first pass.
      "forward": ((full + part, 0, heads + own) if slicing else
                  (3 * full, 0, 3 * heads)),
      "statistics": (full, 0, heads),
      # J, L, dU, dW and dP_w (with slices, dU made again for dP_w).
      "row_sums": (2 * full, full, (3 if slicing else 2) * heads),
      "logits_pair_sums": (2 * full, full, 2 * heads),  # dU, dW, J, L, dP_l
      "rows": (2 * full + part, 0, 2 * heads + own),  # ... dJ, dQ
      "key_columns": (2 * full + part, 0, 2 * heads + own),  # ... dK
      "value_columns": (full + part, 0, heads + own),  # J, L, U, dV
  }[program]


def test_pallas_kernel_mixes_heads_by_matrix_products_linear_in_h(tmp_path):
  """benchmarks/pallas_compile.py --lower_only: the kernel's Triton
  programs with the default tiles, lowered for a CUDA GPU here (no GPU,
  no `triton` package).

  The head mixes and pair sums are matrix products (`tt.dot`), one per
  chunk of 8 heads, not per head; the per-head products are 2-D, k per
  head; and a program's length grows at most linearly in h from 4 to 8 to
  16. At 24 heads, programs make slices of 16 heads each (key-tile
  programs 32), with the counts that follows. The kernel's first design
  wrote the mixes out as h_k h + h h_v elementwise multiply-adds, which
  made its programs about 3.5x longer for 2x the heads and took minutes
  to compile at h = 12 (benchmarks/RESULTS.md)."""
  out = tmp_path / "programs.json"
  heads = (4, 8, 16, 24)
  result = forkserver.run(
      [sys.executable, str(ROOT / "benchmarks" / "pallas_compile.py"),
       "--lower_only", "--heads", ",".join(map(str, heads)), "--width", "96",
       "--length", "64", "--tokens", "128", "--out", str(out)],
      capture_output=True, text=True, timeout=600, check=False,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {(r["heads"], r["program"].replace("_kernel", "")): r
          for r in json.loads(out.read_text())}
  whole = ("forward", "row_sums", "logits_pair_sums", "rows", "key_columns",
           "value_columns")
  sliced = ("statistics", "forward_heads_0_16", "forward_heads_16_24",
            "row_sums", "logits_pair_sums", "rows_heads_0_16",
            "rows_heads_16_24", "key_columns_heads_0_24",
            "value_columns_heads_0_24")
  assert set(rows) == ({(h, p) for h in heads[:3] for p in whole} |
                       {(24, p) for p in sliced}), sorted(rows)
  for (h, name), row in rows.items():
    program, _, span = name.partition("_heads_")
    start, stop = map(int, span.split("_")) if span else (0, h)
    assert (row["head_mixes"], row["pair_sums"], row["per_head"]) == (
        _expected_dots(program, h, stop - start, slicing=h > 16)), (h, row)
  for program in whole:
    size = {h: rows[h, program]["operations"] for h in heads[:3]}
    # Linear: the operations each added head costs do not grow with h.
    per_head_4_to_8 = (size[8] - size[4]) / 4
    assert (size[16] - size[8]) / 8 <= 1.1 * per_head_4_to_8, (program, size)


def test_model_steps_benchmark_quick_run_writes_its_tables(tmp_path):
  """benchmarks/model_steps.py is meant for a GPU; here its tiny sizes run
  on the CPU with XLA's attention (the cuDNN rows say why they are empty),
  so its plain-JAX and KerasHub anchors and thattn's models stay runnable
  between GPU sessions; with no TensorFlow to import, as on the GPU
  machines."""
  result = _run_as_on_the_gpu_machine(
      [str(ROOT / "benchmarks" / "model_steps.py"), "--quick", "--out",
       str(tmp_path)],
      KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
      # Its plumbing, not speed. XLA's default emitters: it reads the
      # scatters from the compiled HLO, and with the older emitters
      # (processes.TEST_XLA_FLAGS) it found none.
      XLA_FLAGS=processes.UNOPTIMIZED_XLA_FLAGS)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "results.json").read_text())
  rows = report["fwd_bwd"]["16"]
  timed = {name for name, row in rows.items() if row.get("ms", 0) > 0}
  assert {"JAX reference (XLA)", "thattn MHA", "KerasHub BertBackbone",
          "thattn TH h=4", "thattn MHA, key lengths unverified",
          "thattn MHA, prefix check by lax.cond"} <= timed, rows
  assert rows["JAX reference (cuDNN)"] == {"error": "no cuDNN on this device"}
  assert all(row["warnings"] == 0 for name, row in rows.items()
             if name.startswith("thattn"))
  assert rows["thattn MHA"]["calls"]["scatter"] == "f32[128,32]"
  assert {name for name, row in report["train"]["16"].items()
          if row.get("ms", 0) > 0} == {"thattn BERT MHA", "thattn T5 TH h=4"}
  assert set(report["embedding_gradients"]) == {
      "token types, 2 x d", "T5 buckets, 32 x h, n x n ids",
      "words, random ids", "words, half padding (id 0)"}
  assert "| 16 | thattn MHA |" in (tmp_path / "results.md").read_text()


def test_decoding_benchmark_quick_run_writes_its_tables(tmp_path):
  """Cached greedy decoding, thattn on both fronts beside transformers'
  `generate` (a fresh Python: Keras 3 on JAX is chosen before import)."""
  out = tmp_path / "decoding"
  result = subprocess.run(
      [sys.executable, str(ROOT / "benchmarks" / "decoding.py"), "--quick",
       "--out", str(out)], capture_output=True, text=True, timeout=600,
      check=False, env=dict(os.environ, KERAS_BACKEND="jax",
                            TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / "decoding.json").read_text())
  rates = report["results"]["lm_tiny"]["tokens_per_second"]
  assert set(rates) == {
      "transformers", "thattn tf_keras multi_head",
      "thattn tf_keras talking_heads", "thattn keras3-jax multi_head",
      "thattn keras3-jax talking_heads"}
  assert all(rate > 0 for rate in rates.values())
  assert "| lm_tiny | tf_keras talking_heads / multi_head |" in (
      tmp_path / "decoding.md").read_text()
