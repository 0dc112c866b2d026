"""thattn-convert, run as a user runs it: both directions, and its errors."""

import os
import shutil

import numpy as np
import tensorflow as tf

from tests import cli
from thattn import models
from thattn.mtf import models as mtf_models

try:
  from . import t5_layouts_convert_test as layouts
except ImportError:  # Bazel runs the test as a top-level module
  import t5_layouts_convert_test as layouts  # pylint: disable=g-import-not-at-top


def _convert(*flags):
  return cli.run(cli.command("convert", *flags), timeout=300,
                 env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def _assert_newest(folder, prefix):
  """TensorFlow's own lookup finds folder/prefix, by a relative path."""
  assert tf.train.latest_checkpoint(str(folder)) == str(folder / prefix)
  # get_checkpoint_state resolves relative paths against the folder.
  assert tf.train.get_checkpoint_state(str(folder)).model_checkpoint_path \
      == str(folder / prefix)
  assert f'model_checkpoint_path: "{prefix}"' in (folder /
                                                  "checkpoint").read_text()


def test_both_directions_from_the_command_line(tmp_path):
  # T5 1.0's released layout, saved as T5 saves it.
  variables = layouts.save_as_t5(tmp_path / "mtf", layouts.T5_1_0,
                                 vocab_size=1024, step=30)
  result = _convert(f"--mtf_model_dir={tmp_path / 'mtf'}",
                    f"--model_dir={tmp_path / 'thattn'}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Converted" in result.stdout and "step 30" in result.stdout
  assert "legacy LayerStack" in result.stdout
  assert models.load(str(tmp_path / "thattn")).count_params() > 0
  result = _convert("--to=mtf", f"--model_dir={tmp_path / 'thattn'}",
                    f"--mtf_model_dir={tmp_path / 'back'}")
  assert result.returncode == 0, result.stderr[-3000:]
  # Both outputs were staged and renamed, then are moved elsewhere: the
  # `checkpoint` state files still name their newest checkpoint.
  (tmp_path / "elsewhere").mkdir()
  for name in ("thattn", "back"):
    shutil.move(str(tmp_path / name), str(tmp_path / "elsewhere" / name))
  _assert_newest(tmp_path / "elsewhere" / "thattn" / "checkpoints", "ckpt-30")
  back = tmp_path / "elsewhere" / "back"
  _assert_newest(back, "model.ckpt-30")
  values = mtf_models.read_checkpoint(str(back / "model.ckpt-30"))
  assert sorted(values) == sorted(variables)
  assert "encoder/final_layer_norm/scale" in values
  assert all(np.array_equal(values[k], v) for k, v in variables.items())


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
