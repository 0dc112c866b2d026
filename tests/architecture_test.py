"""The package's shape, read from its source: who imports whom, and sizes.

docs/architecture.md draws the layers; this test holds the code to them.
Each package of `thattn` has a rank, and a module may import thattn code of
its own package or of a lower rank only, at any place in the module (a
function-level import counts too). Also:

- `absl.flags` is imported only by the binaries (`thattn/bin/`);
- the Keras side never imports Mesh TensorFlow: only `thattn/mtf/` (and
  the binaries) may import `thattn.mtf` or `mesh_tensorflow`;
- the Mesh TensorFlow backend is an adapter of the run driver
  (`thattn.training.run`), not a second trainer: `thattn/mtf/` never
  imports `thattn.training.trainer`.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "thattn"

# Lowest first; the same table is in docs/architecture.md.
RANKS = {
    "thattn": 0,  # the root's __init__; optimizers, export, launch below
    "thattn.core": 0,  # plain Python: dims, validation, complexity, ...
    "thattn.ops": 1,  # the math written once; TensorFlow's ops namespace
    "thattn.io": 1,  # model_dir, staged writes, checkpoints, the cache
    "thattn.optimizers": 1,  # tf_keras's Adafactor, on thattn.ops
    "thattn.kernels": 1,
    "thattn.sharding": 1,
    "thattn.layers": 2,
    "thattn.keras3": 2,  # the layers in Keras 3; see the test below
    "thattn.models": 3,
    "thattn.keras3.models": 3,  # the models in Keras 3, beside models
    "thattn.data": 4,
    "thattn.tasks": 5,
    "thattn.training": 6,
    "thattn.export": 7,
    "thattn.converters": 7,  # released checkpoints -> model_dirs; mtf uses its writer
    "thattn.experiments": 8,
    "thattn.launch": 8,  # thattn-train's library function, above export
    "thattn.mtf": 8,
    "thattn.bin": 9,
}


def _modules():
  return sorted(path for path in PACKAGE.rglob("*.py")
                if "__pycache__" not in path.parts)


def _module_name(path):
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(name):
  """The RANKS key that owns a dotted thattn name (longest prefix)."""
  for candidate in sorted(RANKS, key=len, reverse=True):
    if name == candidate or name.startswith(candidate + "."):
      return candidate
  return None


def _imports(path, source=None):
  """Every absolute module name `path` imports, with its line."""
  tree = ast.parse(path.read_text() if source is None else source,
                   filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, node.lineno
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        # `from thattn import tasks` imports the package thattn.tasks.
        yield f"{node.module}.{alias.name}", node.lineno


def _owner_package(path):
  name = _module_name(path)
  if path.parent == PACKAGE:  # a top-level module: its own rank (export)
    return name if name in RANKS else "thattn"
  return _package_of(name)


def _package_rank(imported):
  """The rank of what `imported` names; a root module counts as rank 0."""
  package = _package_of(imported)
  if package == "thattn" and imported.count(".") == 1:
    module = imported.split(".")[1]
    return RANKS.get(f"thattn.{module}", 0), package
  return RANKS[package], package


def _upward_imports(path, source=None):
  owner = _owner_package(path)
  upward = []
  for imported, line in _imports(path, source):
    if not imported.startswith("thattn"):
      continue
    rank, package = _package_rank(imported)
    if rank > RANKS[owner] and package != owner:
      upward.append(f"{path.relative_to(ROOT)}:{line} imports {imported} "
                    f"(rank {rank}), above its own package {owner} (rank "
                    f"{RANKS[owner]})")
  return upward


@pytest.mark.parametrize("path", _modules(),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_downwards(path):
  upward = _upward_imports(path)
  assert not upward, f"{upward}; see docs/architecture.md"


def test_only_the_binaries_define_flags():
  offenders = [f"{path.relative_to(ROOT)}:{line}"
               for path in _modules() for imported, line in _imports(path)
               if imported in ("absl.flags", "absl.flags.flags") and
               _owner_package(path) != "thattn.bin"]
  assert not offenders, f"absl.flags outside thattn/bin: {offenders}"


def test_only_the_mtf_package_imports_mesh_tensorflow():
  offenders = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for path in _modules() for imported, line in _imports(path)
               if (imported.startswith("mesh_tensorflow") or
                   imported.startswith("thattn.mtf")) and
               _owner_package(path) not in ("thattn.mtf", "thattn.bin")]
  assert not offenders, offenders


def test_the_mtf_backend_does_not_import_the_keras_trainer():
  offenders = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for path in _modules() for imported, line in _imports(path)
               if imported.startswith("thattn.training.trainer") and
               _owner_package(path) == "thattn.mtf"]
  assert not offenders, f"{offenders}; see docs/architecture.md"


# The kernels the Keras 3 layers call, which import Keras 3, JAX or no
# framework (the others are TensorFlow ops, reached only from fused.py and
# from dispatch.py's check of the TensorFlow op, made where TensorFlow is
# Keras 3's framework).
_KERAS3_KERNELS = tuple(f"thattn.kernels.{name}" for name in (
    "compiler", "cudnn", "dispatch", "jax_kernel", "kernel_choice", "pallas_kernel",
    "pallas_launch", "pallas_programs", "pallas_tiles"))

# The modules of thattn.ops written in plain Python (the others are
# TensorFlow's side of the ops namespace).
_PLAIN_OPS = ("thattn.ops.adafactor", "thattn.ops.blocks",
              "thattn.ops.dcmha", "thattn.ops.differential", "thattn.ops.embeddings",
              "thattn.ops.masks",
              "thattn.ops.output_gate", "thattn.ops.rotary")


def _keras3_may_import(path, imported):
  """thattn.keras3 runs on JAX and PyTorch: it may import keras, the
  plain-Python modules of thattn (thattn.core, the plain ops) and
  thattn.sharding's rules, but neither
  tf_keras nor TensorFlow nor the tf_keras front end (thattn.layers). The
  kernels it calls live in thattn.kernels: the Pallas, cuDNN and XLA FFI
  ones (`_KERAS3_KERNELS`) and, from `keras3/fused.py` only (on the
  TensorFlow backend), the fused TensorFlow op."""
  if imported.split(".")[0] in ("tf_keras", "tensorflow", "mesh_tensorflow",
                                "tensorflow_text"):
    return False
  allowed = {None, "thattn", "thattn.core", "thattn.keras3", "thattn.sharding"}
  if imported in _PLAIN_OPS or imported in _KERAS3_KERNELS:
    return True
  if path.name == "fused.py":
    allowed.add("thattn.kernels")
  return _package_of(imported) in allowed


@pytest.mark.parametrize("name", [n.split(".")[-1] for n in _KERAS3_KERNELS])
def test_the_keras3_kernels_import_no_tensorflow(name):
  path = PACKAGE / "kernels" / f"{name}.py"
  offenders = [imported for imported, _ in _imports(path)
               if imported.split(".")[0] in ("tensorflow", "tf_keras",
                                             "tensorflow_text") or
               imported.startswith(("thattn.layers", "thattn.keras3"))]
  assert not offenders, offenders


def test_the_kernel_compiler_imports_no_framework():
  path = PACKAGE / "kernels" / "compiler.py"
  frameworks = [imported for imported, _ in _imports(path)
                if imported.split(".")[0] in ("tensorflow", "jax", "keras",
                                              "tf_keras", "torch")]
  assert not frameworks, frameworks


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "core").glob("*.py")) +
    [PACKAGE / "ops" / "adafactor.py", PACKAGE / "ops" / "dcmha.py",
     PACKAGE / "ops" / "differential.py",
     PACKAGE / "ops" / "output_gate.py",
     PACKAGE / "ops" / "rotary.py"],
    ids=lambda p: p.name)
def test_the_plain_python_modules_import_no_framework(path):
  """thattn.core and the plain ops are what every front end shares, on any
  backend and with no framework installed: they import none, and only
  each other (NumPy, which every install has, draws the seeded initial
  weights)."""
  offenders = [imported for imported, _ in _imports(path)
               if imported.split(".")[0] in ("tensorflow", "jax", "keras",
                                             "tf_keras", "torch",
                                             "mesh_tensorflow") or
               (imported.startswith("thattn") and
                _package_of(imported) != "thattn.core" and
                imported not in _PLAIN_OPS)]
  assert not offenders, offenders


def test_the_keras3_layers_import_no_tf_keras():
  offenders = [f"{path.relative_to(ROOT)}:{line} imports {imported}"
               for path in _modules() for imported, line in _imports(path)
               if _owner_package(path) == "thattn.keras3" and
               not _keras3_may_import(path, imported)]
  assert not offenders, f"{offenders}; see docs/architecture.md"


# The plain-Python part of thattn.models that the Keras 3 models share.
_SHARED_MODEL_MODULES = ("thattn.models.config", "thattn.models.presets",
                         "thattn.models.wiring",
                         "thattn.models.heads_and_losses",
                         "thattn.models.hugging_face_decoders",
                         "thattn.models.hugging_face_encoders")


# What thattn.keras3.models.load reads a run with: the model_dir's layout
# and the checkpoint readers, which import no framework (an Orbax step
# reads on JAX alone, a safetensors step with NumPy), and, only inside the function that reads a
# tf.train checkpoint (TensorFlow's format, read through the tf_keras
# backbone it was saved from), thattn.models.loading; tests/keras3/
# loading_test.py loads a keras3 run with TensorFlow blocked.
_KERAS3_RUN_READERS = ("thattn.io.run_dir", "thattn.io.checkpoint_reading",
                       "thattn.io.orbax_checkpoints")
_KERAS3_LAZY_TF_KERAS = {("thattn.keras3.models.loading",
                          "thattn.models.loading")}
# A Hugging Face folder's files, read with NumPy and safetensors: what
# thattn.models.hugging_face_decoders and _encoders (shared) read them with.
_HUGGING_FACE_FILES = ("thattn.io.hugging_face_files",)


def test_the_keras3_models_import_only_keras3_and_the_shared_configs():
  """thattn.keras3.models runs on JAX and PyTorch: keras, thattn.keras3,
  rank-0 modules, the plain ops, and the configs, presets, wiring (which
  layers a model is made of), heads and losses and Hugging Face maps of
  thattn.models, written once for both front ends, which themselves import
  no framework."""
  offenders = []
  for path in _modules():
    owner = _owner_package(path)
    for imported, line in _imports(path):
      if owner == "thattn.keras3.models":
        allowed = (imported.startswith(_SHARED_MODEL_MODULES) or
                   imported in _PLAIN_OPS or
                   imported in _KERAS3_RUN_READERS or
                   (_module_name(path), imported) in _KERAS3_LAZY_TF_KERAS or
                   _package_of(imported) in (None, "thattn", "thattn.core",
                                             "thattn.keras3",
                                             "thattn.keras3.models"))
        allowed = allowed and imported.split(".")[0] not in (
            "tf_keras", "tensorflow", "mesh_tensorflow", "tensorflow_text")
      elif _module_name(path) in _SHARED_MODEL_MODULES:
        allowed = (imported.startswith(_SHARED_MODEL_MODULES) or
                   imported in _PLAIN_OPS or
                   imported in _HUGGING_FACE_FILES or
                   _package_of(imported) in (None, "thattn", "thattn.core"))
      else:
        continue
      if not allowed:
        offenders.append(f"{path.relative_to(ROOT)}:{line} imports "
                         f"{imported}")
  assert not offenders, f"{offenders}; see docs/architecture.md"


def test_the_checker_sees_upward_imports():
  """The rank check is not vacuous: upward imports, nested ones too, fail."""
  layer = PACKAGE / "layers" / "upward.py"  # read from `source`, not disk
  source = ("from thattn.core import dims\nfrom thattn.layers import base\n"
            "def f():\n  from thattn import tasks\n"
            "import thattn.models.config\n")
  assert sorted(line.split(" imports ")[1].split(" ")[0]
                for line in _upward_imports(layer, source)) == [
                    "thattn.models.config", "thattn.tasks"]
  assert _upward_imports(PACKAGE / "export.py",
                         "from thattn.experiments import ablation\n")
  assert not _upward_imports(PACKAGE / "bin" / "x.py",
                             "from thattn import export\n")
