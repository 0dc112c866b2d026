"""Attention variants by name, as the `--attention` flag and model overrides use.

::

| name              | layer                                                    |
|-------------------|----------------------------------------------------------|
| multi_head        | MultiHeadAttention                                       |
| talking_heads     | TalkingHeadsAttention                                    |
| project_logits    | TalkingHeadsAttention(project_weights=False) (Table 3)   |
| project_weights   | TalkingHeadsAttention(project_logits=False) (Table 3)    |
| dynamic           | TalkingHeadsAttention with all four dynamic projections  |
| general_bilinear  | GeneralBilinearAttention (Section 6)                     |
"""

from thattn.core import attention_spec

VARIANTS = attention_spec.VARIANTS


def make_attention(variant, num_heads, key_dim, **kwargs):
  """Builds the named attention variant with h heads of size d_k.

  `key_dim` is ignored by general_bilinear, whose heads read the full memory
  width. Extra keyword arguments go to the layer (e.g. output_shape,
  dropout, num_key_heads for talking heads).
  """
  from thattn import layers  # pylint: disable=g-import-not-at-top
  return attention_spec.make_attention(layers, variant, num_heads, key_dim,
                                       **kwargs)
