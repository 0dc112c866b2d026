"""thattn-train --strategy=dtensor across processes: multi-client DTensor.

Two client processes with two logical CPU devices each form one
`batch:2,model:2` mesh (TensorFlow's DTENSOR_* variables, loopback ports);
the reference is one process with four logical devices. Every client
writes its shards of one checkpoint into the model_dir; the rest of the
run's files come from client 0 only.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.training import local_cluster


@pytest.fixture(scope="module")
def flags(tiny_bert_flags):
  return tiny_bert_flags + ["--deterministic", "--checkpoint_every=2",
                            "--strategy=dtensor",
                            "--mesh_shape=batch:2,model:2", "--num_heads=4",
                            "--train_steps=4"]


def test_two_clients_equal_one_process_on_the_same_mesh(tmp_path, flags):
  argv = [sys.executable, "-m", "thattn.bin.train"] + flags
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             TMPDIR=str(tmp_path / "tmp"))
  (tmp_path / "tmp").mkdir()
  one = subprocess.run(argv + [f"--model_dir={tmp_path / 'one'}"], env=env,
                       capture_output=True, text=True, timeout=300,
                       check=False)
  assert one.returncode == 0, one.stderr[-3000:]
  with local_cluster.LocalCluster(
      argv + [f"--model_dir={tmp_path / 'two'}"], 2, env=env,
      envs=local_cluster.dtensor_envs(2)) as cluster:
    outputs = cluster.wait()
  for code, stdout, stderr in outputs:
    assert code == 0, stderr[-3000:]
    assert "the mesh as 2 logical devices" in stdout  # each client's half
  reference = local_cluster.train_losses(tmp_path / "one")
  losses = local_cluster.train_losses(tmp_path / "two")
  assert sorted(losses) == [1, 2, 3, 4]
  np.testing.assert_allclose([losses[s] for s in range(1, 5)],
                             [reference[s] for s in range(1, 5)], rtol=1e-5)
  np.testing.assert_allclose(
      local_cluster.summary(tmp_path / "two")["held_out_ln_ppl_after"],
      local_cluster.summary(tmp_path / "one")["held_out_ln_ppl_after"], rtol=1e-5)
  shards = [name for name in os.listdir(tmp_path / "two" / "checkpoints")
            if name.startswith("ckpt-4.data")]
  assert len(shards) >= 2  # written by both clients
  assert os.listdir(tmp_path / "tmp") == []  # client 1's own files: gone
