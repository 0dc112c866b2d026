"""thattn's attention layers for Keras 3 (TensorFlow, JAX and PyTorch).

The layers, arguments, call and weights of `thattn.layers` (tf_keras),
written with `keras.ops`, less what docs/keras3.md lists ("The same layers,
with these differences": `query_chunk_size`, ragged inputs,
`causal_mask`); importing this package needs neither tf_keras
nor Mesh TensorFlow nor tensorflow-text. docs/keras3.md has the guide.

Keras 3 and its backend come with thattn's `[jax]`, `[torch]` or
`[tensorflow]` extra; KERAS_BACKEND chooses the backend before Keras is
first imported (Keras 3's default is tensorflow).
"""

# pylint: disable=g-bad-import-order,g-import-not-at-top
import importlib

from thattn.core import requirements

try:  # one line naming the pip extra or KERAS_BACKEND, not Keras's traceback
  import keras  # pylint: disable=unused-import
except ModuleNotFoundError as error:
  _friendly = requirements.keras3_import_error(error)
  if _friendly is None:
    raise
  raise _friendly from error

from thattn.core import attention_spec
from thattn.core import variants
from thattn.core.attention_spec import DYNAMIC_PROJECTIONS
from thattn.keras3.attention_math import relative_position_bucket
from thattn.keras3.base import AttentionLayer
from thattn.keras3.dcmha import DynamicallyComposableAttention
from thattn.keras3.differential import DifferentialAttention
from thattn.keras3.initializers import ScaledInitializer
from thattn.keras3.distribution import layout_map
from thattn.keras3.distribution import model_layout_map
from thattn.keras3.general_bilinear import GeneralBilinearAttention
from thattn.keras3.head_mixing_attention import HeadMixingAttention
from thattn.keras3.keras_interop import from_keras
from thattn.keras3.keras_interop import to_keras
from thattn.keras3.projected import MultiHeadAttention
from thattn.sharding.rules import DEFAULT_LAYOUT_RULES
from thattn.keras3.projected import TalkingHeadsAttention
from thattn.keras3.relative_position import RelativePositionBias

def fixed_head_size_attention(num_heads, sequence_length=None, head_size=None,
                              variant="multi_head", **kwargs):
  """Attention with d_k = d_v fixed (Bhojanapalli et al., 2020): to the
  sequence length n, or to `head_size`; as `thattn.layers`' helper."""
  size = attention_spec.fixed_head_size(sequence_length, head_size)
  return variants.make_attention("keras3", variants.sized(variant), num_heads,
                                 size, value_dim=size, **kwargs)


def make_attention(variant, num_heads, key_dim, **kwargs):
  """The named attention variant (`thattn.core.variants`) as a Keras 3
  layer with h heads of size d_k; as `thattn.layers.make_attention`."""
  return variants.make_attention("keras3", variant, num_heads, key_dim,
                                 **kwargs)


# Subpackages loaded on first use (PEP 562): `thattn.keras3.models` after
# a plain `import thattn`, without paying for the models at import.
_SUBPACKAGES = ("models", "optimizers")


def __getattr__(name):
  if name in _SUBPACKAGES:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
