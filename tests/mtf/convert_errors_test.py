"""thattn-convert's refusals (issue 27): each a ValueError (or absl usage
error) naming the flag or file and what was expected, before anything is
written; and a killed conversion's staging folder removed by the next."""

import json
import os

import pytest

from tests import cli
from thattn import models
from thattn.mtf import convert

try:
  from . import model_convert_test as helpers
except ImportError:  # Bazel runs the test as a top-level module
  import model_convert_test as helpers  # pylint: disable=g-import-not-at-top

_QUIET = dict(log=lambda line: None)


@pytest.fixture(scope="module")
def mtf_dir(tmp_path_factory):
  """A T5 1.0 layout mtf model_dir (operative_config.gin, model.ckpt-1000)."""
  folder = tmp_path_factory.mktemp("mtf") / "mtf"
  helpers._mtf_model_dir(folder, helpers.T5_1_0)  # pylint: disable=protected-access
  return folder


def _refused(match, folder, unchanged, call=convert.mtf_to_thattn, **kwargs):
  with unchanged(folder), pytest.raises(ValueError, match=match) as error:
    call(**kwargs, **_QUIET)
  return str(error.value)


def test_an_empty_mtf_model_dir_is_a_usage_error_naming_the_flag(
    tmp_path, unchanged):
  with unchanged(tmp_path):
    result = cli.run(
        cli.command("convert", "--mtf_model_dir=",
                    f"--model_dir={tmp_path / 'out'}"),
        timeout=300, cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert result.returncode == 1
  assert "--mtf_model_dir is empty; expected a folder" in result.stderr
  assert "Traceback" not in result.stderr
  _refused(r"--mtf_model_dir='' is empty", tmp_path, unchanged,
           mtf_model_dir="", model_dir=str(tmp_path / "out"))


def test_an_mtf_training_run_is_named_with_what_to_do(mtf_dir, tmp_path,
                                                      unchanged):
  run = tmp_path / "mtf_run"  # what thattn-train --backend=mtf leaves
  for path in mtf_dir.iterdir():
    (run / path.name).parent.mkdir(exist_ok=True)
    (run / path.name).write_bytes(path.read_bytes())
  (run / "run_config.json").write_text(json.dumps(
      {"task": "span_corruption", "backend": "mtf", "preset": "t5_tiny"}))
  message = _refused("is a thattn-train --backend=mtf run", tmp_path,
                     unchanged, call=convert.thattn_to_mtf,
                     model_dir=str(run), mtf_model_dir=str(tmp_path / "back"))
  assert f"thattn-convert --mtf_model_dir={run} --model_dir=" in message


def test_an_unsupported_attention_layer_is_named_with_its_binding(
    tmp_path, unchanged):
  gin_text = helpers.T5_1_0.replace(
      f"[\n    {helpers.TL}.SelfAttention, {helpers.TL}.EncDecAttention",
      f"[\n    {helpers.TL}.LocalSelfAttention, {helpers.TL}.EncDecAttention")
  assert gin_text != helpers.T5_1_0
  variables = convert.mtf_models.initial_variables(
      gin_text=helpers.T5_1_0, vocab_size=helpers.VOCAB, seed=0)
  convert.mtf_models.write_model_dir(mtf_model_dir=str(tmp_path / "mtf"),
                                     gin_text=gin_text, variables=variables,
                                     step=1)
  _refused(r"decoder/make_layer_stack.layers: layer '[^']+' is a "
           r"LocalSelfAttention", tmp_path, unchanged,
           mtf_model_dir=str(tmp_path / "mtf"),
           model_dir=str(tmp_path / "out"))


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff\xfe binary", "is not a text file"),
    (b"  \n", "is empty; expected the gin config")])
def test_a_binary_or_empty_operative_config_is_named(
    mtf_dir, tmp_path, content, message, unchanged):
  source = tmp_path / "mtf"
  source.mkdir()
  for path in mtf_dir.iterdir():
    (source / path.name).write_bytes(path.read_bytes())
  (source / "operative_config.gin").write_bytes(content)
  error = _refused(message, tmp_path, unchanged, mtf_model_dir=str(source),
                   model_dir=str(tmp_path / "out"))
  assert str(source / "operative_config.gin") in error


