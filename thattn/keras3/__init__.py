"""thattn's attention layers for Keras 3 (TensorFlow, JAX and PyTorch).

The same layers, arguments, call and weights as `thattn.layers` (tf_keras),
written with `keras.ops`; importing this package needs neither tf_keras nor
Mesh TensorFlow nor tensorflow-text. docs/keras3.md has the guide.
"""

from thattn import attention_spec
from thattn import validation
from thattn.attention_spec import DYNAMIC_PROJECTIONS
from thattn.keras3.attention_math import relative_position_bucket
from thattn.keras3.base import AttentionLayer
from thattn.keras3.initializers import ScaledInitializer
from thattn.keras3.distribution import DEFAULT_LAYOUT_RULES
from thattn.keras3.distribution import layout_map
from thattn.keras3.distribution import model_layout_map
from thattn.keras3.general_bilinear import GeneralBilinearAttention
from thattn.keras3.keras_interop import from_keras
from thattn.keras3.keras_interop import to_keras
from thattn.keras3.projected import MultiHeadAttention
from thattn.keras3.projected import TalkingHeadsAttention
from thattn.keras3.relative_position import RelativePositionBias

_FIXED_HEAD_SIZE_VARIANTS = {"multi_head": MultiHeadAttention,
                             "talking_heads": TalkingHeadsAttention}


def fixed_head_size_attention(num_heads, sequence_length=None, head_size=None,
                              variant="multi_head", **kwargs):
  """Attention with d_k = d_v fixed (Bhojanapalli et al., 2020): to the
  sequence length n, or to `head_size`; as `thattn.layers`' helper."""
  size = attention_spec.fixed_head_size(sequence_length, head_size)
  validation.one_of("variant", variant, sorted(_FIXED_HEAD_SIZE_VARIANTS))
  return _FIXED_HEAD_SIZE_VARIANTS[variant](
      num_heads=num_heads, key_dim=size, value_dim=size, **kwargs)
