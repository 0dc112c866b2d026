"""The private TensorFlow symbols thattn relies on, and what it asks of them.

`thattn.kernels.tf_internals` wraps two private TensorFlow APIs. When a
TensorFlow upgrade moves one, the first test here names it; the others check
that each question gets True inside the context it is about and False
outside.
"""

import importlib

import tensorflow as tf

from thattn.kernels import tf_internals

PRIVATE_SYMBOLS = (
    ("tensorflow.python.saved_model.save_context", "in_save_context"),
    ("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext"),
)


def test_the_private_symbols_still_exist():
  for module_name, symbol in PRIVATE_SYMBOLS:
    try:
      module = importlib.import_module(module_name)
    except ImportError as error:
      raise AssertionError(
          f"{module_name} no longer imports ({error}), so {module_name}."
          f"{symbol} moved: update thattn/kernels/tf_internals.py.") from error
    assert callable(getattr(module, symbol, None)), (
        f"{module_name}.{symbol} is gone: TensorFlow moved it; "
        "update thattn/kernels/tf_internals.py.")


def _traced_values(function):
  """What `function()` returns while each of these traces it."""
  seen = {"eager": function()}

  @tf.function
  def plain():
    seen["tf.function"] = function()
    return tf.constant(0.0)

  @tf.function(jit_compile=True)
  def compiled():
    seen["jit_compile"] = function()
    return tf.constant(0.0)

  plain()
  compiled()
  return seen


def test_in_xla_context_only_under_jit_compile():
  assert _traced_values(tf_internals.in_xla_context) == {
      "eager": False, "tf.function": False, "jit_compile": True}


def test_in_xla_context_reaches_through_nested_graphs():
  seen = []

  @tf.function(jit_compile=True)
  def compiled(x):
    # The loop body is a graph of its own, nested in the compiled one.
    def body(i):
      seen.append(tf_internals.in_xla_context())
      return i + 1
    return tf.while_loop(lambda i: i < x, body, [tf.constant(0)])

  compiled(tf.constant(3))
  assert seen and all(seen)


def test_not_in_saved_model_tracing_outside_a_save():
  assert _traced_values(tf_internals.in_saved_model_tracing) == {
      "eager": False, "tf.function": False, "jit_compile": False}


def test_in_saved_model_tracing_while_saving(tmp_path):
  seen = []

  class Recorder(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def __call__(self, x):
      seen.append(tf_internals.in_saved_model_tracing())
      return x + 1.0

  # Not called before saving, so the save itself traces the function.
  tf.saved_model.save(Recorder(), str(tmp_path / "recorder"))
  assert seen and all(seen), seen
  assert not tf_internals.in_saved_model_tracing()  # and the save is over
