"""TensorFlow's functions under `keras.ops`' names, for the computations
written once for both front ends in plain Python (`thattn.ops.adafactor`,
`thattn.ops.blocks`, a registered variant's head mixes): Keras 3
passes `keras.ops` itself, tf_keras this namespace.

It holds the names those computations use, with `keras.ops`' positional
arguments (and its keywords where TensorFlow's differ: `transpose(x,
axes)`, `sum(x, axis, keepdims)`). A head mix written for both fronts
calls only these: cast, power, sqrt, rsqrt, square, mean, maximum,
minimum, expand_dims, einsum, matmul, softmax, sigmoid, tanh, exp, log,
abs, sum, reshape, transpose, where, ones_like, zeros_like, relu,
silu, gelu, repeat; the rotary embeddings (`thattn.ops.rotary`) also cos, sin,
concatenate, arange and shape; the masks (`thattn.ops.masks`) not_equal,
less_equal, logical_and, logical_or and cumsum.
"""

import types

import tensorflow as tf


def _sum(x, axis=None, keepdims=False):
  return tf.reduce_sum(x, axis=axis, keepdims=keepdims)


def _mean(x, axis=None, keepdims=False):
  return tf.reduce_mean(x, axis=axis, keepdims=keepdims)


def _transpose(x, axes=None):
  return tf.transpose(x, perm=axes)


def _softmax(x, axis=-1):
  return tf.nn.softmax(x, axis=axis)


def _concatenate(xs, axis=0):
  return tf.concat(xs, axis=axis)


def _zeros_like(x, dtype=None):
  return tf.zeros_like(x, dtype=dtype)


def _arange(stop, dtype=None):
  return tf.range(stop, dtype=dtype)


def _shape(x):
  return tf.shape(x)


def _eye(n, dtype=None):
  return tf.eye(n, dtype=dtype or "float32")


def _gelu(x, approximate=True):  # keras.ops.gelu's default form
  return tf.nn.gelu(x, approximate=approximate)


TF_OPS = types.SimpleNamespace(
    cast=tf.cast, power=tf.pow, sqrt=tf.sqrt, rsqrt=tf.math.rsqrt,
    square=tf.square, mean=_mean, maximum=tf.maximum,
    minimum=tf.minimum, expand_dims=tf.expand_dims, einsum=tf.einsum,
    matmul=tf.matmul, softmax=_softmax, sigmoid=tf.sigmoid, tanh=tf.tanh,
    exp=tf.exp, log=tf.math.log, abs=tf.abs, sum=_sum, reshape=tf.reshape,
    transpose=_transpose, where=tf.where, ones_like=tf.ones_like,
    zeros_like=_zeros_like, relu=tf.nn.relu, silu=tf.nn.silu, gelu=_gelu,
    repeat=tf.repeat, eye=_eye,
    cos=tf.cos, sin=tf.sin, concatenate=_concatenate, arange=_arange,
    shape=_shape, not_equal=tf.not_equal, less_equal=tf.less_equal,
    logical_and=tf.logical_and, logical_or=tf.logical_or, cumsum=tf.cumsum)
