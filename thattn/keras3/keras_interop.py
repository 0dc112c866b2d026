"""Weights between Keras 3's keras.layers.MultiHeadAttention (and
GroupQueryAttention) and thattn's.

`from_keras(layer)` gives a `thattn.keras3.MultiHeadAttention` computing
what a built Keras 3 MultiHeadAttention computes, or a GroupQueryAttention
(as `num_key_value_heads`); `to_keras(layer)` the reverse, a thattn layer
with shared key and value heads becoming Keras's GroupQueryAttention. The one difference in the math is where 1/sqrt(d_k) sits: Keras
scales the queries at run time, thattn folds it into P_q (the paper's
convention), so P_q and its bias are multiplied by 1/sqrt(d_k) on the way
in and divided on the way out. Biases, the gate, the sliding window,
dropout and output width are carried; a LoRA layer's factors are merged
into its kernels (Keras's `kernel` property does it).

Keras layers thattn's cannot compute are refused by name: attention over
other axes or inputs of rank other than 3, a multi-dimensional
`output_shape`, quantized projections (their float kernels are gone); and
thattn layers Keras's cannot compute likewise (rotary positions, a
head-wise gate).
"""

import math

import keras
import numpy as np

from thattn.core import attention_spec
from thattn.keras3 import projected

# thattn's projection -> keras.layers.MultiHeadAttention's sublayer.
_KERAS_SUBLAYERS = {"query": "_query_dense", "key": "_key_dense",
                    "value": "_value_dense", "output": "_output_dense",
                    "gate": "_gate_dense"}


def _check_keras_layer(layer):
  owner = getattr(layer, "name", type(layer).__name__)
  if not isinstance(layer, (keras.layers.MultiHeadAttention,
                            keras.layers.GroupQueryAttention)):
    raise ValueError(f"from_keras takes a keras.layers.MultiHeadAttention "
                     f"or GroupQueryAttention (Keras 3), got "
                     f"{type(layer).__name__}.")
  if not layer.built:
    raise ValueError(f"{owner}: build or call the Keras layer first, so its "
                     "weights exist.")
  config = layer.get_config()
  attention_spec.check_attention_axes(owner, config.get("attention_axes"))
  equation = layer._query_dense.equation  # pylint: disable=protected-access
  if len(equation.split(",")[0]) != 3:
    raise ValueError(f"{owner}: built for query inputs of rank "
                     f"{len(equation.split(',')[0])}; thattn's layers take "
                     "[batch, length, width].")
  for name in _KERAS_SUBLAYERS.values():
    sublayer = getattr(layer, name, None)
    if sublayer is not None and sublayer.quantization_mode is not None:
      raise ValueError(
          f"{owner}: its projections are quantized "
          f"({sublayer.quantization_mode}); convert the float layer, then "
          "quantize thattn's.")
  return config


def from_keras(layer):
  """A built thattn.keras3.MultiHeadAttention with `layer`'s weights (a
  Keras MultiHeadAttention, or a GroupQueryAttention: its query heads as
  h, its key and value heads as `num_key_value_heads`)."""
  config = _check_keras_layer(layer)
  if isinstance(layer, keras.layers.GroupQueryAttention):
    config = dict(config, num_heads=config["num_query_heads"],
                  key_dim=config["head_dim"], value_dim=config["head_dim"],
                  output_shape=None)
  output_shape = config["output_shape"]
  if output_shape is not None:
    output_shape = attention_spec.output_width(layer.name, output_shape)
  kernels = {name: getattr(layer, attribute, None) for name, attribute in
             _KERAS_SUBLAYERS.items()}
  result = projected.MultiHeadAttention(
      config["num_heads"], config["key_dim"], value_dim=config["value_dim"],
      dropout=config["dropout"], use_bias=config["use_bias"],
      output_shape=output_shape, use_gate=config["use_gate"],
      sliding_window=config["sliding_window"], seed=config["seed"],
      num_key_value_heads=config.get("num_key_value_heads"),
      dtype=layer.dtype_policy, name=f"{layer.name}_thattn")
  widths = [kernels[name].kernel.shape[0] for name in ("query", "value",
                                                         "key")]
  result.build(*[(None, None, width) for width in widths])
  _copy(kernels, result, scale=1.0 / math.sqrt(config["key_dim"]))
  return result


