"""Installing by need: each pip extra brings what it promises, and no more.

- `[jax]` is installed for real, by pip from its cache, into a fresh venv
  from thattn's wheel (built from a copy of the source): there, with no
  TensorFlow installed, `thattn.keras3` trains a BERT step on JAX, and the
  TensorFlow side (`thattn.layers`, the tf_keras models and optimizers,
  DTensor layouts, `thattn-train`) stops with one line naming
  `pip install -e '.[tensorflow]'` (and the package index's form);
  `thattn-complexity` (plain Python) runs; the package metadata carries the
  Apache-2.0 license.
- `[torch]`, `[tensorflow]`, `[mtf]` and no extra are resolved by pip
  against an empty environment (`--dry-run --ignore-installed --report`):
  the exact list a fresh venv would get, checked for what it must and must
  not hold, without writing their 1-2 GB of wheels (the real `[jax]`
  install alone takes about 40 s). The PyTorch step runs in thattn's own
  venv in a process where TensorFlow cannot be imported
  (tests/gpu_machine/sitecustomize.py, as on the GPU machines).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_TENSORFLOW = str(ROOT / "tests" / "gpu_machine")
# The checkout form first (thattn is not on PyPI), then the package index's.
_TENSORFLOW_PIP = ("pip install -e '.[tensorflow]' in a thattn checkout, "
                   "or pip install 'thattn[tensorflow]'")

# A BERT step on the Keras 3 backend the environment names: a classifier on
# a tiny talking-heads BERT's pooled output, one Adafactor step, every
# weight moved, and TensorFlow never imported.
_BERT_STEP = """
import sys
import keras
import numpy as np
import thattn
from thattn.keras3 import optimizers

backbone = thattn.keras3.models.create_model(
    "bert_tiny", attention="talking_heads", num_layers=1)
