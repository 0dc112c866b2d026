"""The tf_keras layers the shared wiring builds thattn's models from.

`TF_KERAS` is a `thattn.models.wiring.FrontEnd`: thattn.layers' attention,
this package's blocks and embeddings, tf_keras's own layers, and
tf_keras's Embedding for BERT's token types (as in the released BERT).
`thattn.keras3.models.front_end.KERAS3` is the same for Keras 3.
"""

import tensorflow as tf
import tf_keras

from thattn.layers import relative_position
from thattn.models import blocks
from thattn.models import embeddings
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
    TypeEmbedding=tf_keras.layers.Embedding)
