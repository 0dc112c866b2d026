"""The Keras 3 layers' masks, in Keras 3's shapes and conventions.

Every mask is boolean, True meaning "may attend", and is applied to the
logits L[b, h, n, m] after P_l's mix and before the softmax (the paper's
place for masks; `thattn.keras3.attention_math.masked_softmax`). Inside the
layers a mask is laid out [b or 1, h or 1, n or 1, m or 1]:
- an `attention_mask` of rank 2 [n, m], 3 [b, n, m] or 4 [b, h, n, m]
  broadcasts as keras.layers.MultiHeadAttention broadcasts it (missing batch
  and heads dimensions are added in front of [n, m]); the h of a per-head
  mask is the softmax heads' h;
- Keras implicit masks (`Embedding(mask_zero=True)`): the query's [b, n] and
  the memory's [b, m];
- the causal band (memory position j <= query position i + offset) and the
  sliding window (|i + offset - j| < w, Keras's symmetric band; with the
  causal band, the last w keys, the query's own included).
"""

from keras import ops

from thattn.core import attention_spec

try:  # The functions keras.layers.MultiHeadAttention itself uses; Keras 3
  # has no public API for a tensor's implicit mask.
  from keras.src.backend import get_keras_mask  # pylint: disable=g-import-not-at-top
  from keras.src.backend import set_keras_mask  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover - a Keras without them
  get_keras_mask = set_keras_mask = None


def implicit_mask(tensor):
  """The Keras mask a tensor carries ([b, length]), or None."""
  if tensor is None or get_keras_mask is None:
    return None
  return get_keras_mask(tensor)


def clear_implicit_masks(*tensors):
  """Drops the Keras masks of `tensors`, as keras.layers.MultiHeadAttention
  does before projecting: the layer has turned them into its attention
  mask, and the projections (EinsumDense, which takes no mask) would warn
  on every call that they drop one."""
  if set_keras_mask is None:
    return
  for tensor in tensors:
    if tensor is not None and get_keras_mask(tensor) is not None:
      set_keras_mask(tensor, None)


def attention_mask(owner, mask, num_heads):
  """`mask` of rank 2, 3 or 4 as boolean [b or 1, h or 1, n, m]."""
  mask = ops.convert_to_tensor(mask)
  rank = len(mask.shape)
  if rank not in (2, 3, 4):
    raise ValueError(
        f"{owner}: attention_mask has shape {tuple(mask.shape)}; expected "
        "rank 2 [query_length, memory_length], 3 [batch, query_length, "
        "memory_length] or 4 [batch, heads, query_length, memory_length] "
        "(dimensions of size 1 broadcast), as keras.layers."
        "MultiHeadAttention takes it.")
  if rank == 4 and mask.shape[1] not in (None, 1, num_heads):
    raise ValueError(
        f"{owner}: attention_mask has shape {tuple(mask.shape)}: its heads "
        f"dimension {mask.shape[1]} must be 1 or num_heads={num_heads} (the "
        "softmax heads h, which the mask applies to after P_l's mix).")
  mask = ops.cast(mask, "bool")
  if rank == 2:
    return mask[None, None]  # [n, m] -> [1, 1, n, m]
  if rank == 3:
    return mask[:, None]  # [b, n, m] -> [b, 1, n, m]
  return mask


def implicit_attention_mask(query_mask, value_mask, key_mask):
  """The Keras masks as [b, 1, n or 1, m or 1] masks (None where absent)."""
  masks = []
  if query_mask is not None:
    masks.append(ops.reshape(ops.cast(query_mask, "bool"),
                             (-1, 1, query_mask.shape[-1], 1)))
  for memory_mask in (value_mask, key_mask):
    if memory_mask is not None:
      masks.append(ops.reshape(ops.cast(memory_mask, "bool"),
                               (-1, 1, 1, memory_mask.shape[-1])))
  return combine(*masks)


def positions_band(query_length, memory_length, offset=0, causal=False,
                   window=None):
  """The causal and window masks as boolean [1, 1, n, m], or None.

  Query i sits at position i + offset (a decoding step's offset; 0
  otherwise), memory j at position j.
  """
  if not causal and window is None:
    return None
  query_positions = ops.expand_dims(
      ops.arange(query_length, dtype="int32") + offset, 1)
  memory_positions = ops.expand_dims(
      ops.arange(memory_length, dtype="int32"), 0)
  band = None
  if causal:
    band = memory_positions <= query_positions
  if window is not None:
    in_window = ops.abs(query_positions - memory_positions) < window
    band = in_window if band is None else ops.logical_and(band, in_window)
  return ops.reshape(band, (1, 1, query_length, memory_length))


def combine(*masks):
  """Logical AND of the masks that are not None; None if all are None."""
  return attention_spec.combine_masks(ops.logical_and, masks)


def keras_form(mask):
  """A [b, h or 1, n, m] mask as Keras's `_compute_attention` receives one:
  [b, n, m] when it has no heads dimension, else [b, h, n, m]."""
  if mask is None or mask.shape[1] != 1:
    return mask
  return ops.squeeze(mask, 1)


def check_window(owner, sliding_window):
  """`sliding_window` if it is None or a positive int (Keras's words)."""
  if sliding_window is not None and (
      isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
      or sliding_window <= 0):
    raise ValueError(
        f"{owner}: `sliding_window` must be `None` or a positive integer. "
        f"Received: sliding_window={sliding_window!r}")
  return sliding_window

