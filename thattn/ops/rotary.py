"""Rotary position embeddings (RoPE; Su et al., 2021, "RoFormer"), written
once for both front ends over an ops namespace (`keras.ops`,
`thattn.ops.tf_ops.TF_OPS`), as the decoder-only families apply them to
the queries and keys before the logits.

Letters follow `thattn.core.dims`: Q or K [b, n, i, k] (batch, positions,
heads, size per head); `r` indexes the rotary frequencies, half of the
`rotated` leading entries of each head (Llama rotates them all; GPT-NeoX
and Pythia the first `rotary_pct` of them, passing the rest through).

Each frequency theta_r turns one pair of a head's entries by the angle
p * theta_r at position p. The pairs are the "half" pairing of Hugging
Face's Llama and GPT-NeoX code, entry r with entry r + rotated / 2 (the
RoFormer paper pairs neighbours, 2r with 2r + 1; a checkpoint of one
pairing converts to the other by permuting the query and key kernels'
columns, as transformers' Llama conversion does):

    x'[r]           = x[r] cos(p theta_r) - x[r + R] sin(p theta_r)
    x'[r + R]       = x[r + R] cos(p theta_r) + x[r] sin(p theta_r)
    x'[rotated...]  = x[rotated...]                     (R = rotated / 2)

with theta_r = base^(-2r / rotated), and for the Llama 3.1 and 3.2
releases the `llama3` scaling of those frequencies (`Llama3Scaling`). The
angles are float32 and cos, sin take x's dtype before the products, as in
transformers, so that a model converted from there gives its logits.
"""

import dataclasses
import math

import numpy as np

from thattn.core import validation

# angles[b, n, r] = einsum(positions[b, n], theta[r]).
ANGLES = "bn,r->bnr"


@dataclasses.dataclass(frozen=True)
class Llama3Scaling:
  """The `rope_scaling` of type "llama3" (Llama 3.1 and 3.2 configs):
  frequencies whose wavelength is longer than
  original_max_position_embeddings / low_freq_factor are divided by
  `factor`, those shorter than original / high_freq_factor kept, and those
  between interpolated smoothly in original / wavelength."""
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    owner = "Llama3Scaling"
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{owner}: {name}={value!r}; expected a positive "
                         "number.")
    if self.high_freq_factor <= self.low_freq_factor:
      raise ValueError(
          f"{owner}: high_freq_factor={self.high_freq_factor} must be above "
          f"low_freq_factor={self.low_freq_factor}.")
    validation.positive_int("original_max_position_embeddings",
                            self.original_max_position_embeddings,
                            owner=owner)


