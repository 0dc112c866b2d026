"""Multi-head attention through `keras.ops.dot_product_attention`.

keras.layers.MultiHeadAttention (Keras 3.15) computes its core with
`keras.ops.dot_product_attention`, which each backend maps to its fused
kernels (cuDNN flash attention through JAX, PyTorch's scaled_dot_product_
attention, ...), and its `flash_attention` argument says which:
- None: Keras's global setting (`keras.config.enable_flash_attention()` /
  `disable_flash_attention()`), and when that is unset too, the backend
  picks (flash attention where it can run, else its plain fused path);
  thattn: on a GPU or TPU (below);
- True: flash attention or an error from the backend saying why not (for
  example "cuDNN is not detected" on a CPU);
- False: never flash. Here False means thattn's keras.ops core, the one
  that can also return the scores and apply dropout.

thattn's multi-head attention does the same on accelerators, with one
difference where the backend would pick for None on a CPU: there thattn
keeps its keras.ops core, which measured faster than dot_product_attention
(JAX, 2 CPU cores: 0.74-0.82x of Keras's layer's time; RESULTS.md, "thattn.
keras3 against keras.layers.MultiHeadAttention"), and which Keras's own
TensorFlow path computes anyway. With its own conventions: the
1/sqrt(d_k) is already in P_q, so the scale is 1; the causal mask is the
backend's `is_causal` when it is the only mask and starts at position 0;
and heads with key_dim != value_dim stay on the keras.ops core (JAX's
dot_product_attention needs them equal; Keras 3.15's own layer fails there).
Talking heads' core is not a dot-product attention (P_l and P_w mix the
heads around the softmax), so there `flash_attention` chooses thattn's own
fused kernels (`thattn.keras3.fused`).

On JAX on an NVIDIA GPU, thattn does not go through keras.ops.
dot_product_attention, which hands BERT's padding mask to cuDNN in a form
cuDNN refuses and then logs the failure and falls back: it calls cuDNN
through JAX itself, with the masks as key lengths and `is_causal`, where
`thattn.kernels.cudnn.obstacle` finds nothing cuDNN cannot take, and
otherwise keeps its keras.ops core, chosen before the call (True: a
ValueError naming the obstacle).

Where each of these runs is chosen by `thattn.kernels.dispatch` (the one
choice of a call's kernel, for both fronts); this module runs them.

One difference from the keras.ops core: a query row whose keys are all
masked gets uniform weights on the keras.ops core and on the TensorFlow and
JAX backends' dot_product_attention, but not always on PyTorch's in
float16 (measured: finite, not uniform). Such rows carry no information.
"""

import keras
from keras import ops

from thattn.kernels import cudnn
from thattn.kernels import dispatch


def setting(layer):
  """The layer's flash_attention, or Keras's global setting if it is None."""
  if layer.flash_attention is not None:
    return layer.flash_attention
  return keras.config.is_flash_attention_enabled()


def check_dropout(owner, flash_attention, dropout):
  """Keras's refusal of flash attention with attention dropout."""
  if flash_attention and dropout:
    raise ValueError(
        f"{owner}: Dropout is not supported when flash attention is enabled. "
        f"Please set dropout to 0.0 to use flash attention (got dropout="
        f"{dropout}, flash_attention=True).")


def multi_head_context(kernel, layer, query_state, memory_state, mask, bias,
                       causal_offset):
  """O[b, n, h, d_v] by `kernel`, dispatch.CUDNN (cuDNN through JAX, the
  masks as key lengths) or dispatch.DOT_PRODUCT_ATTENTION."""
  query, key, value = (query_state["query"], memory_state["key"],
                       memory_state["value"])
  if kernel == dispatch.CUDNN:
    return cudnn.attention(query, key, value, bias, mask, causal_offset)
  return dot_product_core(layer, query, key, value, mask, bias,
                          causal_offset, setting(layer))


def dot_product_core(layer, query, key, value, mask, bias, causal_offset,
                     flash):
  """O[b, n, h, d_v] = keras.ops.dot_product_attention of the projected
  Q, K, V (d_k == d_v) with thattn's masks, `flash` passed on."""
  is_causal = (causal_offset is not None and mask is None and
               isinstance(causal_offset, int) and causal_offset == 0)
  if causal_offset is not None and not is_causal:
    mask = layer.full_mask(mask, causal_offset, ops.shape(query)[1],
                           ops.shape(key)[1])
  if bias is not None:
    bias = ops.cast(bias, query.dtype)
  return ops.dot_product_attention(query, key, value, bias=bias, mask=mask,
                                   scale=1.0, is_causal=is_causal,
                                   flash_attention=flash)
