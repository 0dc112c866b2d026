"""Functions TensorFlow traces as they are written, without AutoGraph.

AutoGraph rewrites a Python function's source into graph control flow
before tracing it; tf_keras applies it to every subclassed layer's `call`,
`tf.function` and `tf.data` to the functions they are given. thattn's
traced code has no control flow that depends on a tensor's value (every
`if` and `for` is on shapes, configuration or Python lists), so the rewrite
only costs time: about 4.5 s of the 15 s a two-step `thattn-train` takes on
2 CPU cores (measured with AutoGraph switched off wholesale, same losses).
So thattn's layer calls and dataset functions are `unconverted`, and its
step functions are `tf.function(..., autograph=False)`. Code that does need
AutoGraph (the decoding loops of `thattn.models.generation`) keeps it.
"""

import inspect

import tensorflow as tf


def unconverted(function):
  """`tf.autograph.experimental.do_not_convert`, signature kept.

  The decorator's wrapper takes `*args, **kwargs`; tf_keras reads a layer's
  `call` signature (with `tf_inspect`, which does not follow `__wrapped__`)
  to decide whether to pass `training` and `mask`, so the wrapper carries
  the original signature.
  """
  wrapper = tf.autograph.experimental.do_not_convert(function)
  wrapper.__signature__ = inspect.signature(function)
  return wrapper
