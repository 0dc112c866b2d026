"""Refused starts, checked in process before anything is written (issue 27).

Each refusal is a ValueError naming the flag or variable, the bad value
and what was expected, and leaves every folder as it was (`unchanged`).
"""

import json

import pytest

from thattn import launch
from thattn.training import options as options_lib
from thattn.training import run


def _mtf_run(folder):
  """A --backend=mtf model_dir, as far as its files tell (no checkpoint)."""
  folder.mkdir()
  (folder / "run_config.json").write_text(json.dumps(
      {"task": "span_corruption", "backend": "mtf", "sequence_length": 8,
       "preset": "t5_tiny", "overrides": {}}))
  (folder / "operative_config.gin").write_text("Unitransformer.d_model = 8\n")
  return folder


@pytest.mark.parametrize("backend", ["keras", "mtf"])
def test_an_mtf_run_as_init_checkpoint_is_named(tmp_path, backend,
                                                unchanged):
  init = _mtf_run(tmp_path / "mtf_run")
  options = options_lib.TrainOptions(init_checkpoint=str(init),
                                     backend=backend)
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    run.train(model_dir=str(tmp_path / "run"), task="span_corruption",
              options=options, log=lambda line: None)
  assert (f"--init_checkpoint={str(init)!r} is a Mesh TensorFlow model_dir"
          in str(error.value))
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("target", ["run", "."])
def test_an_export_dir_in_the_way_of_the_run_is_refused_before_training(
    tmp_path, target, unchanged):
  """thattn-train --export_dir=<its own model_dir> (or its parent): refused
  before a step or a file, without advice of a flag it does not have."""
  model_dir = tmp_path / "run"
  export_dir = (tmp_path / target).resolve()
  for existing in (False, True):  # a new run, then one already started
    if existing:
      model_dir.mkdir()
      (model_dir / "checkpoint").write_text("model_checkpoint_path: \"x\"\n")
    with unchanged(tmp_path), pytest.raises(ValueError) as error:
      launch.train(model_dir=str(model_dir), task="mlm",
                   options=options_lib.TrainOptions(train_steps=1),
                   export_dir=str(export_dir), log=pytest.fail)
    assert f"export_dir={str(export_dir)!r}" in str(error.value)
    assert "--overwrite" not in str(error.value)


def test_exporting_an_mtf_run_refuses_its_own_folder_and_leaves_no_copy(
    tmp_path, unchanged):
  """--overwrite is accepted (it changes nothing); the target is checked
  before the conversion; a failed conversion leaves no staged copy."""
  mtf_run = _mtf_run(tmp_path / "mtf_run")
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    launch.export_run(model_dir=str(mtf_run), export_dir=str(mtf_run),
                      overwrite=True, log=pytest.fail)
  assert "is a training run's folder" in str(error.value)
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    launch.export_run(model_dir=str(mtf_run), export_dir=str(tmp_path / "s"),
                      checkpoint="model.ckpt-1", log=pytest.fail)
  assert "--checkpoint applies to Keras runs" in str(error.value)
  with unchanged(tmp_path), pytest.raises(ValueError) as error:
    launch.export_run(model_dir=str(mtf_run), export_dir=str(tmp_path / "s"),
                      overwrite=True, log=lambda line: None)
  assert "--overwrite" not in str(error.value)
