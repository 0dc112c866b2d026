"""Which mtf variable is which Keras weight, dimension by dimension.

A `LayerMap` describes one attention layer on both sides: for each weight,
its mtf variable name and its thattn token (see `thattn.mtf.convert`), and
each side's axes as tuples of *atomic* dimension names. An mtf combined
kernel axis such as `SelfAttention`'s `[d_model, heads * d_kv]` is the atom
tuple ("heads", "d_kv"); a Keras axis that flattens several mtf heads dims
(grouped or multi-dim head lists) is a tuple of their names. Converting
reshapes one side into atoms, transposes by name and reshapes into the
other side's axes, so heads are matched by dimension name, never by
position in a list, and a round trip is exact.

A size-1 atom may be missing on one side (mtf drops the heads dim when
num_heads is 1, Keras keeps it).
"""

import dataclasses
import math

from thattn import layers as keras_layers
from thattn.mtf import compat
from thattn.mtf import layers as mtf_layers

mtf = compat.import_mesh_tensorflow()
_tl = mtf_layers.transformer_layers

D_MODEL, D_MODEL_IN, BUCKETS = "d_model", "_d_model", "buckets"
RELATIVE_BIAS = "relative_attention_bias"


@dataclasses.dataclass(frozen=True)
class WeightMap:
  """One weight: mtf name and axes, Keras token and axes, Keras = mtf*scale."""
  mtf_name: str
  token: str
  mtf_axes: tuple  # one tuple of atom names per mtf axis
  keras_axes: tuple  # one tuple of atom names per Keras axis
  scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class LayerMap:
  """An mtf attention layer and its thattn Keras counterpart."""
  description: str  # names the mtf layer in messages
  keras_class: type
  keras_kwargs: dict
  sizes: dict  # atom name -> size
  weights: tuple  # WeightMap, ...

  def shape(self, axes):
    return tuple(math.prod(self.sizes[a] for a in axis) for axis in axes)


def _atoms(dims):
  return tuple((d.name,) for d in dims)


def _refuse(description, what, expected):
  raise ValueError(f"{description}: {what}; thattn's converter expects "
                   f"{expected}.")


def layer_map(layer, *, d_model):
  """The `LayerMap` of an mtf attention layer (see `thattn.mtf.convert`)."""
  if mtf.layers.unit_scaling_convention():
    raise ValueError(
        "mtf.layers.unit_scaling_convention is True (gin), so every mtf "
        "einsum divides by the square root of its contracted size; thattn "
        "never scales at run time. Expected unit_scaling_convention=False.")
  if isinstance(layer, (mtf_layers.GroupedTalkingHeadsSelfAttention,
                        mtf_layers.GroupedTalkingHeadsEncDecAttention)):
    return _talking_heads(layer.mtf_layer(), d_model, type(layer).__name__)
  if isinstance(layer, _tl.TalkingHeadsSelfAttention):
    return _talking_heads(layer, d_model, type(layer).__name__)
  if isinstance(layer, _tl.GeneralBilinearSelfAttention):
    return _general_bilinear(layer, d_model)
  if type(layer) in (_tl.SelfAttention, _tl.EncDecAttention):  # pylint: disable=unidiomatic-typecheck
    return _multi_head(layer, d_model)
  raise ValueError(
      f"mtf layer {type(layer).__name__} has no thattn counterpart; expected "
      "SelfAttention, EncDecAttention, TalkingHeads{Self,EncDec}Attention, "
      "GeneralBilinear{Self,EncDec}Attention or thattn's "
      "GroupedTalkingHeads{Self,EncDec}Attention.")


def _is_enc_dec(layer):
  return isinstance(layer, (_tl.EncDecAttention,
                            _tl.TalkingHeadsEncDecAttention,
                            _tl.GeneralBilinearEncDecAttention))


def _relative_bias(layer, description, heads_atoms, keras_heads=None):
  """The relative bias's WeightMap, or None; refuses what thattn lacks.

  mtf stores it as [heads..., buckets] in `heads_atoms` order, thattn's
  `RelativePositionBias` as [buckets, h] in `keras_heads` order.
  """
  kind = layer.relative_attention_type
  if kind is None:
    return None
  if _is_enc_dec(layer):
    _refuse(description, f"relative_attention_type={kind!r} on "
            "encoder-decoder attention uses mtf's span positions",
            "relative_attention_type=None there")
  if kind not in ("bias", "bias_shared"):
    _refuse(description, f"relative_attention_type={kind!r}",
            "None, 'bias' or 'bias_shared'")
  return WeightMap(RELATIVE_BIAS, RELATIVE_BIAS,
                   tuple((a,) for a in heads_atoms) + ((BUCKETS,),),
                   ((BUCKETS,), heads_atoms if keras_heads is None else
                    keras_heads))


