"""Attention variants by name, as the `--attention` flag and model overrides use.

| name              | layer                                                    |
|-------------------|----------------------------------------------------------|
| multi_head        | MultiHeadAttention                                       |
| talking_heads     | TalkingHeadsAttention                                    |
| project_logits    | TalkingHeadsAttention(project_weights=False) (Table 3)   |
| project_weights   | TalkingHeadsAttention(project_logits=False) (Table 3)    |
| dynamic           | TalkingHeadsAttention with all four dynamic projections  |
| general_bilinear  | GeneralBilinearAttention (Section 6)                     |
"""

from thattn import validation
from thattn.layers import general_bilinear
from thattn.layers import multi_head
from thattn.layers import talking_heads

VARIANTS = ("multi_head", "talking_heads", "project_logits", "project_weights",
            "dynamic", "general_bilinear")


def make_attention(variant, num_heads, key_dim, **kwargs):
  """Builds the named attention variant with h heads of size d_k.

  `key_dim` is ignored by general_bilinear, whose heads read the full memory
  width. Extra keyword arguments go to the layer (e.g. output_shape,
  dropout, num_key_heads for talking heads).
  """
  validation.one_of("attention variant", variant, VARIANTS)
  if variant == "multi_head":
    return multi_head.MultiHeadAttention(num_heads, key_dim, **kwargs)
  if variant == "general_bilinear":
    return general_bilinear.GeneralBilinearAttention(num_heads, **kwargs)
  talking_heads_options = {
      "talking_heads": {},
      "project_logits": {"project_weights": False},
      "project_weights": {"project_logits": False},
      "dynamic": {"dynamic_projections": talking_heads.DYNAMIC_PROJECTIONS},
  }
  return talking_heads.TalkingHeadsAttention(
      num_heads, key_dim, **talking_heads_options[variant], **kwargs)
