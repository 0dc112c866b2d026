"""The attention variants: one record each, and the one registry of them.

A `Variant` says everything thattn needs to know about one attention
variant: its name, the paper it comes from, the layer class that computes
it on each Keras front end and the options it fixes, which head-mixing
projections it has (and so which head counts it takes), whether a
multi-head model starts it at its own outputs, how its parameters and
multiplies are counted, and its Mesh TensorFlow layer where it has one.

Every consumer reads the registry, and nothing else in thattn switches on
a variant's name: `thattn-train --attention`, `create_model(attention=...)`
and the model configs, the presets, `thattn-complexity`, the converters'
`--attention`, the Mesh TensorFlow translation, the ablation grid and the
variants table of docs/architecture.md (a test holds the table to it).

A user's module adds a variant with `register(Variant(...))`; from then on
it is accepted wherever a built-in one is (`thattn-train
--attention_module=my_module --attention=my_variant`). A variant is either
an existing layer with options, or its own head mixes: functions over an
ops namespace (`keras.ops` on Keras 3; `thattn.ops.tf_ops.TF_OPS`, the
same names in TensorFlow, on tf_keras) that turn the logits J into L and
the weights W into U, with weights of their own (`Weight`), which
`HeadMixingAttention` on each front end computes
(docs/examples/custom_variant.py).

Plain Python: the layers are named as "module:Class" strings and imported
when first built, so reading the registry needs no framework.
"""

import dataclasses
import importlib
import types
from typing import Callable, Mapping, Optional

from thattn.core import attention_spec
from thattn.core import validation

# The sizes a `Weight`'s axes may name, as the layer knows them (the
# logical axes of thattn.core.dims, which the sharding rules map).
WEIGHT_AXES = ("key_heads", "heads", "value_heads", "d_k", "d_v", "d_model")
# The layer that computes a variant given by its head mixes.
HEAD_MIXING_LAYER = "HeadMixingAttention"

# The Keras front ends a variant's layers are looked up on.
FRONT_ENDS = ("tf_keras", "keras3")
_FRONT_END_MODULES = {"tf_keras": "thattn.layers", "keras3": "thattn.keras3"}


