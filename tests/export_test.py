"""thattn.export: raw-text SavedModels, atomic writes, fresh-process serving."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from thattn import export
from thattn import models
from thattn.io import staged_writes
from thattn import tasks
from thattn.data import tokenizers
from thattn.training import options as options_lib
from thattn.training import trainer

_ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
_OPTIONS = dict(train_steps=2, batch_size=4, sequence_length=24,
                warmup_steps=1, log_every=1, checkpoint_every=2, eval_steps=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  # Python's reference topics: real prose, with no corpus to build.
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp("export_data")
  documents = [topics.topics[name].strip() for name in sorted(topics.topics)
               if len(topics.topics[name]) > 2000][:20]
  (folder / "train.txt").write_text("\n\n".join(documents))
  paragraphs = [line for d in documents for line in d.split("\n")]
  tokenizers.train_sentencepiece(paragraphs, 500).save(
      str(folder / "tokenizer"))
  return tasks.DataOptions(train_files=str(folder / "train.txt"),
                                tokenizer=str(folder / "tokenizer"))


def _train(model_dir, data, task, preset):
  trainer.train(model_dir=str(model_dir), task=task, data=data,
                model=tasks.ModelOptions(preset=preset, overrides={
                    "attention": "talking_heads", "dropout_rate": 0.0}),
                options=options_lib.TrainOptions(**_OPTIONS),
                log=lambda line: None)
  return model_dir


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory, data):
  return _train(tmp_path_factory.mktemp("bert_run"), data, "mlm", "bert_tiny")


def _fresh_process(script):
  """Runs script in a new Python that imports only TF and TF Text first."""
  prelude = textwrap.dedent("""
      import json, sys
      import tensorflow as tf
      import tensorflow_text  # registers the tokenizers' ops
  """)
  check = textwrap.dedent("""
      loaded = sorted(m for m in sys.modules
                      if m.split(".")[0] in ("thattn", "tf_keras"))
      print(json.dumps({"result": result, "modules": loaded}))
  """)
  completed = subprocess.run(
      [sys.executable, "-c", prelude + textwrap.dedent(script) + check],
      capture_output=True, text=True, env=_ENV, timeout=300, check=False,
      cwd="/")
  assert completed.returncode == 0, completed.stderr[-3000:]
  output = json.loads(completed.stdout.strip().splitlines()[-1])
  assert output["modules"] == []  # served without thattn or tf-keras
  return output["result"]


def test_bert_export_serves_raw_strings_in_a_fresh_process(bert_run,
                                                           tmp_path):
  export_dir = export.export(model_dir=str(bert_run),
                             export_dir=str(tmp_path / "bert"),
                             log=lambda line: None)
  assert sorted(os.listdir(os.path.join(export_dir, "assets"))) == [
      "sentencepiece.model", "tokenizer.json"]
  result = _fresh_process(f"""
      model = tf.saved_model.load({export_dir!r})
      text = tf.constant(["A list holds items.", "Short."])
      out = model.signatures["serving_default"](text=text)
      again = model.signatures["serve_token_ids"](
          input_word_ids=out["input_word_ids"], input_mask=out["input_mask"],
          input_type_ids=tf.zeros_like(out["input_mask"]))
      result = {{"shape": out["sequence_output"].shape.as_list(),
                "mask": out["input_mask"].numpy().sum(1).tolist(),
                "same": bool(tf.reduce_all(tf.abs(
                    again["sequence_output"] - out["sequence_output"]) < 1e-5))}}
  """)
  assert result["shape"][0] == 2 and result["shape"][2] == 32
  assert result["mask"][0] > result["mask"][1] >= 3  # [CLS] ... [SEP]
  assert result["same"]
  shown = subprocess.run(
      [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"),
       "show", "--all", "--dir", export_dir],
      capture_output=True, text=True, env=_ENV, timeout=300, check=True)
  for expected in ("signature_def['serving_default']", "inputs['text']",
                   "dtype: DT_STRING", "signature_def['serve_token_ids']",
                   "outputs['sequence_output']"):
    assert expected in shown.stdout


def test_t5_export_generates_text(tmp_path, data):
  run = _train(tmp_path / "t5_run", data, "span_corruption", "t5_tiny")
  export_dir = export.export(model_dir=str(run),
                             export_dir=str(tmp_path / "t5"),
                             log=lambda line: None)
  result = _fresh_process(f"""
      model = tf.saved_model.load({export_dir!r})
      out = model.signatures["serving_default"](
          text=tf.constant(["The function returns a list."]))
      result = {{"text": out["text"].numpy()[0].decode(),
                "tokens": out["tokens"].shape.as_list()}}
  """)
  assert isinstance(result["text"], str)
  assert result["tokens"][0] == 1


def test_failed_export_leaves_nothing_and_keeps_the_old_one(
    bert_run, tmp_path, monkeypatch):
  export_dir = tmp_path / "served"

  def fail(*args, **kwargs):
    raise OSError("disk full (injected)")

  monkeypatch.setattr(export, "_write_info", fail)
  with pytest.raises(OSError, match="injected"):
    export.export(model_dir=str(bert_run), export_dir=str(export_dir),
                  log=lambda line: None)
  assert os.listdir(tmp_path) == []  # no export, no staging folder
  monkeypatch.undo()
  export.export(model_dir=str(bert_run), export_dir=str(export_dir),
                log=lambda line: None)
  before = (export_dir / "saved_model.pb").read_bytes()
  monkeypatch.setattr(export, "_write_info", fail)
  with pytest.raises(OSError, match="injected"):
    export.export(model_dir=str(bert_run), export_dir=str(export_dir),
                  log=lambda line: None)
  assert os.listdir(tmp_path) == ["served"]
  assert (export_dir / "saved_model.pb").read_bytes() == before
  with open(export_dir / export.EXPORT_INFO) as f:
    assert json.load(f)["task"] == "mlm"


def test_export_needs_a_trained_model_dir(tmp_path):
  with pytest.raises(ValueError, match="no run_config.json"):
    export.export(model_dir=str(tmp_path), export_dir=str(tmp_path / "x"))


def test_classification_export_serves_predictions(bert_run, tmp_path, data):
  rows = "".join(f"a {word} movie\t{label}\n" for word, label in
                 (("good", 1), ("bad", 0)) * 4)
  (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + rows)
  run = tmp_path / "classifier"
  trainer.train(
      model_dir=str(run), task="classification",
      data=tasks.DataOptions(train_files=str(tmp_path / "train.tsv")),
      options=options_lib.TrainOptions(**dict(_OPTIONS,
                                          init_checkpoint=str(bert_run))),
      log=lambda line: None)
  module, _, _ = export.build_serving_module(str(run))
  out = module.serve_text(np.array(["a good movie", "a bad movie"]))
  assert out["logits"].shape == [2, 2]
  assert out["predictions"].shape == [2]


# ---- an export never deletes what it did not write (issue 27) -------------


@pytest.fixture
def runs(bert_run, tmp_path):
  """A folder holding a copy of the trained run, `runs/run`."""
  shutil.copytree(bert_run, tmp_path / "runs" / "run")
  return tmp_path / "runs"


@pytest.mark.parametrize("where, message", [
    ("run", "is a training run's folder (it holds run_config.json)"),
    (".", "holds the training run"),
    ("run/checkpoints", "lies inside the training run"),
    ("run/tokenizer/new", "lies inside the training run"),
])
def test_an_export_into_a_run_is_refused_and_the_run_kept(
    runs, where, message, unchanged):
  export_dir = os.path.normpath(runs / where)
  with unchanged(runs), pytest.raises(ValueError) as error:
    export.export(model_dir=str(runs / "run"), export_dir=export_dir,
                  overwrite=True, log=lambda line: None)
  assert message in str(error.value) and repr(export_dir) in str(error.value)
  assert models.load(str(runs / "run")).count_params() > 0  # restores


@pytest.mark.parametrize("where", ["run", "."])
def test_thattn_export_overwrite_into_a_run_or_its_parent_is_refused(
    runs, where, unchanged):
  export_dir = os.path.normpath(runs / where)
  with unchanged(runs):
    result = subprocess.run(
        [*cli.command("export"), f"--model_dir={runs / 'run'}",
         f"--export_dir={export_dir}",
         "--overwrite"], env=_ENV, capture_output=True, text=True,
        timeout=300, check=False)
  assert result.returncode == 1, result.stdout[-2000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"thattn-export: error: export_dir='{export_dir}'")
  assert "training run" in last and "never deletes a run" in last
  assert models.load(str(runs / "run")).count_params() > 0


def test_user_files_are_refused_even_with_overwrite(bert_run, tmp_path,
                                                    unchanged):
  (tmp_path / "mine").mkdir()
  (tmp_path / "mine" / "notes.txt").write_text("my notes")
  with unchanged(tmp_path), pytest.raises(
      ValueError, match=r"1 entries that are not a thattn export \(notes.txt\)"
      ".*never deletes files it did not write"):
    export.export(model_dir=str(bert_run), export_dir=str(tmp_path / "mine"),
                  overwrite=True, log=lambda line: None)


def test_a_killed_exports_staging_folder_goes_with_the_next_export(
    bert_run, tmp_path, killed_staging):
  target = tmp_path / "served"
  killed = killed_staging(target, "thattn-export")  # SIGKILLed mid-write
  # A converted copy staged beside the target (an mtf run's export).
  converted = killed_staging(target, "thattn-export", ".converted")
  # Not removed: a live process's staging folder, and one without thattn's
  # marker (a name alone does not make a folder thattn's).
  live = tmp_path / f".served.incomplete-{os.getppid()}"
  live.mkdir()
  (live / staged_writes.MARKER).write_text(json.dumps(
      {"pid": os.getppid(), "host": socket.gethostname()}))
  (tmp_path / ".served.incomplete-999999999").mkdir()
  lines = []
  export.export(model_dir=str(bert_run), export_dir=str(target),
                log=lines.append)
  for folder in (killed, converted):
    assert not os.path.exists(folder)
    assert f"Removed {folder}, left by a killed thattn process." in lines
  assert sorted(os.listdir(tmp_path)) == [
      f".served.incomplete-{os.getppid()}", ".served.incomplete-999999999",
      "served"]
  assert export.is_export(str(target))
  assert not (target / staged_writes.MARKER).exists()
  assert "serve_token_ids" in tf.saved_model.load(str(target)).signatures
