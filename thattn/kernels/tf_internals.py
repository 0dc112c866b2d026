"""The two questions about TensorFlow's tracing state that need private APIs.

The fused kernel is a custom op, so it must stay out of two kinds of graph:
a SavedModel (which must load where thattn's kernel is not installed) and an
XLA cluster (which cannot compile an op it does not know). Neither
TensorFlow 2.21 nor tf-keras 2.21 has a public API that tells whether the
current trace is either, so the two private imports live here, together,
and nowhere else. Both are TensorFlow's own, so the kernel runs under
Keras 3 on TensorFlow without tf-keras. tests/kernels/tf_internals_test.py
fails, naming the symbol, when a TensorFlow upgrade moves one of them.
"""

import tensorflow as tf
# `save_context.in_save_context()` is True while `tf.saved_model.save` (and
# so tf-keras's SavedModel format) traces the functions it writes; it is
# what TensorFlow's own layers consult for the same purpose. The nearest
# public API, `tf.saved_model.SaveOptions`, only configures a save.
from tensorflow.python.saved_model import save_context
# `control_flow_util.GraphOrParentsInXlaContext(graph)` is TensorFlow's
# test for "traced under jit_compile" (tf-keras keeps a copy of it and picks
# between its kernels with it the same way). The public
# `tf.config.optimizer.get_jit()` reports only the global auto-clustering
# switch, not a `jit_compile=True` function.
from tensorflow.python.ops import control_flow_util


def in_saved_model_tracing():
  """Whether `tf.saved_model.save` is tracing the current function."""
  return save_context.in_save_context()


def in_xla_context():
  """Whether the current graph, or one it is nested in, compiles with XLA."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())
