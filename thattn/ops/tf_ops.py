"""TensorFlow's functions under `keras.ops`' names, for the computations
written once for both front ends in plain Python (`thattn.ops.adafactor`,
`thattn.models.block_wiring`): Keras 3 passes `keras.ops` itself, tf_keras
this namespace."""

import types

import tensorflow as tf

TF_OPS = types.SimpleNamespace(
    cast=tf.cast, power=tf.pow, sqrt=tf.sqrt, rsqrt=tf.math.rsqrt,
    square=tf.square, mean=tf.reduce_mean, maximum=tf.maximum,
    minimum=tf.minimum, expand_dims=tf.expand_dims)
