"""An attention variant by name, as a tf_keras layer.

The variants are `thattn.core.variants`' registry (its records name each
variant's layer and options; `thattn.core.variants.names()` lists them).
"""

from thattn.core import variants


def make_attention(variant, num_heads, key_dim, **kwargs):
  """Builds the named attention variant with h heads of size d_k.

  `key_dim` is ignored by general_bilinear, whose heads read the full memory
  width. Extra keyword arguments go to the layer (e.g. output_shape,
  dropout, num_key_heads for talking heads).
  """
  return variants.make_attention("tf_keras", variant, num_heads, key_dim,
                                 **kwargs)
