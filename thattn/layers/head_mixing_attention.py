"""A registered variant's own head mixes, around thattn's projected attention.

A variant registered with `mix_logits` / `mix_weights` (functions over an
ops namespace) and its weights (`Weight`), instead of a layer class
(`thattn.core.variants`, docs/examples/custom_variant.py), is computed by
this layer: P_q, P_k, P_v, P_o, the masks, the position bias, the dropout
and the decoding cache are `ProjectedAttention`'s, and the two hooks
between the dot product and the values are the variant's, called with
TensorFlow under `keras.ops`' names (`thattn.ops.tf_ops.TF_OPS`).
`thattn.keras3.HeadMixingAttention` is the same layer on Keras 3, calling
them with `keras.ops`.
"""

import tf_keras

from thattn.core import variants
from thattn.layers import projected
from thattn.ops import tf_ops


@tf_keras.utils.register_keras_serializable(package="thattn")
class HeadMixingAttention(projected.ProjectedAttention):
  """The attention of a variant given by its head mixes.

  Computation (per example; letters as in `thattn.core.dims`)::

    Q[n, h_k, d_k] = einsum(X[n, d_X], P_q[d_X, h_k, d_k])
    K[m, h_k, d_k] = einsum(M[m, d_M], P_k[d_M, h_k, d_k])
    V[m, h_v, d_v] = einsum(M[m, d_M], P_v[d_M, h_v, d_v])
    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = variant.mix_logits(ops, weights, J)       (J if none)
    W[h, n, m]     = softmax(L + bias, masked, reduced_dim=m)
    U[h_v, n, m]   = dropout(variant.mix_weights(ops, weights, W))  (W)
    O[n, h_v, d_v] = einsum(U[h_v, n, m], V[m, h_v, d_v])
    Y[n, d_Y]      = einsum(O[n, h_v, d_v], P_o[h_v, d_v, d_Y])

  Args:
    num_heads: h, the softmax heads.
    key_dim: d_k.
    value_dim: d_v; defaults to key_dim.
    num_key_heads, num_value_heads: h_k and h_v, for a variant whose record
      has P_l (`pre_softmax`) or P_w (`post_softmax`); None means h.
    variant: the registered variant's name; its module must be imported
      before the layer is built or loaded.
    **kwargs: as `MultiHeadAttention` (output_shape, use_bias, dropout,
      kernel_initializer, ...). `query_chunk_size` is refused: the chunked
      core mixes heads with P_l and P_w only.
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
                       "supported: the chunked core mixes heads with P_l and "
                       "P_w only, not a variant's own mixes.")
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
    return self._record.mix_logits(tf_ops.TF_OPS, self.variant_weights,
                                   dot_products)

  def mix_weights(self, weights, query_state, memory_state):
    if self._record.mix_weights is None:
      return weights
    return self._record.mix_weights(tf_ops.TF_OPS, self.variant_weights,
                                    weights)

  @property
  def attention_scores_heads(self):
    """h_v; the scores returned are U, the weights applied to the values."""
    return self.num_value_heads

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                num_key_heads=self.num_key_heads,
                num_value_heads=self.num_value_heads, variant=self.variant)
