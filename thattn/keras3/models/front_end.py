"""The Keras 3 layers the shared wiring builds thattn's models from.

`KERAS3` is a `thattn.models.wiring.FrontEnd`: thattn.keras3's attention,
this package's blocks and embeddings, and keras.layers. Where it differs
from tf_keras's (`thattn.models.front_end.TF_KERAS`): the token types are
thattn's `TokenEmbedding`, read in float32 and looked up by selection
(`thattn.keras3.lookups` says why), and the padding and prefix LM masks are
functions of the inputs, not layers.

`KERAS3_OPS` is the `thattn.models.heads_and_losses.TaskOps` of the task heads
and losses, in `keras.ops`.
"""

import keras
from keras import ops

from thattn.keras3 import relative_position
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings
from thattn.models import heads_and_losses
from thattn.models import wiring


def _padding_mask(tokens, pad_id, name):
  del name  # not a layer: nothing to name
  return embeddings.padding_mask(tokens, pad_id)


def _prefix_lm_mask(causal_attention, name):
  del name  # as the padding mask
  return embeddings.prefix_lm_mask(causal_attention)


KERAS3 = wiring.front_end(
    "keras3", keras, (blocks, embeddings, relative_position),
    Input=lambda name: keras.Input((None,), dtype="int32", name=name),
    Model=lambda inputs, outputs, name: keras.Model(inputs, outputs,
                                                    name=name),
    named_output=lambda tensor, name, dtype=None: keras.layers.Identity(
        dtype=dtype, name=name)(tensor),
    padding_mask=_padding_mask, prefix_lm_mask=_prefix_lm_mask,
    TypeEmbedding=embeddings.TokenEmbedding)


def _cross_entropy(labels, logits):
  return ops.sparse_categorical_crossentropy(
      ops.cast(labels, "int32"), logits, from_logits=True)


def _gather_positions(x, positions):
  return ops.take_along_axis(
      x, ops.expand_dims(ops.cast(positions, "int32"), -1), axis=1)


KERAS3_OPS = heads_and_losses.TaskOps(
    cast=ops.cast, sum=ops.sum, ones_like=ops.ones_like,
    arange=lambda n: ops.arange(n, dtype="int32"),
    length=lambda x: ops.shape(x)[1],
    pad_right_shift=lambda x: ops.pad(x[:, :-1], [[0, 0], [1, 0]]),
    cross_entropy=_cross_entropy, gather_positions=_gather_positions)
