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
`mesh_tensorflow.transformer` still does not import: it needs
tensorflow_datasets and more, which thattn does not use.

Usage:

    from thattn.mtf import compat
    mtf = compat.import_mesh_tensorflow()
"""

import importlib
import sys
import types

import tensorflow as tf

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
