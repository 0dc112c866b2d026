"""thattn-convert, run as a user runs it: both directions, and its errors."""

import os
import subprocess
import sys

import numpy as np

from thattn import models
from thattn.mtf import models as mtf_models

try:
  from . import model_convert_test as cases
except ImportError:  # Bazel runs the test as a top-level module
  import model_convert_test as cases  # pylint: disable=g-import-not-at-top


def _convert(*flags):
  return subprocess.run([sys.executable, "-m", "thattn.bin.convert", *flags],
                        capture_output=True, text=True, timeout=300,
                        check=False,
                        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def test_both_directions_from_the_command_line(tmp_path):
  variables = cases._mtf_model_dir(tmp_path / "mtf", cases.T5_1_0, step=30)  # pylint: disable=protected-access
  result = _convert(f"--mtf_model_dir={tmp_path / 'mtf'}",
                    f"--model_dir={tmp_path / 'thattn'}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Converted" in result.stdout and "step 30" in result.stdout
  assert models.load(str(tmp_path / "thattn")).count_params() > 0
  result = _convert("--to=mtf", f"--model_dir={tmp_path / 'thattn'}",
                    f"--mtf_model_dir={tmp_path / 'back'}")
  assert result.returncode == 0, result.stderr[-3000:]
  back = mtf_models.read_checkpoint(
      mtf_models.latest_checkpoint(str(tmp_path / "back"), step=30))
  assert sorted(back) == sorted(variables)
  assert all(np.array_equal(back[k], v) for k, v in variables.items())


def test_an_error_is_one_line_and_writes_nothing(tmp_path):
  (tmp_path / "empty").mkdir()
  result = _convert(f"--mtf_model_dir={tmp_path / 'empty'}",
                    f"--model_dir={tmp_path / 'out'}")
  assert result.returncode == 1
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("thattn-convert: error:"), result.stderr[-2000:]
  assert "operative_config.gin" in last
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "out").exists()