def to_keras(layer):
  """A built keras.layers.MultiHeadAttention with `layer`'s weights (a
  thattn.keras3.MultiHeadAttention), or a GroupQueryAttention where its
  key and value heads are shared (`num_key_value_heads`; Keras's layer
  then needs d_k = d_v and the query width as output width)."""
  if not isinstance(layer, projected.MultiHeadAttention):
    raise ValueError(
        "to_keras takes a thattn.keras3.MultiHeadAttention (Keras's layer "
        f"has no P_l, P_w or general bilinear form), got "
        f"{type(layer).__name__}.")
  if not layer.built:
    raise ValueError(f"{layer.name}: build or call the layer first, so its "
                     "weights exist.")
  if layer.rotary_base is not None:
    raise ValueError(
        f"{layer.name}: rotary_base={layer.rotary_base} turns queries and "
        "keys by position, which Keras's attention layers do not.")
  if layer.headwise_gate:
    raise ValueError(
        f"{layer.name}: headwise_gate=True gates each head by one scalar; "
        "Keras's use_gate gates each element of the heads' outputs.")
  widths = layer._widths  # pylint: disable=protected-access
  if layer.num_key_value_heads is None:
    result = keras.layers.MultiHeadAttention(
        layer.num_heads, layer.key_dim, value_dim=layer.value_dim,
        dropout=layer.dropout, use_bias=layer.use_bias,
        output_shape=layer.output_dim, use_gate=layer.use_gate,
        sliding_window=layer.sliding_window, seed=layer.seed,
        dtype=layer.dtype_policy, name=f"{layer.name}_keras")
  else:
    output_width = layer.output_dim or widths["query"]
    if layer.value_dim != layer.key_dim or output_width != widths["query"]:
      raise ValueError(
          f"{layer.name}: keras.layers.GroupQueryAttention has one head_dim "
          "and outputs the query width; this layer has key_dim="
          f"{layer.key_dim}, value_dim={layer.value_dim} and output width "
          f"{output_width} for queries of width {widths['query']}.")
    result = keras.layers.GroupQueryAttention(
        layer.key_dim, layer.num_heads, layer.num_key_value_heads,
        dropout=layer.dropout, use_bias=layer.use_bias,
        use_gate=layer.use_gate, sliding_window=layer.sliding_window,
        seed=layer.seed, dtype=layer.dtype_policy,
        name=f"{layer.name}_keras")
  result.build((None, None, widths["query"]), (None, None, widths["value"]),
               (None, None, widths["key"]))
  source = {name: getattr(layer, f"{name}_dense") for name in
            _KERAS_SUBLAYERS}
  target = {name: getattr(result, attribute, None) for name, attribute in
            _KERAS_SUBLAYERS.items()}
  _copy(source, target, scale=math.sqrt(layer.key_dim), into_keras=True)
  return result


def _copy(source, target, scale, into_keras=False):
  """Copies kernels and biases projection by projection; the query's
  kernel and bias are multiplied by `scale` (the moved 1/sqrt(d_k))."""
  if not into_keras:
    target = {name: getattr(target, f"{name}_dense") for name in source}
  for name, layer in source.items():
    if layer is None:
      continue
    factor = scale if name == "query" else 1.0
    target[name].kernel.assign(
        np.asarray(keras.ops.convert_to_numpy(layer.kernel)) * factor)
    if layer.bias is not None:
      target[name].bias.assign(
          np.asarray(keras.ops.convert_to_numpy(layer.bias)) * factor)