def llama3_scaling(config):
  """A `Llama3Scaling` from its fields as a dict (a layer's config, a
  Hugging Face `rope_scaling` with "rope_type": "llama3"); None stays
  None. Other rope types and unknown fields are refused by name."""
  if config is None or isinstance(config, Llama3Scaling):
    return config
  if not isinstance(config, dict):
    raise ValueError(f"rotary: rotary_scaling={config!r}; expected None or "
                     "a dict of Llama3Scaling's fields.")
  fields = dict(config)
  rope_type = fields.pop("rope_type", "llama3")
  if rope_type != "llama3":
    raise ValueError(f"rotary: rope_type={rope_type!r} is not supported; "
                     "thattn has the \"llama3\" scaling only.")
  known = {field.name for field in dataclasses.fields(Llama3Scaling)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(f"rotary: rotary_scaling has {unknown}; expected only "
                     f"{sorted(known)} (and rope_type).")
  return Llama3Scaling(**fields)


def scaling_config(scaling):
  """The dict `llama3_scaling` reads back: None or Llama3Scaling's fields."""
  return None if scaling is None else dataclasses.asdict(scaling)


def rotated_size(key_dim, rotary_pct=1.0):
  """How many leading entries of each head are rotated: int(d_k *
  rotary_pct), as GPT-NeoX truncates it; it must be even and positive."""
  validation.positive_int("key_dim", key_dim, owner="rotary")
  if not isinstance(rotary_pct, (int, float)) or not 0 < rotary_pct <= 1:
    raise ValueError(f"rotary: rotary_pct={rotary_pct!r}; expected a number "
                     "in (0, 1].")
  rotated = int(key_dim * rotary_pct)
  if rotated < 2 or rotated % 2:
    raise ValueError(
        f"rotary: key_dim={key_dim} with rotary_pct={rotary_pct} rotates "
        f"{rotated} entries of each head; expected an even number, at "
        "least 2.")
  return rotated


def frequencies(rotated, base=10000.0, scaling=None):
  """float32 NumPy theta[r] = base^(-2r / rotated), r < rotated / 2, scaled
  by `scaling` (None or `Llama3Scaling`). In float32 throughout, the
  operations in transformers' order, so the angles are its angles."""
  validation.positive_int("rotated", rotated, owner="rotary")
  if rotated % 2:
    raise ValueError(f"rotary: rotated={rotated}; expected an even number.")
  if not isinstance(base, (int, float)) or base <= 1:
    raise ValueError(f"rotary: base={base!r}; expected a number above 1.")
  if scaling is not None and not isinstance(scaling, Llama3Scaling):
    raise ValueError(f"rotary: scaling={scaling!r}; expected None or a "
                     "Llama3Scaling.")
  exponents = np.arange(0, rotated, 2, dtype=np.float32) / np.float32(rotated)
  theta = np.float32(1.0) / np.power(np.float32(base), exponents)
  if scaling is None:
    return theta.astype(np.float32)
  factor = np.float32(scaling.factor)
  original = np.float32(scaling.original_max_position_embeddings)
  low, high = (np.float32(scaling.low_freq_factor),
               np.float32(scaling.high_freq_factor))
  wavelength = np.float32(2 * math.pi) / theta
  # Long wavelengths (low frequencies) slowed by the factor, short kept.
  scaled = np.where(wavelength > original / low, theta / factor, theta)
  smooth = (original / wavelength - low) / (high - low)
  between = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelength < original / high) & ~(wavelength > original / low)
  return np.where(medium, between, scaled).astype(np.float32)


def layer_frequencies(owner, key_dim, base, rotary_pct=1.0, scaling=None):
  """theta for an attention layer's `rotary_base`, `rotary_pct` and
  `rotary_scaling` arguments, the last as `llama3_scaling` read it (base
  None: no rotary position embeddings, and then the other two must keep
  their defaults)."""
  if base is None:
    given = []
    if rotary_pct != 1.0:
      given.append(f"rotary_pct={rotary_pct!r}")
    if scaling is not None:
      given.append(f"rotary_scaling={scaling!r}")
    if given:
      raise ValueError(
          f"{owner}: {', '.join(given)} needs rotary_base (the rotary "
          "embeddings' base, 10000.0 in RoFormer and GPT-NeoX, 500000.0 in "
          "Llama 3).")
    return None
  return frequencies(rotated_size(key_dim, rotary_pct), base=base,
                     scaling=scaling)


def positions_from(ops, x, offset):
  """int32 positions [b, n] of x [b, n, ...]'s rows: offset + [0, n)."""
  rows = ops.zeros_like(x[:, :, 0, 0], dtype="int32")
  return rows + ops.expand_dims(
      ops.arange(ops.shape(x)[1], dtype="int32"), 0) + ops.cast(offset,
                                                                "int32")


def apply(ops, x, positions, theta):
  """x [b, n, i, k] turned by its positions: int [b, n] -> x's dtype and
  shape. The first 2 * len(theta) entries of each head are rotated, the
  rest passed through."""
  half = int(theta.shape[0])
  angles = ops.einsum(ANGLES, ops.cast(positions, "float32"), theta)
  cos = ops.cast(ops.expand_dims(ops.cos(angles), 2), x.dtype)
  sin = ops.cast(ops.expand_dims(ops.sin(angles), 2), x.dtype)
  first, second = x[..., :half], x[..., half:2 * half]
  parts = [first * cos - second * sin, second * cos + first * sin]
  if x.shape[-1] != 2 * half:
    parts.append(x[..., 2 * half:])
  return ops.concatenate(parts, axis=-1)