@dataclasses.dataclass(frozen=True)
class Weight:
  """A weight of a variant's head mixes, beyond P_q, P_k, P_v and P_o.

  Attributes:
    name: the weight's name in the layer (and so in checkpoints).
    axes: its shape, as sizes of the layer from `WEIGHT_AXES` (e.g.
      `("heads", "heads")` is [h, h]); they are also its logical axes.
    initializer: a Keras initializer name both fronts know ("zeros",
      "ones", "identity", "glorot_uniform", ...).
  """
  name: str
  axes: tuple
  initializer: str = "zeros"

  def __post_init__(self):
    object.__setattr__(self, "axes", tuple(self.axes))
    unknown = [axis for axis in self.axes if axis not in WEIGHT_AXES]
    if unknown or not self.axes:
      raise ValueError(f"Weight {self.name!r}: axes must be sizes from "
                       f"{list(WEIGHT_AXES)}, got {list(self.axes)}.")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One attention variant.

  Attributes:
    name: what `--attention` and `create_model(attention=...)` take.
    source: the paper (and section) it comes from.
    summary: one line for the docs' table and the flags' help.
    layer: the layer class that computes it: a class name, looked up on
      each front end's module (`thattn.layers`, `thattn.keras3`), or a
      mapping {front end: "module:Class"} for a variant whose layers live
      elsewhere (a user's). None for a variant given by its head mixes
      (`HeadMixingAttention`).
    options: the constructor arguments the variant fixes, on top of the
      sizes a model config gives (e.g. `{"project_weights": False}`).
    pre_softmax: it has P_l[h_k, h] (the logits projection). Without it,
      h_k = h.
    post_softmax: it has P_w[h, h_v] (the weights projection). Without it,
      h_v = h. A variant with either takes `num_key_heads` and
      `num_value_heads`; a config's `dynamic_projections` are passed on to
      it unless `options` sets them.
    reads_memory_width: its heads read the whole memory (general bilinear
      attention, Section 6): it takes no key_dim and no biases, and d_k =
      d_v = d_model.
    identity_start: a multi-head model's weights, with its extra weights at
      the identity, give the multi-head model's outputs: what the
      converters' `--attention` can start from a released checkpoint.
    takes_layer_index: its layer computes something that depends on the
      layer's depth and takes `layer_index` (0-based), which the models
      pass block by block (differential attention's lambda_init).
    takes_norm_epsilon: its layer normalizes inside the attention and
      takes `norm_epsilon`, which the models set to their own norms'
      (DiffLlama's heads' RMSNorm uses its rms_norm_eps).
    counted_as: the `thattn.core.complexity.AttentionShape` arguments that
      count its parameters and multiplies (the layer's form and options),
      or None where thattn has no counts for it.
    mtf_layer: the Mesh TensorFlow layer class (of
      `mesh_tensorflow.transformer.transformer_layers`) that computes it in
      self-attention, or None where it has none.
    mix_logits: `(ops, weights, J) -> L`: L[b, h, n, m] from the logits
      J[b, h_k, n, m], in the ops namespace `ops`, with `weights` the
      variant's own {name: weight}; None keeps L = J.
    mix_weights: `(ops, weights, W) -> U`: U[b, h_v, n, m] from the
      softmax weights W[b, h, n, m]; None keeps U = W.
    weights: the `Weight` records the head mixes read.
  """
  name: str
  source: str
  summary: str
  layer: object = None
  options: Mapping[str, object] = dataclasses.field(default_factory=dict)
  pre_softmax: bool = False
  post_softmax: bool = False
  reads_memory_width: bool = False
  identity_start: bool = False
  takes_layer_index: bool = False
  takes_norm_epsilon: bool = False
  counted_as: Optional[Mapping[str, object]] = None
  mtf_layer: Optional[str] = None
  mix_logits: Optional[Callable] = None
  mix_weights: Optional[Callable] = None
  weights: tuple = ()

  def __post_init__(self):
    owner = f"Variant {self.name!r}"
    if not isinstance(self.name, str) or not self.name.isidentifier():
      raise ValueError(f"A variant's name must be a Python identifier (it "
                       f"names flags, presets and run folders), got "
                       f"{self.name!r}.")
    mixes = self.mix_logits is not None or self.mix_weights is not None
    if mixes == (self.layer is not None):
      raise ValueError(f"{owner}: give either layer (a class that computes "
                       "it) or its head mixes (mix_logits, mix_weights), "
                       "not both or neither.")
    if self.weights and not mixes:
      raise ValueError(f"{owner}: weights are read by head mixes; a variant "
                       "with a layer of its own creates its weights itself.")
    if any(not isinstance(weight, Weight) for weight in self.weights):
      raise ValueError(f"{owner}: weights must be "
                       f"thattn.core.variants.Weight records, got "
                       f"{self.weights!r}.")
    object.__setattr__(self, "weights", tuple(self.weights))
    if isinstance(self.layer, Mapping):
      missing = [front for front in FRONT_ENDS if front not in self.layer]
      if missing or any(":" not in str(path) for path in self.layer.values()):
        raise ValueError(
            f"{owner}: layer must map each front end {list(FRONT_ENDS)} to "
            f"a 'module:Class' path, got {dict(self.layer)!r}.")
    elif not mixes and not isinstance(self.layer, str):
      raise ValueError(f"{owner}: layer must be a class name or a mapping "
                       f"{{front end: 'module:Class'}}, got {self.layer!r}.")
    # Frozen, and a read-only view, so a registered record cannot change.
    object.__setattr__(self, "options",
                       types.MappingProxyType(dict(self.options)))

  @property
  def takes_head_counts(self):
    """Whether the layer takes h_k and h_v (it has P_l or P_w)."""
    return self.pre_softmax or self.post_softmax

  @property
  def takes_dynamic_projections(self):
    """Whether a config's `dynamic_projections` are passed to the layer."""
    return self.takes_head_counts and "dynamic_projections" not in self.options

  def layer_class(self, front_end):
    """The layer class on `front_end` ("tf_keras" or "keras3"), imported."""
    validation.one_of("front_end", front_end, FRONT_ENDS,
                      owner=f"Variant {self.name!r}")
    if isinstance(self.layer, Mapping):
      module, name = self.layer[front_end].split(":")
    else:
      module = _FRONT_END_MODULES[front_end]
      name = HEAD_MIXING_LAYER if self.layer is None else self.layer
    return getattr(importlib.import_module(module), name)

  def check_heads(self, num_heads, num_key_heads, num_value_heads, *, owner):
    """h_k and h_v (None meaning h) against the projections it has."""
    h = num_heads
    h_k, h_v = num_key_heads or h, num_value_heads or h
    if not self.pre_softmax and h_k != h:
      raise ValueError(
          f"{owner}: {self.name} has no P_l[h_k, h], so num_key_heads="
          f"{num_key_heads} must equal num_heads={h} (or be None).")
    if not self.post_softmax and h_v != h:
      raise ValueError(
          f"{owner}: {self.name} has no P_w[h, h_v], so num_value_heads="
          f"{num_value_heads} must equal num_heads={h} (or be None).")


_REGISTRY = {}


def register(variant):
  """Adds `variant` to the registry and returns it; a name is registered once
  (registering the same record again, as a reimported module does, is
  allowed)."""
  if not isinstance(variant, Variant):
    raise ValueError(f"register takes a thattn.core.variants.Variant, got "
                     f"{type(variant).__name__}.")
  known = _REGISTRY.get(variant.name)
  if known is not None and known != variant:
    raise ValueError(f"Attention variant {variant.name!r} is already "
                     f"registered ({known.source}); choose another name, or "
                     "unregister it first to redefine it.")
  _REGISTRY[variant.name] = variant
  return variant


def unregister(name):
  """Removes a variant registered from outside the package (a notebook or a
  test redefining one); the built-in variants stay."""
  if name in _BUILT_IN:
    raise ValueError(f"{name!r} is a built-in attention variant; only "
                     "variants registered from outside thattn can be "
                     "removed.")
  get(name)
  del _REGISTRY[name]


def get(name, *, owner=None):
  """The registered variant called `name`; the error lists them all."""
  validation.one_of("attention variant", name, names(), owner=owner)
  return _REGISTRY[name]


def names():
  """Every registered variant's name, the built-in ones first."""
  return tuple(_REGISTRY)


def all_variants():
  """Every registered variant, the built-in ones first."""
  return tuple(_REGISTRY.values())


def identity_starts():
  """The names a multi-head model (a released checkpoint) can start."""
  return tuple(v.name for v in _REGISTRY.values() if v.identity_start)


def converted_attention(attention, held, *, where):
  """The variant a checkpoint holding `held` attention converts into when
  `attention` is asked for (None: `held`, as it is). A multi-head
  checkpoint starts any variant with an identity start at its own outputs;
  a checkpoint of another variant (a DiffLlama folder's differential
  attention) converts only as itself."""
  if attention is None:
    return held
  get(attention, owner=f"attention={attention!r}")
  if held == "multi_head":
    if attention not in identity_starts():
      raise ValueError(
          f"attention={attention!r}: a multi-head checkpoint ({where}) "
          f"starts only {list(identity_starts())} at its own outputs; "
          f"{attention} has weights multi-head attention has no values "
          "for.")
  elif attention != held:
    raise ValueError(
        f"attention={attention!r}: {where} holds {held} attention, which "
        f"converts only as itself (attention={held!r}, or none given).")
  return attention


def sized(name):
  """`name` if its variant's heads have a size d_k (a fixed head size can be
  given to every variant but those reading the memory width)."""
  if get(name).reads_memory_width:
    raise ValueError(
        f"Attention variant {name!r} has no head size (its heads read the "
        f"whole memory width); a fixed head size needs one of "
        f"{[v.name for v in all_variants() if not v.reads_memory_width]}.")
  return name


def import_modules(module_names):
  """Imports each of a user's modules that register variants (the
  `--attention_module` flag); a module that cannot be imported is named."""
  for module_name in module_names:
    try:
      importlib.import_module(module_name)
    except ImportError as error:
      raise ValueError(
          f"Could not import the attention module {module_name!r} ({error}); "
          "it must be importable (on PYTHONPATH, or installed).") from error


def make_attention(front_end, variant, num_heads, key_dim, *, layer_index=0,
                   norm_epsilon=None, **kwargs):
  """The named variant's layer on `front_end` ("tf_keras" or "keras3") with
  h heads of size d_k and `kwargs` for its constructor; a variant that
  reads the memory width (general bilinear) ignores `key_dim`, one that is
  the same at every depth ignores `layer_index` (the block's 0-based depth
  in a model), and one without a norm of its own ignores `norm_epsilon` (a
  model's norms' epsilon; None: the layer's default)."""
  record = get(variant)
  cls = record.layer_class(front_end)
  if record.layer is None:  # HeadMixingAttention reads the record by name
    kwargs["variant"] = record.name
  if record.takes_layer_index:
    kwargs["layer_index"] = layer_index
  if record.takes_norm_epsilon and norm_epsilon is not None:
    kwargs["norm_epsilon"] = norm_epsilon
  if record.reads_memory_width:
    return cls(num_heads, **record.options, **kwargs)
  return cls(num_heads, key_dim, **record.options, **kwargs)


_PAPER = "Shazeer et al. (2020)"

register(Variant(
    name="multi_head",
    source="Vaswani et al. (2017), Section 3.2.2; Shazeer et al. (2020), "
           "Section 3.3",
    summary="multi-head attention: h heads, one softmax each",
    layer="MultiHeadAttention",
    identity_start=True,
    counted_as={"variant": "multi_head"},
    mtf_layer="SelfAttention"))
register(Variant(
    name="talking_heads",
    source=f"{_PAPER}, Section 4",
    summary="P_l[h_k, h] mixes the logits' heads, P_w[h, h_v] the weights'",
    layer="TalkingHeadsAttention",
    pre_softmax=True, post_softmax=True, identity_start=True,
    counted_as={"variant": "talking_heads"},
    mtf_layer="TalkingHeadsSelfAttention"))
register(Variant(
    name="project_logits",
    source=f"{_PAPER}, Section 7.1.3, Table 3",
    summary="talking heads before the softmax only (P_l, no P_w)",
    layer="TalkingHeadsAttention",
    options={"project_weights": False},
    pre_softmax=True, identity_start=True,
    counted_as={"variant": "talking_heads", "project_weights": False},
    mtf_layer="TalkingHeadsSelfAttention"))
register(Variant(
    name="project_weights",
    source=f"{_PAPER}, Section 7.1.3, Table 3",
    summary="talking heads after the softmax only (P_w, no P_l)",
    layer="TalkingHeadsAttention",
    options={"project_logits": False},
    post_softmax=True, identity_start=True,
    counted_as={"variant": "talking_heads", "project_logits": False},
    mtf_layer="TalkingHeadsSelfAttention"))
register(Variant(
    name="dynamic",
    source=f"{_PAPER}, Appendix A",
    summary="talking heads with all four dynamic projections",
    layer="TalkingHeadsAttention",
    options={"dynamic_projections": attention_spec.DYNAMIC_PROJECTIONS},
    pre_softmax=True, post_softmax=True, identity_start=True,
    counted_as={"variant": "talking_heads",
                "dynamic_projections": attention_spec.DYNAMIC_PROJECTIONS},
    mtf_layer="TalkingHeadsSelfAttention"))
register(Variant(
    name="general_bilinear",
    source=f"{_PAPER}, Section 6",
    summary="general bilinear multihead attention: P[d_X, d_M, h], Q[d_M, "
            "d_Y, h]",
    layer="GeneralBilinearAttention",
    reads_memory_width=True,
    counted_as={"variant": "general_bilinear"},
    mtf_layer="GeneralBilinearSelfAttention"))

# The head-interaction methods after talking heads (docs/family_sources.md).
_GATED = ("Qiu et al. (2025), Gated Attention for Large Language Models "
          "(arXiv 2505.06708)")
register(Variant(
    name="gated",
    source=f"{_GATED}, element-wise, as Qwen3-Next ships it",
    summary="multi-head attention whose output O is gated element-wise: "
            "O * sigmoid(X P_g[d_X, h, d_v])",
    layer="MultiHeadAttention",
    options={"use_gate": True},
    counted_as={"variant": "multi_head", "use_gate": True}))
register(Variant(
    name="gated_headwise",
    source=f"{_GATED}, head-wise",
    summary="multi-head attention whose output O is gated head by head: "
            "O * sigmoid(X P_g[d_X, h])",
    layer="MultiHeadAttention",
    options={"use_gate": True, "headwise_gate": True},
    counted_as={"variant": "multi_head", "use_gate": True,
                "headwise_gate": True}))

register(Variant(
    name="differential",
    source="Ye et al. (2024), Differential Transformer (arXiv 2410.05258), "
           "as transformers' DiffLlama computes it",
    summary="h softmax maps, map j minus lambda times map j + h/2: h/2 "
            "heads over values 2 d_k wide, each RMS-normalized",
    layer="DifferentialAttention",
    takes_layer_index=True,
    takes_norm_epsilon=True,
    counted_as={"variant": "differential"}))
register(Variant(
    name="dcmha",
    source="Xiao et al. (2024), Improving Transformers with Dynamically "
           "Composable Multi-Head Attention (ICML; arXiv 2405.08553), as "
           "the authors' DCFormer and DCPythia compute it",
    summary="talking heads whose head mixes, before and after the softmax, "
            "are generated for each query-key pair from both positions' "
            "inputs (rank R plus gates, around the identity)",
    layer="DynamicallyComposableAttention",
    identity_start=True,
    counted_as={"variant": "dcmha"}))

_BUILT_IN = frozenset(_REGISTRY)
