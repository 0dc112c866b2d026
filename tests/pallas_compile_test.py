"""The Pallas kernel's Triton programs compiled for an H100, with no GPU.

benchmarks/pallas_compile.py lowers the kernel's forward and backward for
CUDA and compiles every program with the `triton` package to PTX and a
cubin for sm_90, as a GPU host's Triton would. Triton lives in a venv of
its own, `.venv-triton` (benchmarks/requirements-triton.txt says why;
`.ci/run` makes it), or the Python named by THATTN_TRITON_PYTHON. At
width 768 in bfloat16, with P_l and P_w, and the default tiles, at h = 12
(BERT-base's heads) and h = 24:

- no program spills a register (spills cost memory traffic in every
  iteration of the program's loops; the kernel's second design spilled
  392 and 6,584 bytes there: benchmarks/RESULTS.md);
- the head mixes are tensor-core products: a program has at least one
  `wgmma` per mix in its TTIR, and an `mma.sync` per pair sum and per-head
  product.

About two and a half minutes of one core, compiled two programs at a
time (`--jobs 2`); the lowered programs' counts
per chunk of heads are checked faster, without Triton, in
tests/benchmarks_smoke_test.py.
"""

import json
import os
import pathlib
import sys

import pytest

from tests import forkserver

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRITON_PYTHON = os.environ.get("THATTN_TRITON_PYTHON",
                               str(ROOT / ".venv-triton" / "bin" / "python"))

if not os.path.exists(TRITON_PYTHON):
  pytest.skip(f"no Python with `triton` at {TRITON_PYTHON} (python3 -m venv "
              ".venv-triton && .venv-triton/bin/pip install -r "
              "benchmarks/requirements-triton.txt; .ci/run makes it and "
              "fails without it)", allow_module_level=True)


def test_no_program_spills_and_the_mixes_are_mma_at_12_and_24_heads(
    tmp_path):
  out = tmp_path / "programs.json"
  result = forkserver.run(
      [sys.executable, str(ROOT / "benchmarks" / "pallas_compile.py"),
       "--heads", "12,24", "--width", "768", "--length", "256",
       "--tokens", "512", "--triton_python", TRITON_PYTHON, "--jobs", "2",
       "--out", str(out)],
      capture_output=True, text=True, timeout=1200, check=False,
      env=dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(out.read_text())
  # Six programs at h = 12; at 24, slices of 16 heads (a statistics
  # program, two forward and two rows programs) make nine.
  assert [r["heads"] for r in rows].count(12) == 6, rows
  assert [r["heads"] for r in rows].count(24) == 9, rows
  for row in rows:
    assert "error" not in row, row
    assert row["spill_bytes"] == 0, row
    assert row["wgmma"] >= row["head_mixes"] > 0, row
    assert row["mma_sync"] >= row["pair_sums"] + row["per_head"], row