def _check_multi_head(layer, description):
  unsupported = {
      "num_memory_heads": (layer.num_memory_heads, 0),
      "shared_kv": (layer.shared_kv, False),
      "keep_query_heads_dims": (layer.keep_query_heads_dims, False),
      "attention_func": (layer.attention_func, None),
      "attention_kwargs": (layer.attention_kwargs, {}),
      "hyperprompt_length_encoder": (layer.hyperprompt_length_encoder, None),
      "hyperprompt_length_decoder": (layer.hyperprompt_length_decoder, None),
  }
  for name, (value, expected) in unsupported.items():
    if value != expected:
      _refuse(description, f"{name}={value!r} has no Keras counterpart",
              f"{name}={expected!r}")


def _multi_head(layer, d_model):
  """SelfAttention / EncDecAttention <-> thattn.layers.MultiHeadAttention."""
  h, d_kv = layer.num_heads, layer.key_value_size
  description = (f"{type(layer).__name__}(num_heads={h}, "
                 f"key_value_size={d_kv})")
  _check_multi_head(layer, description)
  heads = ("heads",) if h > 1 else ()  # mtf has no heads dim for one head
  in_axes = ((D_MODEL,),) + ((heads + ("d_kv",),) if layer.combine_dims else
                             tuple((a,) for a in heads + ("d_kv",)))
  out_axes = in_axes[1:] + ((D_MODEL,),)
  keras_in = ((D_MODEL,), ("heads",), ("d_kv",))
  # fold_scaling_into_initializer=False multiplies Q by d_kv**-0.5 at run
  # time; thattn never scales at run time, so the factor goes into P_q.
  q_scale = 1.0 if layer.fold_scaling_into_initializer else d_kv ** -0.5
  weights = [WeightMap("q", "query/kernel", in_axes, keras_in, q_scale),
             WeightMap("k", "key/kernel", in_axes, keras_in),
             WeightMap("v", "value/kernel", in_axes, keras_in),
             WeightMap("o", "output/kernel", out_axes,
                       (("heads",), ("d_kv",), (D_MODEL,)))]
  bias = _relative_bias(layer, description, heads)
  return LayerMap(
      description, keras_layers.MultiHeadAttention,
      dict(num_heads=h, key_dim=d_kv, dropout_rate=layer.dropout_rate),
      {D_MODEL: d_model, "heads": h, "d_kv": d_kv,
       BUCKETS: layer.relative_attention_num_buckets},
      tuple(weights + ([bias] if bias else [])))


def _general_bilinear(layer, d_model):
  """GeneralBilinear*Attention <-> thattn.layers.GeneralBilinearAttention."""
  heads = tuple(d.name for d in layer.heads_dims)
  description = f"{type(layer).__name__}(heads_dims={layer.heads_dims})"
  sizes = {d.name: d.size for d in layer.heads_dims}
  sizes.update({D_MODEL: d_model, D_MODEL_IN: d_model,
                BUCKETS: layer.relative_attention_num_buckets})
  # mtf renames the contracted d_model of q and y to _d_model: in q it is
  # the query width d_X, in y the memory width d_M.
  p = WeightMap("q/kernel", "bilinear_p",
                ((D_MODEL_IN,),) + _atoms(layer.heads_dims) + ((D_MODEL,),),
                ((D_MODEL_IN,), (D_MODEL,), heads))
  q = WeightMap("y/kernel", "bilinear_q",
                _atoms(layer.heads_dims) + ((D_MODEL_IN,), (D_MODEL,)),
                ((D_MODEL_IN,), (D_MODEL,), heads))
  bias = _relative_bias(layer, description, heads)
  return LayerMap(
      description, keras_layers.GeneralBilinearAttention,
      dict(num_heads=math.prod(sizes[a] for a in heads),
           dropout_rate=layer.dropout_rate),
      sizes, (p, q) + ((bias,) if bias else ()))


def _head_lists(layer, description):
  """{name: size} of the three heads lists, refusing clashing names."""
  sizes = {}
  for which in ("key_heads_dims", "softmax_heads_dims", "value_heads_dims"):
    dims = getattr(layer, which)
    if len({d.name for d in dims}) != len(dims):
      _refuse(description, f"{which} {dims} repeats a name",
              "distinct names within one list")
    for d in dims:
      if sizes.setdefault(d.name, d.size) != d.size:
        _refuse(description, f"heads dim {d.name!r} has sizes "
                f"{sizes[d.name]} and {d.size} in different lists",
                "one size per dimension name")
  return sizes


def _projection(description, name, inputs, outputs, groups):
  """mtf's (shared, reduced, new) atoms of P_l or P_w, or None if absent."""
  if {d.name for d in inputs} == {d.name for d in outputs}:
    return None  # mtf creates no projection when the names agree
  shared = tuple(d.name for d in inputs if d in outputs)
  if set(shared) != set(groups):
    _refuse(description, f"the {name} projection shares heads dims "
            f"{list(shared)} but all three lists share {list(groups)}",
            "the dims shared by two lists to be shared by all three "
            "(thattn's head groups)")
  return (shared, tuple(d.name for d in inputs if d not in outputs),
          tuple(d.name for d in outputs if d not in inputs))


_DYNAMIC = {"l": ("x2l", "m2l"), "w": ("x2w", "m2w")}


