"""The tf_keras layers the shared wiring builds thattn's models from.

`TF_KERAS` is a `thattn.models.wiring.FrontEnd`: thattn.layers' attention,
this package's blocks and embeddings, tf_keras's own layers, and
tf_keras's Embedding for BERT's token types (as in the released BERT).
`thattn.keras3.models.front_end.KERAS3` is the same for Keras 3.

`TF_KERAS_OPS` is the `thattn.models.heads_and_losses.TaskOps` of the task
heads and losses, in TensorFlow.
"""

import tensorflow as tf
import tf_keras

from thattn.layers import relative_position
from thattn.models import blocks
from thattn.models import embeddings
from thattn.models import heads_and_losses
from thattn.models import wiring

TF_KERAS = wiring.front_end(
    "tf_keras", tf_keras, (blocks, embeddings, relative_position),
    Input=lambda name: tf_keras.Input([None], dtype=tf.int32, name=name),
    Model=lambda inputs, outputs, name: tf_keras.Model(inputs, outputs,
                                                       name=name),
    # A linear Activation names a SavedModel signature's output.
    named_output=lambda tensor, name, dtype=None: tf_keras.layers.Activation(
        "linear", dtype=dtype, name=name)(tensor),
    padding_mask=lambda tokens, pad_id, name: embeddings.PaddingMask(
        pad_id, name=name)(tokens),
    prefix_lm_mask=lambda causal_attention, name: embeddings.PrefixLMMask(
        name=name)(causal_attention),
    TypeEmbedding=tf_keras.layers.Embedding)


def _cross_entropy(labels, logits):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=tf.cast(labels, tf.int32), logits=logits)


TF_KERAS_OPS = heads_and_losses.TaskOps(
    cast=tf.cast, sum=tf.reduce_sum, ones_like=tf.ones_like,
    arange=tf.range, length=lambda x: tf.shape(x)[1],
    pad_right_shift=lambda x: tf.pad(x[:, :-1], [[0, 0], [1, 0]]),
    cross_entropy=_cross_entropy,
    gather_positions=lambda x, positions: tf.gather(x, positions,
                                                    batch_dims=1))
