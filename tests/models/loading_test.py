"""thattn.models.load: a model_dir's backbone, and what it refuses."""

import json

import numpy as np
import pytest
import tensorflow as tf

from thattn import models


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
