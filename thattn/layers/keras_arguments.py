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


def resolve_alias(owner, canonical, alias, default):
  """(name, value) of a canonical argument or its older alias, as given.

  `canonical` and `alias` are (name, value) pairs; an alias is "given" when
  its value is not None, the canonical when its value differs from
  `default`. The name returned is the one the caller used, for error
  messages. Raises ValueError naming both when both are given and differ.
  """
  (name, value), (alias_name, alias_value) = canonical, alias
  if alias_value is None:
    return name, value
  if value != default and value != alias_value:
    raise ValueError(
        f"{owner}: {name}={value!r} and its alias {alias_name}="
        f"{alias_value!r} disagree; pass only {name}.")
  return alias_name, alias_value


def output_width(owner, output_shape):
  """d_Y from tf_keras's `output_shape` (an int or a 1-tuple), or None.

  tf_keras also allows longer tuples (an output of rank > 3); thattn's
  layers produce Y[b, n, d_Y] only, so those are refused.
  """
  if output_shape is None or isinstance(output_shape, int):
    return output_shape
  if isinstance(output_shape, (tuple, list)) and len(output_shape) == 1:
    return output_shape[0]
  raise ValueError(
      f"{owner}: output_shape must be an int d_Y or a 1-tuple (d_Y,), got "
      f"{output_shape!r}; thattn's layers output [batch, length, d_Y].")


# tf_keras's `attention_axes` values that mean thattn's only layout, rank-3
# inputs [b, n, d] attended over axis 1.
_SEQUENCE_AXES = (None, 1, -2, (1,), (-2,), [1], [-2])


def check_attention_axes(owner, attention_axes):
  """Accepts tf_keras's `attention_axes` only where it means thattn's layout."""
  if attention_axes not in _SEQUENCE_AXES:
    raise ValueError(
        f"{owner}: attention_axes={attention_axes!r} is not supported; "
        "thattn's layers take [batch, length, width] inputs and attend over "
        "the length axis (attention_axes=None or (1,)). Reshape other axes "
        "into the batch or length axis.")


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
          "tf.keras is tf_keras), or use Keras 3 layers (thattn.keras3, "
          "planned: not in this release).")


def check_lengths(owner, query, key, value):
  """Refuses inputs whose batch or memory lengths disagree (static shapes).

  Without this, a mismatch fails inside an einsum of the attention core
  with a message that names no input.
  """
  shapes = {name: tensor.shape for name, tensor in
            (("query", query), ("key", key), ("value", value))
            if tensor is not None and tensor.shape.rank == 3}
  batches = {name: shape[0] for name, shape in shapes.items()
             if shape[0] is not None}
  if len(set(batches.values())) > 1:
    raise ValueError(
        f"{owner}: query, key and value must have the same batch size, "
        f"got shapes " + ", ".join(f"{name} {shapes[name]}"
                                   for name in batches) + ".")
  key_length, value_length = (shapes.get(name, [None, None])[1]
                              for name in ("key", "value"))
  if None not in (key_length, value_length) and key_length != value_length:
    raise ValueError(
        f"{owner}: key and value must have the same length (both are "
        f"the memory M[b, m, ...]), got key {shapes['key']} and value "
        f"{shapes['value']}.")


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
