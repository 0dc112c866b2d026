"""tf_keras's argument conventions, shared by every thattn attention layer.

thattn's layers are meant to replace `tf_keras.layers.MultiHeadAttention`
(and Model Garden's `TalkingHeadsAttention`, its subclass) in code that
already exists, so where a concept is the same the argument has tf_keras's
name and meaning:

| tf_keras name (canonical) | older thattn name (alias) | meaning            |
|---------------------------|---------------------------|--------------------|
| `dropout`                 | `dropout_rate`            | attention dropout  |
| `output_shape`            | `output_dim`              | d_Y, the output width |

`get_config` writes only the canonical names; the aliases are accepted so
that code and saved configs from before the rename keep working. Passing
both spellings with different values is an error, not a silent choice.

This module also holds the checks of call inputs that tf_keras users meet
first: Keras 3 tensors reaching a tf_keras layer, masks, RaggedTensors.
"""

import sys

import numpy as np
import tensorflow as tf

from thattn.core import attention_spec


def refuse_keras3_tensors(owner, values):
  """ValueError if any of `values` is a Keras 3 symbolic tensor.

  In TF 2.21 `tf.keras` is Keras 3, and its `tf.keras.Input` cannot flow
  into a tf_keras layer; Keras's own message ("A KerasTensor cannot be used
  as input to a TensorFlow function") does not say why or what to do.
  Only looked up when Keras 3 is already imported, so this costs nothing
  for pure tf_keras programs.
  """
  keras = sys.modules.get("keras")
  keras_tensor = getattr(keras, "KerasTensor", None)
  if keras_tensor is None:
    return
  for value in values:
    items = value if isinstance(value, (list, tuple)) else (value,)
    if any(isinstance(item, keras_tensor) for item in items):
      raise ValueError(
          f"{owner}: got a Keras 3 tensor ({keras_tensor.__name__}, e.g. "
          "from tf.keras.Input, which in TensorFlow 2.16+ is Keras 3). "
          "thattn.layers are tf_keras (Keras 2) layers. Either build the "
          "model with tf_keras (`import tf_keras; tf_keras.Input(...)`, or "
          "set TF_USE_LEGACY_KERAS=1 before importing TensorFlow so that "
          "tf.keras is tf_keras), or use the same layers for Keras 3: "
          "thattn.keras3 (docs/keras3.md).")


def check_lengths(owner, query, key, value):
  """`attention_spec.check_lengths` on the tensors' static shapes."""
  attention_spec.check_lengths(owner, {
      name: None if tensor is None or tensor.shape.rank is None else
      tensor.shape.as_list() for name, tensor in
      (("query", query), ("key", key), ("value", value))})


def boolean_mask(owner, mask):
  """A user's attention mask as bool: 0/1 numbers cast as tf_keras does.

  tf_keras treats any nonzero entry as "may attend" (a `tf_keras.Input`
  mask is float32), so numeric masks are cast, not refused. An additive
  mask (0 and a large negative number, Model Garden's and T5's internal
  form) would be misread that way: where its values can be seen (eager
  tensors, constants), anything but 0 and 1 is refused.
  """
  mask = tf.convert_to_tensor(mask)
  if mask.dtype == tf.bool:
    return mask
  if not (mask.dtype.is_floating or mask.dtype.is_integer):
    raise ValueError(f"{owner}: attention_mask must be boolean or 0/1 "
                     f"numbers (nonzero = may attend), got dtype "
                     f"{mask.dtype.name}.")
  values = tf.get_static_value(mask)
  if values is not None:
    others = sorted(set(np.unique(values).tolist()) - {0, 1})
    if others:
      raise ValueError(
          f"{owner}: a numeric attention_mask must hold only 0 and 1 (1 = "
          f"may attend), got {mask.dtype.name} values {others[:3]}; an "
          "additive mask (0 / -1e9) must become a boolean one first, e.g. "
          "`mask > -1`.")
  return tf.cast(mask, tf.bool)


def densify_ragged(owner, query, value, key):
  """RaggedTensor inputs as tf_keras takes them: dense, padding masked.

  Returns (query, value, key, query_row_lengths or None, memory_mask or
  None), where memory_mask[b, m] is False on the padding that densifying
  the ragged value / key added, so no query attends to it. The padded
  query rows are computed and then dropped when the output is made ragged
  again (`reragged`). Only [batch, (length), width] RaggedTensors (one
  ragged dimension) are taken.
  """
  inputs = {"query": query, "value": value, "key": key}
  for name, tensor in inputs.items():
    if isinstance(tensor, tf.RaggedTensor) and (
        tensor.ragged_rank != 1 or tensor.shape.rank != 3):
      raise ValueError(
          f"{owner}: a ragged {name} must have shape [batch, (length), "
          f"width] with only the length ragged, got shape {tensor.shape} "
          f"with ragged_rank {tensor.ragged_rank}; densify it with "
          "`.to_tensor()` and pass an attention_mask.")
  query_lengths = None
  if isinstance(query, tf.RaggedTensor):
    query_lengths = query.row_lengths()
    query = query.to_tensor()
  memory = [tensor for tensor in (value, key) if tensor is not None]
  if not any(isinstance(tensor, tf.RaggedTensor) for tensor in memory):
    return query, value, key, query_lengths, None
  # Key and value must densify to one length m: the longest of the two.
  memory_length = tf.reduce_max(tf.stack([
      tf.cast(tensor.bounding_shape(axis=1) if isinstance(
          tensor, tf.RaggedTensor) else tf.shape(tensor)[1], tf.int64)
      for tensor in memory]))
  memory_mask = None
  dense = []
  for tensor in (value, key):
    if isinstance(tensor, tf.RaggedTensor):
      valid = tf.sequence_mask(tensor.row_lengths(), memory_length)
      memory_mask = valid if memory_mask is None else memory_mask & valid
      tensor = tensor.to_tensor(shape=[None, memory_length, None])
    dense.append(tensor)
  return query, dense[0], dense[1], query_lengths, memory_mask


def reragged(output, query_lengths):
  """The output as a RaggedTensor again when the query was ragged."""
  if query_lengths is None:
    return output
  return tf.RaggedTensor.from_tensor(output, lengths=query_lengths)
