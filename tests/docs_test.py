"""Every code block of docs/mtf.md runs as written (README's: readme_test.py).

The blocks are read from the file, in order, and each is run as a reader
would run it, in one folder laid out as the doc assumes: `t5_model` and
`t5_small` are tiny T5 1.0 model_dirs that Mesh TensorFlow saved as T5 saves
its released checkpoints (tests/mtf/t5_layouts_convert_test.py),
`sentencepiece.model` their vocabulary in T5's layout
(tests/mtf/t5_vocabulary_convert_test.py), `my_text/` some prose.

- `sh` commands run in order, each to a zero exit. Training commands get
  readme_test's quick flags (2 steps, no export) and a batch of 2 x 32
  tokens appended (absl: the last value wins), for time only.
- `python` blocks run in a fresh Python in that folder (the first makes
  logical CPUs, which must happen before TensorFlow starts).
- The gin block builds its model with Mesh TensorFlow.
- Not run, checked instead: `pip install` (no network in tests; CI's
  install line must include the extra) and `pytest` commands (CI runs
  every test file; the file must exist).

Afterwards every model_dir the commands wrote resolves its newest
checkpoint with `tf.train.latest_checkpoint`, also after the folder moves.
"""

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import tensorflow as tf

from tests import forkserver
from tests import readme_test
from tests.mtf import t5_layouts_convert_test as layouts
from tests.mtf import t5_vocabulary_convert_test as vocabulary
# pylint: disable-next=unused-import
from tests.mtf.t5_vocabulary_convert_test import t5_vocabulary  # a fixture
from thattn.data import corpus
from thattn.mtf import models as mtf_models

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mtf.md"
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", flags=re.S | re.M)
_SMALL = ["--batch_size=2", "--sequence_length=32"]


def _blocks():
  """[(language, text)] of the doc's fenced blocks, dedented, in order."""
  blocks = []
  for indent, language, text in _FENCE.findall(DOC.read_text()):
    lines = [line[len(indent):] for line in text.splitlines()]
    blocks.append((language, "\n".join(lines) + "\n"))
  return blocks


def _is_pip(step):
  return step[0].endswith("/pip") and step[1] == "install"


def _is_pytest(step):
  return step[1:4] == ["-m", "pytest", "-q"] or step[1:3] == ["-m", "pytest"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, corpus_cache, t5_vocabulary):  # pylint: disable=redefined-outer-name
  root = tmp_path_factory.mktemp("docs_mtf")
  for name in ("t5_model", "t5_small"):
    layouts.save_as_t5(root / name, layouts.T5_1_0,
                       vocab_size=vocabulary._VOCAB)  # pylint: disable=protected-access
  (root / "sentencepiece.model").write_bytes(t5_vocabulary.read_bytes())
  (root / "my_text").mkdir()
  for index, text in enumerate(corpus.documents("heldout", corpus_cache)[:20]):
    (root / "my_text" / f"{index}.txt").write_text(text)
  return root


def _run(argv, folder):
  # The machine's thattn cache, as a reader's run would use: its kernels
  # and default corpus are built once per machine (a cache of this test's
  # own compiled both kernels again, a minute of CI).
  env = dict(os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  result = forkserver.run(argv, cwd=folder, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
  assert result.returncode == 0, (
      f"{' '.join(argv)} failed:\n{result.stdout[-2000:]}\n"
      f"{result.stderr[-3000:]}")


def _sh(block, folder):
  for command in readme_test._commands(block):  # pylint: disable=protected-access
    for step in readme_test._steps(command):  # pylint: disable=protected-access
      assert step[0].startswith(readme_test.VENV_BIN), step
      if _is_pip(step):
        extra = re.fullmatch(r"-e\s*'?\.\[(\w+)\]'?", " ".join(step[2:]))
        ci = (ROOT / ".ci" / "run").read_text()
        assert extra and re.search(
            rf"pip install .*-e '\.\[[\w,]*\b{extra.group(1)}\b", ci), step
        continue
      program = step[0][len(readme_test.VENV_BIN):]
      argv = [os.path.join(readme_test.BIN_DIR, program)] + step[1:]
      if _is_pytest(step):
        for path in step[3:]:
          assert path.startswith("-") or (ROOT / path).exists(), path
        continue
      quick = readme_test._QUICK.get(program, [])  # pylint: disable=protected-access
      _run(argv + quick + (_SMALL if quick else []), folder)


def _gin(block):
  # The block's bindings as a model's: a tiny language model around them.
  gin_text = (block + "utils.run.model_type = 'lm'\n"
              "Unitransformer.d_model = 32\nmake_layer_stack.num_layers = 1\n")
  shapes = mtf_models.variable_shapes(gin_text=gin_text, vocab_size=32)
  assert any("GroupedTalkingHeadsSelfAttention" in name for name in shapes)


@pytest.mark.skipif(
    not os.path.exists(os.path.join(readme_test.BIN_DIR, "thattn-convert")),
    reason=f"thattn's console scripts are not installed beside "
    f"{sys.executable}")
def test_every_block_runs_in_order(folder):
  blocks = _blocks()
  assert [language for language, _ in blocks].count("python") >= 2
  for language, block in blocks:
    if language == "sh":
      _sh(block, folder)
    elif language == "python":
      _run([sys.executable, "-c", block], folder)
    else:
      _gin(block)
  # thattn-convert both ways, and thattn-train in both backends.
  written = ["runs/t5_model/checkpoints", "back", "runs/t5_small/checkpoints",
             "runs/t5_small_tuned/checkpoints", "runs/t5_mtf",
             "runs/t5_keras/checkpoints"]
  newest = {path: _newest(folder / path) for path in written}
  moved = folder.parent / (folder.name + "_moved")
  folder.rename(moved)
  for path in written:
    assert tf.train.latest_checkpoint(str(moved / path)) == str(
        moved / path / newest[path]), path
    assert f'model_checkpoint_path: "{newest[path]}"' in (
        moved / path / "checkpoint").read_text(), path


def _newest(path):
  """The prefix of the highest-step checkpoint in `path`, as a basename."""
  steps = {int(re.search(r"-(\d+)\.index$", name).group(1)): name[:-6]
           for name in os.listdir(path) if name.endswith(".index")}
  assert steps, path
  return steps[max(steps)]


def test_import_thattn_is_cheap_and_gives_models_load():
  code = ("import sys, thattn\n"
          "assert 'tensorflow' not in sys.modules\n"
          "assert callable(thattn.models.load)\n"
          "assert 'mesh_tensorflow' not in sys.modules\n")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
