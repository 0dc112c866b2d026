"""The custom variant example (docs/examples/custom_variant.py), imported
from its file for the tests, and its NumPy reference.

Residual talking heads with D_l and D_w is talking heads with P_l = I + D_l
and P_w = I + D_w: the reference is `numpy_reference.talking_heads_attention`
with those projections, an identity the layer must meet exactly.
"""

import importlib.util
import pathlib

import numpy as np

from tests.layers import numpy_reference as ref

EXAMPLE = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" /
           "custom_variant.py")
NAME = "residual_talking_heads"


def import_example():
  """Imports the example from its file (registering its variant)."""
  spec = importlib.util.spec_from_file_location("custom_variant", EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def random_weights(rng, d_x, d_m, h, d_k, d_v, d_y):
  """{name inside the layer: float64 array} for every weight."""
  def normal(*shape, fan_in):
    return rng.normal(size=shape) / np.sqrt(fan_in)
  return {"query/kernel": normal(d_x, h, d_k, fan_in=d_x),
          "key/kernel": normal(d_m, h, d_k, fan_in=d_m),
          "value/kernel": normal(d_m, h, d_v, fan_in=d_m),
          "output/kernel": normal(h, d_v, d_y, fan_in=h * d_v),
          "logits_residual": normal(h, h, fan_in=h),
          "weights_residual": normal(h, h, fan_in=h)}


def reference(x, memory, weights, mask=None):
  """(Y, U) of residual talking heads, in float64."""
  h = weights["logits_residual"].shape[0]
  return ref.talking_heads_attention(
      x, memory, weights["query/kernel"], weights["key/kernel"],
      weights["value/kernel"], weights["output/kernel"],
      P_l=np.eye(h) + weights["logits_residual"],
      P_w=np.eye(h) + weights["weights_residual"], mask=mask,
      return_weights=True)