def test_a_garbage_vocabulary_file_is_named(mtf_dir, tmp_path, unchanged):
  (tmp_path / "spm.model").write_bytes(b"this is not a sentencepiece model")
  error = _refused("is not a SentencePiece model file", tmp_path, unchanged,
                   mtf_model_dir=str(mtf_dir), model_dir=str(tmp_path / "out"),
                   vocabulary=str(tmp_path / "spm.model"))
  assert f"--vocabulary={str(tmp_path / 'spm.model')!r}" in error


def test_a_model_dir_that_is_a_file_is_refused(mtf_dir, tmp_path, unchanged):
  (tmp_path / "out").write_text("a file")
  _refused(r"--model_dir='.*/out' is a file; expected a new folder",
           tmp_path, unchanged, mtf_model_dir=str(mtf_dir),
           model_dir=str(tmp_path / "out"))


def test_an_output_parent_without_write_permission_is_named(
    mtf_dir, tmp_path, unchanged, monkeypatch):
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o555)
  if os.geteuid() == 0:  # root may write anywhere: as a user sees it
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: access(
        path, mode) and os.path.abspath(path) != str(locked))
  try:
    error = _refused("cannot write into", tmp_path, unchanged,
                     mtf_model_dir=str(mtf_dir),
                     model_dir=str(locked / "new" / "out"))
  finally:
    locked.chmod(0o755)
  assert f"into {locked} (permission denied" in error


def test_a_killed_conversions_staging_folder_goes_with_the_next(
    mtf_dir, tmp_path, killed_staging):
  out = tmp_path / "out"
  killed = killed_staging(out, "thattn-convert")  # SIGKILLed mid-write
  lines = []
  convert.mtf_to_thattn(mtf_model_dir=str(mtf_dir), model_dir=str(out),
                        log=lines.append)
  assert f"Removed {killed}, left by a killed thattn process." in lines
  assert os.listdir(tmp_path) == ["out"]
  assert ".thattn-staging.json" not in os.listdir(out)
  assert models.load(str(out)).count_params() > 0


def _copy_with_gin(mtf_dir, folder, first_lines):
  """A copy of `mtf_dir` whose operative_config.gin starts with lines."""
  folder.mkdir()
  for path in mtf_dir.iterdir():
    (folder / path.name).write_bytes(path.read_bytes())
  gin = folder / "operative_config.gin"
  gin.write_text(first_lines + gin.read_text())
  return folder


def test_a_downloaded_gin_cannot_import_other_modules(mtf_dir, tmp_path):
  """A model_dir is data: `import` lines naming anything but
  mesh_tensorflow modules are not run (issue 33), through the binary."""
  probe = tmp_path / "modules" / "thattn_probe_imported.py"
  probe.parent.mkdir()
  ran = tmp_path / "the_probe_ran"
  probe.write_text(f"open({str(ran)!r}, 'w').write('imported')\n")
  source = _copy_with_gin(mtf_dir, tmp_path / "mtf", (
      "import thattn_probe_imported\n"
      "from __gin__ import dynamic_registration\n"
      "import mesh_tensorflow.transformer.transformer_layers\n"))
  result = cli.run(
      cli.command("convert", f"--mtf_model_dir={source}",
                  f"--model_dir={tmp_path / 'out'}"),
      cwd=tmp_path,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(
                   [str(probe.parent), os.environ.get("PYTHONPATH", "")])))
  assert result.returncode == 0, result.stderr[-3000:]
  assert not ran.exists()
  # The binary prints the thattn logger's lines on stdout.
  assert ("did not import these modules named in the gin config (only "
          "mesh_tensorflow modules are imported from a model_dir): "
          "thattn_probe_imported, __gin__") in result.stdout
  assert (tmp_path / "out" / "run_config.json").exists()


def test_a_gin_include_is_refused_naming_its_line(mtf_dir, tmp_path,
                                                  unchanged):
  elsewhere = tmp_path / "elsewhere.gin"
  elsewhere.write_text("SelfAttention.num_heads = 3\n")
  source = _copy_with_gin(mtf_dir, tmp_path / "mtf",
                          f"include '{elsewhere}'\n")
  _refused(rf"line 1, \"include '{elsewhere}'\", includes another file",
           tmp_path, unchanged, mtf_model_dir=str(source),
           model_dir=str(tmp_path / "out"))
