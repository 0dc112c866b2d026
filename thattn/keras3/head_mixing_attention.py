"""A registered variant's own head mixes, as a Keras 3 layer.

`thattn.layers.HeadMixingAttention` on Keras 3 (TensorFlow, JAX, PyTorch):
the same arguments, weights (names, shapes) and computation, with the
variant's `mix_logits` / `mix_weights` (`thattn.core.variants`) called with
`keras.ops`. Its core is always the plain one: no fused kernel knows a
variant's own mixes.
"""

import keras
from keras import ops

from thattn.core import variants
from thattn.keras3 import projected


@keras.saving.register_keras_serializable(package="thattn")
class HeadMixingAttention(projected.ProjectedAttention):
  """The attention of a variant given by its head mixes.

  Computation (per example; letters as in `thattn.core.dims`)::

    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = variant.mix_logits(keras.ops, weights, J)   (J if none)
    W[h, n, m]     = softmax(L + bias, masked, reduced_dim=m)
    U[h_v, n, m]   = dropout(variant.mix_weights(keras.ops, weights, W))
    O[n, h_v, d_v] = einsum(U[h_v, n, m], V[m, h_v, d_v])

  with Q, K, V and Y = O P_o as in `MultiHeadAttention`.

  Args:
    num_heads: h, the softmax heads.
    key_dim: d_k.
    value_dim: d_v; defaults to key_dim.
    num_key_heads, num_value_heads: h_k and h_v, for a variant whose record
      has P_l (`pre_softmax`) or P_w (`post_softmax`); None means h.
    variant: the registered variant's name; its module must be imported
      before the layer is built or loaded.
    query_chunk_size: accepted only as None, as `TalkingHeadsAttention`.
    **kwargs: as `MultiHeadAttention` (output_shape, use_bias, dropout,
      kernel_initializer, seed, ...).
  """

  def __init__(self, num_heads, key_dim, value_dim=None, num_key_heads=None,
               num_value_heads=None, *, variant, query_chunk_size=None,
               **kwargs):
    owner = kwargs.get("name") or "HeadMixingAttention"
    record = variants.get(variant, owner=owner)
    if record.layer is not None:
      raise ValueError(f"{owner}: variant {variant!r} is computed by its own "
                       f"layer ({record.layer!r}), not by head mixes.")
    if query_chunk_size is not None:
      raise ValueError(f"{owner}: query_chunk_size={query_chunk_size} is not "
                       "supported in Keras 3 (thattn.layers' chunked core).")
    record.check_heads(num_heads, num_key_heads, num_value_heads, owner=owner)
    super().__init__(num_key_heads or num_heads, num_heads,
                     num_value_heads or num_heads, key_dim,
                     value_dim=value_dim, **kwargs)
    self.variant = variant
    self._record = record
    self.variant_weights = {}

  def create_weights(self, query_width, key_width, value_width):
    super().create_weights(query_width, key_width, value_width)
    sizes = {"key_heads": self.num_key_heads, "heads": self.num_heads,
             "value_heads": self.num_value_heads, "d_k": self.key_dim,
             "d_v": self.value_dim, "d_model": query_width}
    for weight in self._record.weights:
      self.variant_weights[weight.name] = self.add_axes_weight(
          weight.name, [sizes[axis] for axis in weight.axes], weight.axes,
          weight.initializer)

  def mix_logits(self, dot_products, query_state, memory_state):
    if self._record.mix_logits is None:
      return dot_products
    return self._record.mix_logits(ops, self.variant_weights, dot_products)

  def mix_weights(self, weights, query_state, memory_state):
    if self._record.mix_weights is None:
      return weights
    return self._record.mix_weights(ops, self.variant_weights, weights)

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    # The plain core only: no fused kernel knows the variant's own mixes.
    return self.plain_attend(query_state, memory_state, mask, position_bias,
                             training, causal_offset)

  @property
  def attention_scores_heads(self):
    """h_v; the scores returned are U, the weights applied to the values."""
    return self.num_value_heads

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                num_key_heads=self.num_key_heads,
                num_value_heads=self.num_value_heads, variant=self.variant)
