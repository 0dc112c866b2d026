"""Keras attention layers: multi-head, talking-heads, general bilinear,
differential and DCMHA.

tf_keras (Keras 2) layers: the `[tensorflow]` extra. The same layers for
Keras 3 on JAX, PyTorch or TensorFlow are `thattn.keras3`.
"""

from thattn.core import requirements  # pylint: disable=g-bad-import-order

# Before the first TensorFlow import: names the pip extra if it is missing.
requirements.require("thattn.layers", ("tensorflow", "tf_keras"))

from thattn.core.attention_spec import DYNAMIC_PROJECTIONS
from thattn.layers.attention_ops import causal_mask
from thattn.layers.base import AttentionLayer
from thattn.layers.dcmha import DynamicallyComposableAttention
from thattn.layers.differential import DifferentialAttention
from thattn.layers.fixed_head_size import fixed_head_size_attention
from thattn.layers.general_bilinear import GeneralBilinearAttention
from thattn.layers.head_mixing_attention import HeadMixingAttention
from thattn.layers.initializers import ScaledInitializer
from thattn.layers.keras_interop import from_keras
from thattn.layers.keras_interop import to_keras
from thattn.layers.multi_head import MultiHeadAttention
from thattn.layers.projected import ProjectedAttention
from thattn.layers.relative_position import relative_position_bucket
from thattn.layers.relative_position import RelativePositionBias
from thattn.layers.talking_heads import TalkingHeadsAttention
from thattn.layers.variants import make_attention
