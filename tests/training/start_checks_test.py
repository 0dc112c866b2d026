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
      {"task": "span_corruption", "backend": "mtf"}))
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
