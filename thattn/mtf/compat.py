"""Make `import mesh_tensorflow` work on TensorFlow 2.21.

mesh-tensorflow 0.1.21 (its last release) reaches for two TensorFlow symbols
that TF 2.21 no longer has, so a plain `import mesh_tensorflow` fails:

1. `from tensorflow.compat.v1 import estimator` (in `mesh_tensorflow/ops.py`).
   TF 2.16 dropped `tf.estimator`. mtf only uses `estimator.SessionRunHook`
   and `estimator.CheckpointSaverListener` as base classes for its restore
   hook and saver listener, and both classes still live, unchanged, under
   `tf.compat.v1.train`. We register a tiny stand-in module
   `tensorflow.compat.v1.estimator` that exposes exactly those two names.
2. `tensorflow.python.framework.ops.register_tensor_conversion_function`
   (in `mesh_tensorflow/tpu_variables.py`). The function moved to
   `tensorflow.python.framework.tensor_conversion_registry`; we alias it
   back onto `ops`.

`install()` only adds what is missing, so it is idempotent and harmless when a
real `tf.compat.v1.estimator` is present. It does not touch anything else in
TensorFlow. With it, mtf's core (ops, layers, optimize, placement and SIMD
mesh implementations) imports and runs on CPU in a `tf.compat.v1` graph.

`mesh_tensorflow.transformer` needs three more things (`install_transformer()`
adds them, on top of `install()`):

3. `tf_estimator.ModeKeys` (`transformer.py` uses `ModeKeys.TRAIN` as a
   default argument at import time). TF 2.16 dropped it with `tf.estimator`;
   the same string constants ("train", "eval", "infer") still live in
   `tensorflow.python.saved_model.model_utils.mode_keys.EstimatorModeKeys`,
   which the stand-in exposes as `ModeKeys`.
4. `tf.estimator` on the top-level `tensorflow` module: `gin.tf` (imported by
   `transformer/utils.py`) subclasses `tf.estimator.SessionRunHook`. The same
   stand-in is set as `tf.estimator`.
5. `tensorflow.python.tpu.tpu_config` and `tpu_estimator` (imported by
   `transformer/utils.py`; removed with TPUEstimator in TF 2.16). They are
   registered as empty modules whose attributes raise an AttributeError
   saying that TPUEstimator is gone: only `utils.run` and its estimator
   helpers use them, and those cannot run on TF 2.21 (thattn runs mtf in a
   `tf.compat.v1` session instead).

It also needs the `[mtf]` extra of setup.py: gin-config, tensorflow-datasets
(imported by `transformer/dataset.py` and `vocabulary.py`) and setuptools < 81
(`utils.py` imports `pkg_resources`, which setuptools 81 removes).

Usage:

    from thattn.mtf import compat
    mtf = compat.import_mesh_tensorflow()
    transformer = compat.import_transformer()  # mesh_tensorflow.transformer
"""

import importlib
import sys
import types

import tensorflow as tf

from thattn.core import requirements

_ESTIMATOR_MODULE = "tensorflow.compat.v1.estimator"


def _install_estimator_stand_in():
  """Provides `tf.compat.v1.estimator` with the two hook classes mtf uses."""
  # Import by name: this puts the same `tensorflow.compat.v1` object in
  # sys.modules and on `tf.compat` that mtf's `import tensorflow.compat.v1`
  # will get (before that import, `tf.compat.v1` can be another wrapper).
  v1 = importlib.import_module("tensorflow.compat.v1")
  if _ESTIMATOR_MODULE in sys.modules or hasattr(v1, "estimator"):
    return
  stand_in = types.ModuleType(
      _ESTIMATOR_MODULE,
      "thattn stand-in for the removed tf.compat.v1.estimator: only the two "
      "classes mesh_tensorflow uses, taken from tf.compat.v1.train.")
  stand_in.SessionRunHook = tf.compat.v1.train.SessionRunHook
  stand_in.CheckpointSaverListener = tf.compat.v1.train.CheckpointSaverListener
  sys.modules[_ESTIMATOR_MODULE] = stand_in
  # `from tensorflow.compat.v1 import estimator` looks for the attribute first.
  setattr(v1, "estimator", stand_in)


