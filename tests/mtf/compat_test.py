"""thattn.mtf.compat: mesh-tensorflow 0.1.21 imports and runs on TF 2.21."""

import importlib

import numpy as np
import tensorflow as tf

from thattn.mtf import compat


def test_install_is_idempotent_and_provides_the_missing_symbols():
  compat.install()
  compat.install()
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.framework import ops
  from tensorflow.python.framework import tensor_conversion_registry
  # pylint: enable=g-direct-tensorflow-import,g-import-not-at-top
  v1 = importlib.import_module("tensorflow.compat.v1")
  assert v1.estimator.SessionRunHook is tf.compat.v1.train.SessionRunHook
  assert (v1.estimator.CheckpointSaverListener
          is tf.compat.v1.train.CheckpointSaverListener)
  assert (ops.register_tensor_conversion_function
          is tensor_conversion_registry.register_tensor_conversion_function)


def test_mesh_tensorflow_core_imports():
  mtf = compat.import_mesh_tensorflow()
  assert compat.import_mesh_tensorflow() is mtf
  for name in ("ops", "layers", "optimize", "placement_mesh_impl",
               "simd_mesh_impl"):
    importlib.import_module(f"mesh_tensorflow.{name}")
  assert hasattr(mtf.optimize, "AdafactorOptimizer")


def test_dense_layer_lowers_and_runs_on_one_cpu_device():
  mtf = compat.import_mesh_tensorflow()
  v1 = tf.compat.v1
  rng = np.random.default_rng(0)
  x_value = rng.standard_normal((3, 4)).astype(np.float32)
  kernel_value = rng.standard_normal((4, 5)).astype(np.float32)
  with tf.Graph().as_default() as graph:
    mesh_graph = mtf.Graph()
    mesh = mtf.Mesh(mesh_graph, "mesh")
    batch, d_in, d_out = (mtf.Dimension("batch", 3), mtf.Dimension("d_in", 4),
                          mtf.Dimension("d_out", 5))
    x = mtf.import_tf_tensor(mesh, tf.constant(x_value),
                             mtf.Shape([batch, d_in]))
    y = mtf.layers.dense(
        x, [d_out], reduced_dims=[d_in], use_bias=False,
        kernel_initializer=v1.constant_initializer(kernel_value), name="dense")
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        shape=[], layout={}, devices=[""])
    lowering = mtf.Lowering(mesh_graph, {mesh: mesh_impl})
    y_tf = lowering.export_to_tf_tensor(y)
    with v1.Session(graph=graph) as session:
      session.run(v1.global_variables_initializer())
      session.run(lowering.copy_masters_to_slices())
      y_value = session.run(y_tf)
  assert y_value.shape == (3, 5)
  np.testing.assert_allclose(y_value, x_value @ kernel_value, rtol=1e-5,
                             atol=1e-5)


def test_mesh_tensorflow_transformer_imports_and_install_is_idempotent():
  transformer = compat.import_transformer()
  compat.install_transformer()
  assert compat.import_transformer() is transformer
  for name in ("transformer", "transformer_layers", "attention",
               "learning_rate_schedules", "utils"):
    importlib.import_module(f"mesh_tensorflow.transformer.{name}")
  v1 = importlib.import_module("tensorflow.compat.v1")
  assert v1.estimator.ModeKeys.TRAIN == "train"
  assert tf.estimator is v1.estimator  # gin.tf subclasses its hook


def test_the_removed_tpu_estimator_says_so_when_used():
  compat.install_transformer()
  # pylint: disable=g-direct-tensorflow-import,g-import-not-at-top
  from tensorflow.python.tpu import tpu_estimator
  # pylint: enable=g-direct-tensorflow-import,g-import-not-at-top
  try:
    tpu_estimator.TPUEstimator  # pylint: disable=pointless-statement
  except AttributeError as error:
    assert "removed from TensorFlow with TPUEstimator" in str(error)
  else:
    raise AssertionError("the stand-in should have no TPUEstimator")
