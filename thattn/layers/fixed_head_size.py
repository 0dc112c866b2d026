"""Fixed head size (Bhojanapalli et al., 2020): d_k and d_v set apart from d_model / h.

The usual heuristic d_k = d_model / h shrinks each head as heads are added;
once d_k falls below the sequence length n, a head's logits matrix has rank
at most d_k < n and cannot express every attention pattern (the paper's
Theorem 1, the "low-rank bottleneck"). The paper proposes instead to fix the
head size, for example to the sequence length, independent of h and d_model.

In thattn every layer already takes `key_dim` and `value_dim` freely, so a
fixed head size is just those arguments. `fixed_head_size_attention` is the
documented shortcut for the paper's proposal, d_k = d_v = n.
"""

from thattn.core import attention_spec
from thattn.core import variants


def fixed_head_size_attention(num_heads, sequence_length=None, head_size=None,
                              variant="multi_head", **kwargs):
  """An attention layer whose heads have a fixed size.

  Args:
    num_heads: h, the number of heads.
    sequence_length: n. When given (and `head_size` is not), the head size is
      set to n, as Bhojanapalli et al. propose: d_k = d_v = n.
    head_size: an explicit d_k = d_v instead.
    variant: a registered variant with heads of a size (every one but
      general_bilinear, whose heads read the whole memory width).
    **kwargs: passed to the layer (e.g. output_shape, dynamic_projections).

  Returns:
    The variant's layer (e.g. `MultiHeadAttention`, `TalkingHeadsAttention`)
    with key_dim = value_dim = the head size.
  """
  size = attention_spec.fixed_head_size(sequence_length, head_size)
  return variants.make_attention("tf_keras", variants.sized(variant), num_heads,
                                 size, value_dim=size, **kwargs)