def _install_tensor_conversion_alias():
  """Puts `register_tensor_conversion_function` back on framework `ops`."""
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.framework import ops
  from tensorflow.python.framework import tensor_conversion_registry
  # pylint: enable=g-direct-tensorflow-import,g-import-not-at-top
  if not hasattr(ops, "register_tensor_conversion_function"):
    ops.register_tensor_conversion_function = (
        tensor_conversion_registry.register_tensor_conversion_function)


def install():
  """Adds the two missing symbols if they are missing; safe to call again."""
  _install_estimator_stand_in()
  _install_tensor_conversion_alias()


def import_mesh_tensorflow():
  """Installs the compat symbols and returns the `mesh_tensorflow` module."""
  install()
  return importlib.import_module("mesh_tensorflow")


_TPU_MODULES = ("tensorflow.python.tpu.tpu_config",
                "tensorflow.python.tpu.tpu_estimator")


def _install_mode_keys():
  """Adds `ModeKeys` to the estimator stand-in (change 3 above)."""
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.saved_model.model_utils import mode_keys
  # pylint: enable=g-direct-tensorflow-import,g-import-not-at-top
  estimator = sys.modules[_ESTIMATOR_MODULE]
  if not hasattr(estimator, "ModeKeys"):
    estimator.ModeKeys = mode_keys.EstimatorModeKeys


def _install_top_level_estimator():
  """Sets `tf.estimator` to the stand-in when TF has none (change 4 above)."""
  if not hasattr(tf, "estimator"):
    tf.estimator = sys.modules[_ESTIMATOR_MODULE]


class _RemovedModule(types.ModuleType):
  """A module TF 2.21 no longer has: any attribute read says so."""

  def __getattr__(self, name):
    if name.startswith("__"):
      raise AttributeError(name)
    raise AttributeError(
        f"{self.__name__}.{name} was removed from TensorFlow with "
        "TPUEstimator (TF 2.16); thattn's stand-in only lets "
        "mesh_tensorflow.transformer.utils import. Run Mesh TensorFlow "
        "models in a tf.compat.v1 session instead of utils.run.")


def _install_tpu_stand_ins():
  """Registers the two removed TPU estimator modules (change 5 above)."""
  package = importlib.import_module("tensorflow.python.tpu")
  for name in _TPU_MODULES:
    short = name.rsplit(".", 1)[1]
    if name in sys.modules or hasattr(package, short):
      continue
    try:
      importlib.import_module(name)
      continue  # a TensorFlow that still has it
    except ImportError:
      pass
    module = _RemovedModule(name, "thattn stand-in for a module removed "
                            "from TensorFlow with TPUEstimator.")
    sys.modules[name] = module
    setattr(package, short, module)


def install_transformer():
  """`install()` plus what `mesh_tensorflow.transformer` needs; idempotent."""
  install()
  _install_mode_keys()
  _install_top_level_estimator()
  _install_tpu_stand_ins()


def import_transformer():
  """Installs every compat symbol; returns `mesh_tensorflow.transformer`.

  Raises:
    ImportError naming the `[mtf]` extra when gin-config,
    tensorflow-datasets or pkg_resources (setuptools < 81) is missing.
  """
  install_transformer()
  try:
    return importlib.import_module("mesh_tensorflow.transformer")
  except ImportError as error:
    if error.name in ("gin", "tensorflow_datasets", "pkg_resources"):
      raise ImportError(
          f"mesh_tensorflow.transformer needs {error.name!r}, which is not "
          f"installed: {requirements.install_command('mtf')} (gin-config, "
          "tensorflow-datasets, setuptools<81).", name=error.name) from error
    raise
