"""Computations written once for both Keras front ends, and the TensorFlow
side of the ops namespace they are written against.

- `adafactor`: Adafactor's step and the inverse-square-root schedule, over
  a namespace of NumPy-named tensor functions (`keras.ops` on Keras 3);
- `tf_ops`: TensorFlow's functions under `keras.ops`' names, the namespace
  the tf_keras front end passes;
- `autograph`: how thattn's TensorFlow code is traced (without AutoGraph).
"""
