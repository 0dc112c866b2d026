"""keras.layers.MultiHeadAttention's conventions that thattn's layers share.

Functions the Keras 3 base layer (`thattn.keras3.base`) calls, kept apart
from the attention math:
- `override_call`: Keras documents `_compute_attention(query, key, value,
  attention_mask=None, training=None, return_attention_scores=False)` as the
  one override point. A subclass that overrides it is called with Keras's
  arguments (the causal and window masks folded into `attention_mask`, as
  Keras folds them); thattn's extras (a position bias, the dynamic
  projections' tensors) are passed only by keyword and only to an override
  that takes them, and an override that cannot take one that this call
  needs is refused by name rather than silently ignoring it.
- `quantized_policies`: the dtype policies of quantized projections, kept in
  the layer's config as a `keras.dtype_policies.DTypePolicyMap` (Keras's
  documented way for a layer with sublayers), so that a quantized model
  saves and reloads: the map quantizes the projections again as they are
  built.
"""

import inspect

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.core import validation
from thattn.keras3 import masks


def overrides_compute_attention(layer, base_class):
  """Whether `layer`'s class replaces `base_class._compute_attention`."""
  return type(layer)._compute_attention is not base_class._compute_attention  # pylint: disable=protected-access


def dynamic_tensors(query_state, memory_state):
  """{name: tensor} of the projected states' entries beyond Q, K and V
  (talking heads' dynamic projections R, DCMHA's dynamic weights)."""
  return {name: state[name] for state in (query_state, memory_state)
          for name in attention_spec.DYNAMIC_STATE_SIDES if name in state}


def states(query, key, value, dynamic_projections):
  """The (query_state, memory_state) dicts the variants' `attend` reads."""
  query_state, memory_state = {"query": query}, {"key": key, "value": value}
  for name, tensor in (dynamic_projections or {}).items():
    side = attention_spec.DYNAMIC_STATE_SIDES[name]
    (query_state if side == "query" else memory_state)[name] = tensor
  return query_state, memory_state


def override_call(layer, query_state, memory_state, mask, position_bias,
                  training, causal_offset, need_scores):
  """Calls a subclass's `_compute_attention` with Keras's arguments."""
  query, key, value = (query_state["query"], memory_state["key"],
                       memory_state["value"])
  extras = {"position_bias": position_bias,
            "dynamic_projections": dynamic_tensors(query_state,
                                                   memory_state) or None}
  extras = {name: tensor for name, tensor in extras.items()
            if tensor is not None}
  parameters = inspect.signature(layer._compute_attention).parameters  # pylint: disable=protected-access
  takes_any = any(p.kind == p.VAR_KEYWORD for p in parameters.values())
  missing = sorted(name for name in extras
                   if name not in parameters and not takes_any)
  if missing:
    raise ValueError(
        f"{layer.name}: {type(layer).__name__}._compute_attention overrides "
        "Keras's override point, but this call needs "
        + ", ".join(f"`{name}`" for name in missing) + ", which it does not "
        "take; add them as keyword arguments (or **kwargs) to the override "
        "and pass them on to super()._compute_attention.")
  band = None
  if causal_offset is not None:
    band = masks.positions_band(ops.shape(query)[1], ops.shape(key)[1],
                                causal_offset, causal=True)
  full_mask = masks.keras_form(masks.combine(mask, band))
  return layer._compute_attention(query, key, value, full_mask, training,  # pylint: disable=protected-access
                                  need_scores, **extras)


def quantized_policies(layer):
  """A DTypePolicyMap {sublayer path: policy} of `layer`'s quantized
  sublayers (None if none is quantized), to store as its config's dtype."""
  quantized = [sublayer for sublayer in layer._flatten_layers(  # pylint: disable=protected-access
      include_self=False) if sublayer.quantization_mode is not None]
  if not quantized:
    return None
  own = layer.dtype_policy
  if isinstance(own, keras.dtype_policies.DTypePolicyMap):
    policies = own  # loaded from such a config: it holds the entries
  else:
    policies = keras.dtype_policies.DTypePolicyMap(default_policy=own)
  for sublayer in quantized:
    policy = sublayer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
      policy = policy[sublayer.path]  # built from a map: its own entry
    if sublayer.path not in policies:
      policies[sublayer.path] = policy
  return policies


def projections(layer):
  """The layer's EinsumDense projections (the layers Keras can quantize)."""
  return [sublayer for sublayer in layer._flatten_layers(include_self=False)  # pylint: disable=protected-access
          if isinstance(sublayer, keras.layers.EinsumDense)]


def enable_lora(layer, rank, lora_alpha, a_initializer, b_initializer,
                projections):
  """`layer.enable_lora`: the arguments checked, then Keras's EinsumDense
  LoRA on each named projection."""
  validation.layer_int("rank", rank, owner=layer.name)
  if lora_alpha is not None and (isinstance(lora_alpha, bool) or not
                                 isinstance(lora_alpha, (int, float)) or
                                 lora_alpha <= 0):
    raise ValueError(
        f"{layer.name}: Received an invalid value for argument `lora_alpha`, "
        f"expected a positive number or `None`. Received: "
        f"lora_alpha={lora_alpha!r}")
  dense = {name: getattr(layer, f"{name}_dense", None)
           for name in ("query", "key", "value", "output", "gate")}
  unknown = [name for name in projections if dense.get(name) is None]
  if unknown:
    raise ValueError(
        f"{layer.name}: no projection {unknown} to enable LoRA on; this "
        "layer's projections are "
        f"{sorted(name for name, sublayer in dense.items() if sublayer)}.")
  for name in projections:
    dense[name].enable_lora(rank, lora_alpha=lora_alpha,
                            a_initializer=a_initializer,
                            b_initializer=b_initializer)
