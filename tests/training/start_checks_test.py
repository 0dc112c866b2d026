"""Refused starts, checked in process before anything is written (issue 27).

Each refusal is a ValueError naming the flag or variable, the bad value
and what was expected, and leaves every folder as it was (`unchanged`).
"""

import json

import pytest

from tests.training import local_cluster
from thattn import launch
from thattn.mtf import cluster as mtf_cluster
from thattn.training import cluster
from thattn.training import dtensor
from thattn.training import options as options_lib
from thattn.training import run
from thattn.training import strategies


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


_WORKERS = {"worker": ["localhost:1", "localhost:2"]}


@pytest.mark.parametrize("tf_config, named", [
    ("{not json", "TF_CONFIG='{not json' is not valid JSON"),
    ("[1, 2]", "TF_CONFIG='[1, 2]' is not a JSON object"),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "worker", "index": 2}}),
     "TF_CONFIG's task worker 2 is not in its cluster, which has worker 0-1"),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "worker", "index": -1}}),
     "TF_CONFIG's task \"index\" is -1; expected a non-negative integer"),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "worker",
                                               "index": "one"}}),
     "TF_CONFIG's task \"index\" is 'one'; expected a non-negative integer"),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "worker",
                                               "index": 1.5}}),
     "TF_CONFIG's task \"index\" is 1.5"),
    (json.dumps({"cluster": {"worker": "localhost:1"},
                 "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG's cluster job 'worker' is 'localhost:1'; expected a list"),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "chief", "index": 0}}),
     "TF_CONFIG's task chief 0 is not in its cluster"),
])
def test_a_bad_tf_config_is_named(monkeypatch, tf_config, named):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  for parse in (cluster.task_spec, cluster.is_chief, mtf_cluster.from_tf_config):
    with pytest.raises(ValueError) as error:
      parse()
    assert named in str(error.value)


def test_a_multi_worker_cluster_without_chief_or_worker_is_named(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": {"ps": ["localhost:1", "localhost:2"]},
       "task": {"type": "ps", "index": 0}}))
  with pytest.raises(ValueError, match="TF_CONFIG's cluster .* has no chief or "
                     "worker to train on.*other jobs \\(ps\\)"):
    strategies.make_strategy("multi_worker_mirrored", cluster_timeout=1)
  monkeypatch.setenv("TF_CONFIG", json.dumps(
      {"cluster": dict(_WORKERS, chief=["localhost:3"]),
       "task": {"type": "worker", "index": "1"}}))
  assert cluster.task_spec()[:2] == ("worker", 1)  # a string index is taken
  cluster.check_multi_worker()


@pytest.mark.parametrize("variables, named", [
    ({"DTENSOR_NUM_CLIENTS": "abc"}, "DTENSOR_NUM_CLIENTS='abc' is not an "
     "integer of at least 1"),
    ({"DTENSOR_NUM_CLIENTS": "2", "DTENSOR_CLIENT_ID": "x"},
     "DTENSOR_CLIENT_ID='x' is not an integer"),
    ({"DTENSOR_NUM_CLIENTS": "2", "DTENSOR_CLIENT_ID": "2"},
     "DTENSOR_CLIENT_ID=2 is not one of the DTENSOR_NUM_CLIENTS=2 clients"),
    ({"DTENSOR_NUM_CLIENTS": "2", "DTENSOR_CLIENT_ID": "0",
      "DTENSOR_JOBS": "localhost:1,localhost:2,localhost:3"},
     "DTENSOR_JOBS='localhost:1,localhost:2,localhost:3' lists 3 addresses, "
     "but DTENSOR_NUM_CLIENTS=2"),
])
def test_bad_dtensor_variables_are_named(monkeypatch, variables, named):
  for name, value in variables.items():
    monkeypatch.setenv(name, value)
  for parse in (dtensor.num_clients, cluster.is_chief):
    with pytest.raises(ValueError) as error:
      parse()
    assert named in str(error.value)


def test_dtensor_clients_are_waited_for_in_bounded_time(monkeypatch):
  monkeypatch.setenv("DTENSOR_NUM_CLIENTS", "3")
  monkeypatch.setenv("DTENSOR_CLIENT_ID", "1")
  ports = local_cluster.free_ports(3)
  monkeypatch.setenv("DTENSOR_JOBS",
                     ",".join(f"localhost:{port}" for port in ports))
  lines = []
  with pytest.raises(ValueError) as error:
    cluster.wait_for_dtensor_clients(0.5, log=lines.append)
  assert (f"DTensor client 1 of 3 could not reach client 0 (localhost:"
          f"{ports[0]}), client 2 (localhost:{ports[2]}) within 0.5 s"
          in str(error.value))
  assert lines == [f"DTensor client 1: waiting up to 0.5 s for client 0 "
                   f"(localhost:{ports[0]}), client 2 (localhost:{ports[2]})."]
  monkeypatch.setenv("DTENSOR_NUM_CLIENTS", "1")
  cluster.wait_for_dtensor_clients(0.5, log=pytest.fail)  # one: no wait