logits = keras.layers.Dense(2)(backbone.output["pooled_output"])
model = keras.Model(backbone.inputs, logits)
model.compile(optimizer=optimizers.Adafactor(learning_rate=0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
batch = {"input_word_ids": rng.integers(1, 100, (4, 16)).astype("int32"),
         "input_mask": np.ones((4, 16), "int32"),
         "input_type_ids": np.zeros((4, 16), "int32")}
before = model.get_weights()
loss = float(model.train_on_batch(batch, np.array([0, 1, 0, 1])))
moved = sum(not np.array_equal(old, new)
            for old, new in zip(before, model.get_weights()))
assert np.isfinite(loss) and moved == len(before), (loss, moved, len(before))
# A keras3 run's checkpoint (Orbax, in the [jax] extra) saves and restores.
from thattn.io import orbax_checkpoints
state = {f"weight.{i:04d}": v for i, v in enumerate(model.weights)}
checkpoints = orbax_checkpoints.RunCheckpoints("checkpoints")
checkpoints.save(1, state)
checkpoints.wait()
saved = model.get_weights()
model.train_on_batch(batch, np.array([1, 0, 1, 0]))
checkpoints.restore(1, state)
assert all(np.array_equal(a, b) for a, b in zip(saved, model.get_weights()))
assert sys.modules.get("tensorflow") is None, "TensorFlow was imported"
print(keras.backend.backend(), "BERT step, loss", loss)
"""

# In the [jax] venv: what is not there, and what says so.
_WITHOUT_TENSORFLOW = """
import importlib.util
from importlib import metadata
import thattn

for name in ("tensorflow", "tf_keras", "tensorflow_text", "mesh_tensorflow",
             "torch"):
  assert importlib.util.find_spec(name) is None, name + " is installed"
assert metadata.version("thattn") == thattn.__version__
assert metadata.metadata("thattn")["License"] == "Apache-2.0"
assert thattn.sharding.MeshSpec.parse("batch:2,model:2")  # plain Python
for name in ("layers", "optimizers", "models.create_model",
             "models.load", "sharding.make_mesh"):
  try:
    value = thattn
    for part in name.split("."):
      value = getattr(value, part)
  except ImportError as error:
    assert "pip install -e '.[tensorflow]' in a thattn checkout" in str(
        error), error
  else:
    raise AssertionError("thattn." + name + " imported without TensorFlow")
# The tasks import without it (the Keras 3 step reads them), and their data
# refuses when first used.
from thattn import tasks
assert tasks.get("mlm").name == "mlm"
try:
  tasks.text.has_tokenizer("folder")
except ImportError as error:
  assert "pip install -e '.[tensorflow]' in a thattn checkout" in str(
      error), error
else:
  raise AssertionError("a task's data ran without TensorFlow")
print("refused as expected")
"""


def _run(argv, **kwargs):
  return subprocess.run(argv, capture_output=True, text=True, timeout=600,
                        check=False, **kwargs)


def _source_copy(folder):
  """What `pip install thattn` builds from, outside the checkout (pip's
  setuptools build writes build/ and *.egg-info beside setup.py)."""
  for name in ("setup.py", "README.md", "LICENSE"):
    shutil.copy(ROOT / name, folder / name)
  shutil.copytree(ROOT / "thattn", folder / "thattn",
                  ignore=shutil.ignore_patterns("__pycache__"))
  return folder


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  """thattn's wheel, built once from a copy of the source, as PyPI would
  serve it."""
  source = _source_copy(tmp_path_factory.mktemp("thattn_source"))
  wheels = tmp_path_factory.mktemp("wheels")
  result = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                 "--wheel-dir", str(wheels), str(source)])
  assert result.returncode == 0, result.stderr[-3000:]
  (path,) = wheels.glob("thattn-*.whl")
  return path


@pytest.fixture(scope="module")
def jax_venv(tmp_path_factory, wheel):
  venv = tmp_path_factory.mktemp("jax_venv")
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
  result = _run([str(venv / "bin" / "pip"), "install", "--quiet",
                 f"thattn[jax] @ {wheel.as_uri()}"])
  assert result.returncode == 0, result.stderr[-3000:]
  return venv


def _env(**changes):
  env = {key: value for key, value in os.environ.items()
         if key not in ("PYTHONPATH", "KERAS_BACKEND")}
  env.update(changes)
  return env


def test_the_jax_extra_trains_a_keras3_bert_step_without_tensorflow(
    jax_venv, tmp_path):
  python = str(jax_venv / "bin" / "python")
  result = _run([python, "-c", _WITHOUT_TENSORFLOW], cwd=tmp_path,
                env=_env())
  assert result.returncode == 0, result.stderr[-3000:]
  # THATTN_FUSED_KERNELS=0: a fresh venv would compile the fused kernel
  # with g++ first (tests/keras3 hold it to its word on JAX).
  result = _run([python, "-c", _BERT_STEP], cwd=tmp_path,
                env=_env(KERAS_BACKEND="jax", THATTN_FUSED_KERNELS="0"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "jax BERT step" in result.stdout


def test_the_jax_extra_names_what_is_missing(jax_venv, tmp_path):
  python = str(jax_venv / "bin" / "python")
  # Keras 3's default backend is TensorFlow, which is not there.
  result = _run([python, "-c", "import thattn.keras3"], cwd=tmp_path,
                env=_env())
  assert result.returncode != 0
  assert "KERAS_BACKEND=jax" in result.stderr.splitlines()[-1], result.stderr
  result = _run([str(jax_venv / "bin" / "thattn-train")], cwd=tmp_path,
                env=_env())
  assert result.returncode != 0
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("thattn-train: error:") and _TENSORFLOW_PIP in last
  result = _run([str(jax_venv / "bin" / "thattn-complexity"),
                 "--variant=talking_heads", "--num_heads=24", "--key_dim=32"],
                cwd=tmp_path, env=_env())
  assert result.returncode == 0, result.stderr[-2000:]
  assert "| talking_heads | 24 | 24 | 24 | 32 | 32 |" in result.stdout


def test_the_jax_extra_loads_a_keras3_run_as_thattn_models_loads_it(
    jax_venv, tmp_path, tiny_bert_flags):
  """A keras3 run made on PyTorch (safetensors steps), read in a venv of
  `.[jax]` alone, gives the backbone `thattn.models.load` gives here."""
  pytest.importorskip("torch")
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tests import cli  # pylint: disable=g-import-not-at-top
  from thattn import models  # pylint: disable=g-import-not-at-top
  run = tmp_path / "run"
  cli.run_ok(cli.command("train", f"--model_dir={run}", "--backend=keras3",
                         "--train_steps=2", *tiny_bert_flags),
             env=_env(KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="2"))
  ids = np.random.default_rng(0).integers(5, 60, (2, 12)).astype(np.int32)
  np.save(tmp_path / "ids.npy", ids)
  result = _run([str(jax_venv / "bin" / "python"),
                 str(ROOT / "tests" / "keras3" / "load_backbone.py"),
                 str(run), str(tmp_path / "ids.npy"),
                 str(tmp_path / "out.npy")], cwd=tmp_path,
                env=_env(KERAS_BACKEND="jax", THATTN_FUSED_KERNELS="0"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "tensorflow imported: False" in result.stdout, result.stdout
  want = models.load(str(run))(
      {"input_word_ids": ids, "input_mask": np.ones_like(ids),
       "input_type_ids": np.zeros_like(ids)},
      training=False)["sequence_output"].numpy()
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, rtol=0,
                             atol=1e-5 * np.abs(want).max())


def test_the_torch_backend_trains_a_keras3_bert_step_without_tensorflow(
    tmp_path):
  result = _run([sys.executable, "-c", _BERT_STEP], cwd=tmp_path,
                env=_env(KERAS_BACKEND="torch", PYTHONPATH=NO_TENSORFLOW))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "torch BERT step" in result.stdout


def _resolved(wheel, extra, tmp_path):
  """The distributions pip would install for `thattn[extra]` into an empty
  environment, by name (lower case)."""
  report = tmp_path / f"report_{extra or 'none'}.json"
  target = f"thattn{f'[{extra}]' if extra else ''} @ {wheel.as_uri()}"
  result = _run([sys.executable, "-m", "pip", "install", "--quiet",
                 "--dry-run", "--ignore-installed", "--report", str(report),
                 target])
  assert result.returncode == 0, result.stderr[-3000:]
  return {item["metadata"]["name"].lower().replace("_", "-")
          for item in json.loads(report.read_text())["install"]}


_FRAMEWORKS = {"tensorflow", "tf-keras", "tensorflow-text", "keras", "jax",
               "jaxlib", "torch", "mesh-tensorflow"}


@pytest.mark.parametrize("extra, brings", [
    (None, set()),
    ("torch", {"keras", "torch"}),
    ("tensorflow", {"keras", "tensorflow", "tf-keras", "tensorflow-text"}),
    ("mtf", {"keras", "tensorflow", "tf-keras", "tensorflow-text",
             "mesh-tensorflow"}),
])
def test_each_extra_brings_its_frameworks_and_no_other(wheel, tmp_path,
                                                        extra, brings):
  resolved = _resolved(wheel, extra, tmp_path)
  assert {"thattn", "absl-py", "numpy"} <= resolved
  assert resolved & _FRAMEWORKS == brings, sorted(resolved & _FRAMEWORKS)
