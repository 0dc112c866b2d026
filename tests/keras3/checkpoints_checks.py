"""Orbax checkpoints of Keras 3 values (thattn.io.orbax_checkpoints)
on 4 JAX CPU devices.

Run by `checkpoints_test.py` with KERAS_BACKEND=jax and
XLA_FLAGS=--xla_force_host_platform_device_count=4.
"""

import contextlib
import os

import jax
import keras
import numpy as np
import pytest

from thattn.io import orbax_checkpoints


def _values(seed):
  rng = np.random.default_rng(seed)
  return {"weight.kernel": rng.normal(size=(6, 8)).astype("float32"),
          "weight.bias": rng.normal(size=(8,)).astype("float32"),
          "random.0000": np.array([seed, 7], "uint32"),
          "optimizer.0000.iteration": np.array(seed, "int32")}


def _variables(seed, mesh_shape=None):
  """{key: Keras variable} of _values(seed); on a (batch, model) mesh of
  `mesh_shape`, the kernel's columns split over `model`."""
  scope = contextlib.nullcontext()
  if mesh_shape:
    mesh = keras.distribution.DeviceMesh(
        mesh_shape, ["batch", "model"],
        jax.devices()[:int(np.prod(mesh_shape))])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["weight_kernel"] = (None, "model")
    scope = keras.distribution.ModelParallel(
        layout_map=layout_map, batch_dim_name="batch").scope()
  with scope:
    return {key: keras.Variable(value, dtype=str(value.dtype),
                                trainable=False, name=key.replace(".", "_"))
            for key, value in _values(seed).items()}


def _numpy(variables):
  return {key: np.asarray(variable.value)
          for key, variable in variables.items()}


def _model_shards(variable):
  return len({(index[1].start, index[1].stop) for index in
              variable.value.sharding.devices_indices_map(
                  tuple(variable.shape)).values()})


@pytest.mark.parametrize("target_mesh", [None, (2, 2), (4, 1)])
def test_a_checkpoint_restores_onto_another_mesh(tmp_path, target_mesh):
  saved = _variables(1, mesh_shape=(1, 4))
  assert _model_shards(saved["weight.kernel"]) == 4
  checkpoints = orbax_checkpoints.RunCheckpoints(str(tmp_path))
  checkpoints.save(3, saved, meta={"initial_eval": 2.5})
  checkpoints.wait()
  target = _variables(2, mesh_shape=target_mesh)
  sharding = target["weight.kernel"].value.sharding
  meta = orbax_checkpoints.RunCheckpoints(str(tmp_path)).restore(3, target)
  assert meta == {"initial_eval": 2.5}
  for key, value in _numpy(saved).items():
    np.testing.assert_array_equal(np.asarray(target[key].value), value)
    assert target[key].dtype == saved[key].dtype
  assert target["weight.kernel"].value.sharding == sharding


def test_a_mismatch_names_every_key_and_restores_nothing(tmp_path):
  checkpoints = orbax_checkpoints.RunCheckpoints(str(tmp_path))
  checkpoints.save(1, _variables(1))
  checkpoints.wait()
  target = _variables(2)
  del target["weight.bias"]
  target["weight.scale"] = keras.Variable(np.ones(8, "float32"))
  target["weight.kernel"] = keras.Variable(np.ones((6, 4), "float32"))
  before = _numpy(target)
  with pytest.raises(ValueError) as error:
    checkpoints.restore(1, target)
  message = str(error.value)
  assert "saved values no variable takes: ['weight.bias']" in message
  assert ("variables the checkpoint has no value for: ['weight.scale']"
          in message)
  assert "weight.kernel: saved (6, 8), variable (6, 4)" in message
  for key, value in before.items():
    np.testing.assert_array_equal(np.asarray(target[key].value), value)


def test_keeps_the_newest_and_never_reads_an_unfinished_save(tmp_path):
  (tmp_path / "notes.txt").write_text("the user's")
  checkpoints = orbax_checkpoints.RunCheckpoints(str(tmp_path),
                                                  max_to_keep=2)
  for step in (1, 2, 3):
    checkpoints.save(step, _variables(step))
  checkpoints.wait()
  assert checkpoints.steps() == [2, 3]
  # What a save killed before Orbax renamed it into place leaves behind.
  unfinished = tmp_path / "4.orbax-checkpoint-tmp-1234567890"
  (unfinished / "state").mkdir(parents=True)
  reopened = orbax_checkpoints.RunCheckpoints(str(tmp_path), max_to_keep=2)
  assert (reopened.steps(), reopened.latest_step()) == ([2, 3], 3)
  assert (tmp_path / "notes.txt").read_text() == "the user's"


def test_read_gives_numpy_values_of_their_dtypes(tmp_path):
  saved = _variables(5, mesh_shape=(2, 2))
  checkpoints = orbax_checkpoints.RunCheckpoints(str(tmp_path),
                                                  async_save=True)
  checkpoints.save(5, saved, meta={"step": 5})
  checkpoints.wait()
  values, meta = checkpoints.read(5)
  assert meta == {"step": 5}
  assert sorted(values) == sorted(saved)
  for key, value in _numpy(saved).items():
    assert isinstance(values[key], np.ndarray)
    assert values[key].dtype == value.dtype
    np.testing.assert_array_equal(values[key], value)
  assert {"meta", "state"} <= set(os.listdir(tmp_path / "5"))