def _check_dynamic(layer, description, logits, weights):
  dynamic = tuple(layer.dynamic_projections or ())
  known = _DYNAMIC["l"] + _DYNAMIC["w"]
  unknown = [name for name in dynamic if name not in known]
  if unknown:
    _refuse(description, f"unknown dynamic projections {unknown}",
            f"a subset of {known}")
  for name in dynamic:
    static, lists = ((logits, "key_heads_dims and softmax_heads_dims")
                     if name in _DYNAMIC["l"] else
                     (weights, "softmax_heads_dims and value_heads_dims"))
    if static is None:
      _refuse(description, f"mtf silently ignores dynamic projection "
              f"{name!r} because {lists} have the same names (so it makes "
              "no static projection to add it to)", "different names "
              f"in {lists}, or no {name!r}")
  return tuple(name for name in known if name in dynamic)


def _mixing_weights(kind, projection, keras_axes, dynamic):
  """P_l or P_w (kind "l" / "w") and its dynamic terms, as WeightMaps."""
  scope, token = {"l": ("logits", "pre_softmax_projection"),
                  "w": ("weights", "post_softmax_projection")}[kind]
  mtf_axes = tuple((a,) for part in projection for a in part)
  maps = [WeightMap(f"{scope}/kernel", token, mtf_axes, keras_axes)]
  enabled = [name for name in _DYNAMIC[kind] if name in dynamic]
  for i, name in enumerate(enabled):
    maps.append(WeightMap(f"{scope}/{scope}_dynamic_{i}/kernel",
                          f"{name}/kernel", ((D_MODEL,),) + mtf_axes,
                          ((D_MODEL,),) + keras_axes))
  return maps


def _talking_heads(layer, d_model, owner):
  """TalkingHeads*Attention <-> thattn.layers.TalkingHeadsAttention."""
  key, softmax, value = (layer.key_heads_dims, layer.softmax_heads_dims,
                         layer.value_heads_dims)
  description = (f"{owner}(key_heads_dims={key}, softmax_heads_dims="
                 f"{softmax}, value_heads_dims={value})")
  sizes = _head_lists(layer, description)
  kn, sn, vn = (tuple(d.name for d in dims) for dims in (key, softmax, value))
  groups = tuple(a for a in sn if a in kn and a in vn)
  logits = _projection(description, "logits", key, softmax, groups)
  weights = _projection(description, "weights", softmax, value, groups)
  dynamic = _check_dynamic(layer, description, logits, weights)
  mixing = logits is not None or weights is not None
  # Keras heads are group-major: the shared dims first (in softmax order),
  # then each list's own. Size-1 groups are dropped (a missing size-1 atom
  # converts as a reshape).
  prefix = groups if (math.prod(sizes[g] for g in groups) > 1 or
                      not mixing) else ()
  num_groups = math.prod(sizes[g] for g in prefix) if mixing else 1

  def canon(names):
    return prefix + tuple(a for a in names if a not in groups)

  def mixing_axes(inputs, outputs):
    if num_groups > 1:
      return (prefix, canon(inputs)[len(prefix):], canon(outputs)[len(prefix):])
    return (canon(inputs), canon(outputs))

  maps = [
      WeightMap("q/kernel", "query/kernel", ((D_MODEL,),) + _atoms(key) +
                (("d_k",),), ((D_MODEL,), canon(kn), ("d_k",))),
      WeightMap("k/kernel", "key/kernel", ((D_MODEL,),) + _atoms(key) +
                (("d_k",),), ((D_MODEL,), canon(kn), ("d_k",))),
      WeightMap("v/kernel", "value/kernel", ((D_MODEL,),) + _atoms(value) +
                (("d_v",),), ((D_MODEL,), canon(vn), ("d_v",))),
      WeightMap("y/kernel", "output/kernel", _atoms(value) +
                (("d_v",), (D_MODEL,)), (canon(vn), ("d_v",), (D_MODEL,)))]
  if logits is not None:
    maps += _mixing_weights("l", logits, mixing_axes(kn, sn), dynamic)
  if weights is not None:
    maps += _mixing_weights("w", weights, mixing_axes(sn, vn), dynamic)
  bias = _relative_bias(layer, description, sn, canon(sn))
  sizes.update({D_MODEL: d_model, "d_k": layer.key_dim.size,
                "d_v": layer.value_dim.size,
                BUCKETS: layer.relative_attention_num_buckets})
  kwargs = dict(
      num_heads=math.prod(sizes[a] for a in sn),
      num_key_heads=math.prod(sizes[a] for a in kn),
      num_value_heads=math.prod(sizes[a] for a in vn),
      key_dim=layer.key_dim.size, value_dim=layer.value_dim.size,
      project_logits=logits is not None, project_weights=weights is not None,
      dynamic_projections=list(dynamic), num_head_groups=num_groups,
      dropout_rate=layer.dropout_rate)
  return LayerMap(description, keras_layers.TalkingHeadsAttention, kwargs,
                  sizes, tuple(maps + ([bias] if bias else [])))
