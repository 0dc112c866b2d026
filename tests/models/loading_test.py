"""thattn.models.load: a model_dir's backbone, and what it refuses."""

import json

import numpy as np
import pytest
import tensorflow as tf

from thattn import models
from thattn.io import run_dir


def _model_dir(folder, run_config, model=None):
  folder.mkdir()
  (folder / "run_config.json").write_text(json.dumps(run_config))
  if model is not None:
    tf.train.CheckpointManager(tf.train.Checkpoint(backbone=model),
                               str(folder / "checkpoints"),
                               max_to_keep=1).save(checkpoint_number=3)
  return str(folder)


def test_load_restores_the_latest_checkpoint(tmp_path):
  model = models.create_model("t5_tiny", num_heads=2)
  folder = _model_dir(tmp_path / "run", {
      "task": "span_corruption", "preset": "t5_tiny",
      "overrides": {"num_heads": 2}}, model)
  loaded = models.load(folder)
  assert len(loaded.weights) == len(model.weights)
  for a, b in zip(model.weights, loaded.weights):
    assert np.array_equal(a.numpy(), b.numpy()), a.name


def test_load_names_what_is_missing(tmp_path):
  with pytest.raises(ValueError, match="run_config.json"):
    models.load(str(tmp_path))
  folder = _model_dir(tmp_path / "no_checkpoint",
                      {"task": "mlm", "preset": "bert_tiny", "overrides": {}})
  with pytest.raises(ValueError, match="holds no checkpoint"):
    models.load(folder)
  folder = _model_dir(tmp_path / "recall", {"task": "recall", "preset": None})
  with pytest.raises(ValueError, match="no backbone preset"):
    models.load(folder)
  folder = _model_dir(tmp_path / "mtf", {
      "task": "span_corruption", "preset": "t5_tiny", "overrides": {},
      "backend": "mtf"})
  with pytest.raises(ValueError, match=r"--backend=mtf run; convert it "
                     r"first: thattn-convert --mtf_model_dir=.*mtf"):
    models.load(folder)


def test_load_refuses_a_checkpoint_of_another_model(tmp_path):
  folder = _model_dir(tmp_path / "run", {
      "task": "span_corruption", "preset": "t5_tiny",
      "overrides": {"num_heads": 8}},
      models.create_model("t5_tiny", num_heads=2, d_model=16))
  with pytest.raises(ValueError, match=r"ckpt-3 cannot be restored"):
    models.load(folder)


@pytest.mark.parametrize("text, message", [
    ("{\"task\": ", r"cannot be read \(not JSON: "),
    ("", r"cannot be read \(it is empty\)"),
    ("\xff\xfe", r"cannot be read \(not JSON: "),
    ("[1, 2]", "holds a JSON list, not the JSON object"),
])
def test_a_damaged_run_config_is_named(tmp_path, text, message, unchanged):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "run_config.json").write_bytes(
      text.encode("latin-1"))
  with unchanged(tmp_path), pytest.raises(ValueError, match=message) as error:
    models.load(str(tmp_path / "run"))
  assert str(tmp_path / "run" / "run_config.json") in str(error.value)


def test_an_unknown_backend_is_named_with_the_known_ones(tmp_path, unchanged):
  folder = _model_dir(tmp_path / "run", {"task": "mlm", "preset": "bert_tiny",
                                         "backend": "jax"})
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    models.load(folder)
  assert "\"backend\": 'jax' is not a thattn backend; expected one of " \
      "keras, keras3, mtf." in str(error.value)
  assert "thattn-convert" not in str(error.value)


@pytest.mark.parametrize("marker", ["run_config", "operative_config"])
def test_an_mtf_run_as_init_checkpoint_is_refused(tmp_path, marker,
                                                  unchanged):
  folder = tmp_path / "mtf_run"
  folder.mkdir()
  if marker == "run_config":  # thattn-train --backend=mtf
    (folder / "run_config.json").write_text(json.dumps(
        {"task": "span_corruption", "backend": "mtf"}))
  (folder / "operative_config.gin").write_text("Unitransformer.d_model = 8\n")
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    run_dir.check_init_checkpoint(str(folder))
  assert (f"--init_checkpoint={str(folder)!r} is a Mesh TensorFlow model_dir"
          in str(error.value))
  assert f"thattn-convert --mtf_model_dir={folder}" in str(error.value)
  run_dir.check_init_checkpoint(str(tmp_path / "keras_run"))  # not mtf: ok
