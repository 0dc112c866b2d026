"""Safetensors checkpoints of Keras 3 values
(thattn.io.safetensors_checkpoints), the store of keras3 runs on TensorFlow
and PyTorch, on this process's Keras 3 backend."""

import json
import os

import keras
import numpy as np
import pytest

from thattn.io import checkpoint_reading
from thattn.io import safetensors_checkpoints
from thattn.io import staged_writes


def _values(seed):
  rng = np.random.default_rng(seed)
  return {"weight.kernel": rng.normal(size=(6, 8)).astype("float32"),
          "weight.bias": rng.normal(size=(8,)).astype("float32"),
          "random.0000": np.array([seed, 7], "uint32"),
          "optimizer.0000.iteration": np.array(seed, "int64")}


def _variables(seed):
  return {key: keras.Variable(value, dtype=str(value.dtype), trainable=False,
                              name=key.replace(".", "_"))
          for key, value in _values(seed).items()}


def _numpy(variables):
  return {key: keras.ops.convert_to_numpy(variable.value)
          for key, variable in variables.items()}


def test_a_step_restores_every_value_and_its_meta(tmp_path):
  saved = _variables(1)
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  path = checkpoints.save(3, saved, meta={"initial_eval": 2.5})
  assert path == str(tmp_path / "3")
  assert os.listdir(path) == [safetensors_checkpoints.STATE_FILE]
  target = _variables(2)
  meta = safetensors_checkpoints.RunCheckpoints(str(tmp_path)).restore(
      3, target)
  assert meta == {"initial_eval": 2.5}
  for key, value in _numpy(saved).items():
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(
        target[key].value), value)
    assert target[key].dtype == saved[key].dtype


def test_the_readers_find_and_read_it_as_numpy(tmp_path):
  saved = _variables(4)
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  for step in (2, 4):
    checkpoints.save(step, saved, meta={"step": step})
  assert checkpoint_reading.latest(str(tmp_path)) == str(tmp_path / "4")
  assert checkpoint_reading.steps(str(tmp_path)) == [str(tmp_path / "2"),
                                                     str(tmp_path / "4")]
  assert checkpoint_reading.is_step(str(tmp_path / "4"))
  assert not checkpoint_reading.is_orbax_step(str(tmp_path / "4"))
  values = checkpoint_reading.read_step(str(tmp_path / "4"))
  assert sorted(values) == sorted(saved)
  for key, value in _numpy(saved).items():
    assert isinstance(values[key], np.ndarray)
    assert values[key].dtype == value.dtype
    np.testing.assert_array_equal(values[key], value)
  assert checkpoints.read(4)[1] == {"step": 4}
  assert checkpoints.saved_shapes(4)["weight.kernel"] == (6, 8)


def test_a_mismatch_names_every_key_and_restores_nothing(tmp_path):
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  checkpoints.save(1, _variables(1))
  target = _variables(2)
  del target["weight.bias"]
  target["weight.scale"] = keras.Variable(np.ones(8, "float32"))
  target["weight.kernel"] = keras.Variable(np.ones((6, 4), "float32"))
  before = _numpy(target)
  with pytest.raises(ValueError) as error:
    checkpoints.restore(1, target)
  for fragment in ("nothing was restored", "['weight.bias']",
                   "['weight.scale']", "weight.kernel: saved (6, 8), "
                   "variable (6, 4)"):
    assert fragment in str(error.value), str(error.value)
  for key, value in _numpy(target).items():
    np.testing.assert_array_equal(value, before[key])


def test_keeps_the_newest_and_deletes_only_its_own_steps(tmp_path):
  (tmp_path / "notes.txt").write_text("the user's")
  (tmp_path / "9").mkdir()  # a folder with a step's name, not a step
  (tmp_path / "9" / "data.txt").write_text("the user's")
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path),
                                                       max_to_keep=2)
  for step in (1, 2, 3):
    checkpoints.save(step, _variables(step))
  assert checkpoints.steps() == [2, 3]
  assert (tmp_path / "notes.txt").read_text() == "the user's"
  assert (tmp_path / "9" / "data.txt").read_text() == "the user's"


def test_a_killed_save_is_never_a_step_and_the_next_save_removes_it(
    tmp_path):
  # What a save killed before its rename leaves: its marked staging
  # folder, named for a process that is gone.
  staging = tmp_path / ".5.incomplete-999999999"
  staging.mkdir()
  (staging / safetensors_checkpoints.STATE_FILE).write_bytes(b"cut short")
  (staging / staged_writes.MARKER).write_text(json.dumps({
      "pid": 999999999, "host": os.uname().nodename,
      "program": "thattn-train", "target": str(tmp_path / "5")}))
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  assert (checkpoints.steps(), checkpoints.latest_step()) == ([], None)
  assert checkpoint_reading.latest(str(tmp_path)) is None
  checkpoints.save(5, _variables(5))
  assert not staging.exists()
  assert checkpoints.steps() == [5]
  assert not (tmp_path / "5" / staged_writes.MARKER).exists()


def test_a_step_saved_again_replaces_it(tmp_path):
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  checkpoints.save(2, _variables(1))
  checkpoints.save(2, _variables(7), meta={"again": True})
  values, meta = checkpoints.read(2)
  assert meta == {"again": True}
  np.testing.assert_array_equal(values["random.0000"], [7, 7])


def test_a_damaged_step_is_a_value_error_naming_it(tmp_path):
  checkpoints = safetensors_checkpoints.RunCheckpoints(str(tmp_path))
  path = checkpoints.save(6, _variables(6))
  state = os.path.join(path, safetensors_checkpoints.STATE_FILE)
  with open(state, "r+b") as f:
    f.truncate(os.path.getsize(state) // 2)
  with pytest.raises(ValueError, match=f"{path} cannot be read"):
    checkpoint_reading.read_step(path)
  with pytest.raises(ValueError, match=f"{path} cannot be read"):
    checkpoints.restore(6, _variables(1))


def test_a_model_dir_on_another_file_system_is_refused_by_name():
  with pytest.raises(ValueError, match="gs://bucket/run/checkpoints: a keras3 "
                     "run on TensorFlow or PyTorch keeps its checkpoints as "
                     "local files"):
    safetensors_checkpoints.RunCheckpoints("gs://bucket/run/checkpoints")
