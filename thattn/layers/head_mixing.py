"""Head mixing of one example's scores, as the chunked core does it.

Scores here are [f, c, m] (heads, a chunk of query rows, memory positions;
letters as in `thattn.core.dims`), without a batch axis; a projection is
P[f, g], or for grouped talking heads its G diagonal blocks [G, f/G, g/G]
(heads group-major, as in `attention_ops.mix_heads`). Each mixing and each
gradient is one matmul, or one batched matmul over the groups.
"""

import tensorflow as tf


def mix(scores, projection):
  """[f, c, m] x P[f, g] -> [g, c, m]: one matmul over the heads.

  With grouped blocks P[G, f/G, g/G] (see `attention_ops.mix_heads`), one
  batched matmul over the groups.
  """
  shape = tf.shape(scores)
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    mixed = tf.linalg.matmul(
        projection, tf.reshape(scores, [groups, heads_in, -1]),
        transpose_a=True)
    return tf.reshape(mixed, [groups * heads_out, shape[1], shape[2]])
  mixed = tf.linalg.matmul(projection, tf.reshape(scores, [shape[0], -1]),
                           transpose_a=True)
  return tf.reshape(mixed, [tf.shape(projection)[1], shape[1], shape[2]])


def unmix(scores, projection):
  """[g, c, m] x P[f, g] -> [f, c, m]: the transpose of `mix`."""
  shape = tf.shape(scores)
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    mixed = tf.linalg.matmul(projection,
                             tf.reshape(scores, [groups, heads_out, -1]))
    return tf.reshape(mixed, [groups * heads_in, shape[1], shape[2]])
  mixed = tf.linalg.matmul(projection, tf.reshape(scores, [shape[0], -1]))
  return tf.reshape(mixed, [tf.shape(projection)[0], shape[1], shape[2]])


def projection_gradient(inputs, output_gradient, projection):
  """dP[f, g] = sum over (c, m) of inputs[f, c, m] * output_gradient[g, c, m].

  For grouped blocks P[G, f/G, g/G], only the diagonal blocks:
  dP[G, f/G, g/G], one batched matmul.
  """
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    return tf.linalg.matmul(
        tf.reshape(inputs, [groups, heads_in, -1]),
        tf.reshape(output_gradient, [groups, heads_out, -1]),
        transpose_b=True)
  return tf.linalg.matmul(
      tf.reshape(inputs, [tf.shape(inputs)[0], -1]),
      tf.reshape(output_gradient, [tf.shape(output_gradient)[0], -1]),
      transpose_b=True)
