"""A Mesh TensorFlow model's architecture as thattn's T5Config, and back.

`t5_config(model, ...)` reads a built `mesh_tensorflow.transformer`
`Bitransformer` (T5's layout: pre-norm RMSNorm stacks whose blocks are
[self-attention, feed-forward] in the encoder and [self-attention, enc-dec
attention, feed-forward] in the decoder) and returns the `T5Config` of the
thattn model that computes the same logits. `gin_text(config)` writes the
gin config of the mtf model that computes what a thattn T5Config computes.

What both sides must agree on, and the mtf bindings that carry it:

| thattn T5Config | Mesh TensorFlow |
|---|---|
| d_model | `Unitransformer.d_model` |
| vocab_size | rows of `shared/embedding` (`Unitransformer.vocab_divisor` pads it; thattn writes 1) |
| num_layers, num_decoder_layers | blocks of `encoder/` and `decoder/make_layer_stack` |
| d_ff, activation, gated_feed_forward | `DenseReluDense.hidden_size`, `.activation` ("relu"; "gelu" is the tanh form; ["gelu", "linear"] gated) |
| *_attention (one or per layer) | the attention layers, through `thattn.mtf.weight_maps` |
| relative_num_buckets | `relative_attention_num_buckets`, with `relative_attention_type = "bias_shared"` on every self-attention layer (mtf's max distance is fixed at 128) |
| tie_embeddings | `Unitransformer.shared_embedding_and_softmax_weights` (logits scaled by d_model**-0.5 when tied) |
| layer_norm_epsilon | `sublayer_rms_norm.epsilon` |
| dropout_rate | `sublayer_dropout.dropout_rate` and the layers' dropout_rate |
| stacks="decoder", prefix_lm | a Unitransformer, `utils.run.model_type` "lm", or "delimited_lm" with `Unitransformer.input_full_attention` (and `loss_on_targets_only`) |

Anything else (absolute positions, separate encoder and decoder
embeddings, other sublayers, per-layer relative biases, feed-forward
biases, other layer classes, head groups) is a ValueError naming it.
"""

import dataclasses

from thattn import models
from thattn.core import variants
from thattn.mtf import compat
from thattn.mtf import layers as mtf_layers
from thattn.mtf import weight_maps

mtf = compat.import_mesh_tensorflow()
_tl = mtf_layers.transformer_layers
transformer = compat.import_transformer().transformer

# T5Config.stacks -> mtf's utils.run.model_type.
_MODEL_TYPES = {"encoder_decoder": "bitransformer", "decoder": "lm",
                "encoder": "aligned"}
# mtf's _relative_position_bucket has max_distance=128 and no setting for it.
MTF_MAX_DISTANCE = 128
_MTF_LAYERS = "mesh_tensorflow.transformer.transformer_layers"
_ACTIVATIONS = {  # mtf DenseReluDense.activation -> (thattn, gated)
    "relu": ("relu", False), "gelu": ("gelu_approximate", False),
    ("relu", "linear"): ("relu", True),
    ("gelu", "linear"): ("gelu_approximate", True)}


@dataclasses.dataclass(frozen=True)
class Block:
  """One block of a stack: its mtf layers by role (None where absent)."""
  self_attention: object
  cross_attention: object
  feed_forward: object


def _refuse(what, expected):
  raise ValueError(f"Mesh TensorFlow model: {what}; thattn's converter "
                   f"expects {expected}.")


def _scope(stack_name):
  """The gin scope of a stack's bindings: a Bitransformer's stacks are
  scoped `encoder/` and `decoder/`; a Unitransformer's are unscoped."""
  return f"{stack_name}/" if stack_name in ("encoder", "decoder") else ""


def _is_attention(layer, enc_dec):
  # Exact classes: mtf's other attention layers (LocalSelfAttention, ...)
  # subclass these and compute something else.
  return type(layer) in (  # pylint: disable=unidiomatic-typecheck
      (_tl.EncDecAttention, _tl.TalkingHeadsEncDecAttention,
       _tl.GeneralBilinearEncDecAttention,
       mtf_layers.GroupedTalkingHeadsEncDecAttention) if enc_dec else
      (_tl.SelfAttention, _tl.TalkingHeadsSelfAttention,
       _tl.GeneralBilinearSelfAttention,
       mtf_layers.GroupedTalkingHeadsSelfAttention))


def blocks(stack_name, unitransformer, *, decoder):
  """The stack's layers grouped into `Block`s, refusing other layouts."""
  layers = list(unitransformer.layer_stack.layers)
  roles = ("self", "cross", "ff") if decoder else ("self", "ff")
  expected = ("[self-attention, enc-dec attention, DenseReluDense]" if decoder
              else "[self-attention, DenseReluDense]")
  if not layers or len(layers) % len(roles):
    _refuse(f"{stack_name} has {len(layers)} layers "
            f"{[type(l).__name__ for l in layers]}",
            f"blocks of {expected}")
  result = []
  for start in range(0, len(layers), len(roles)):
    group = dict(zip(roles, layers[start:start + len(roles)]))
    checks = {"self": _is_attention(group["self"], False),
              "cross": _is_attention(group.get("cross"), True)
                       if decoder else True,
              "ff": type(group["ff"]) is _tl.DenseReluDense}  # pylint: disable=unidiomatic-typecheck
    bad = [role for role, ok in checks.items() if not ok]
    if bad:
      layer = group[bad[0]]
      _refuse(f"{_scope(stack_name)}make_layer_stack.layers: layer "
              f"{layer.name!r} is a {type(layer).__name__}",
              f"blocks of {expected}")
    result.append(Block(group["self"], group.get("cross"), group["ff"]))
  return result


# The sublayers of mtf's two LayerStack layouts (each a pre-norm block), and
# the scopes of their norms' scales: (before each layer, at the stack's end).
# RMS_NORM is mtf's default stack (T5 1.1, mT5). LEGACY is the stack mtf
# builds when `LayerStack.dropout_rate` and `LayerStack.norm_epsilon` are
# bound, as in the released T5 1.0 checkpoints' operative configs: the same
# computation under the scopes `layer_norm` and `final_layer_norm`, with the
# stack's own dropout rate. (mtf stores that norm_epsilon but never reads it:
# its legacy norm is `sublayer_rms_norm` with its own epsilon binding.)
RMS_NORM, LEGACY = "rms_norm", "legacy"
NORM_SCOPES = {RMS_NORM: ("rms_norm", "rms_norm"),
               LEGACY: ("layer_norm", "final_layer_norm")}
_SUBLAYERS = {
    RMS_NORM: {
        "sublayers_initial": [transformer.sublayer_dropout],
        "sublayers_per_layer": [transformer.sublayer_rms_norm,
                                transformer.sublayer_call_layer,
                                transformer.sublayer_dropout,
                                transformer.sublayer_residual],
        "sublayers_final": [transformer.sublayer_rms_norm,
                            transformer.sublayer_dropout]},
    LEGACY: {
        "sublayers_initial": [transformer.sublayer_legacy_dropout],
        "sublayers_per_layer": [transformer.sublayer_legacy_rms_norm,
                                transformer.sublayer_call_layer,
                                transformer.sublayer_legacy_dropout,
                                transformer.sublayer_residual],
        "sublayers_final": [transformer.sublayer_legacy_final_rms_norm,
                            transformer.sublayer_legacy_dropout]}}


def _names(functions):
  return [getattr(f, "__name__", f) for f in functions]


def stack_layout(stack_name, unitransformer):
  """RMS_NORM or LEGACY: which of mtf's pre-norm stacks the built LayerStack
  is, read from its sublayer functions; anything else is refused, naming
  the binding."""
  stack = unitransformer.layer_stack
  if type(stack) is not transformer.LayerStack:  # pylint: disable=unidiomatic-typecheck
    _refuse(f"{stack_name}/make_layer_stack.layer_stack_cls = "
            f"{type(stack).__name__}", "LayerStack")
  got = {name: list(getattr(stack, "_" + name) or [])
         for name in _SUBLAYERS[RMS_NORM]}
  for layout, expected in _SUBLAYERS.items():
    if got == expected:
      return layout
  # Legacy mode ignores the sublayer bindings, so only a default stack can
  # differ: name its first differing binding.
  name = next(n for n, f in _SUBLAYERS[RMS_NORM].items() if got[n] != f)
  _refuse(f"{stack_name}/LayerStack.{name} = {_names(got[name])}",
          f"{_names(_SUBLAYERS[RMS_NORM][name])} (T5's pre-norm block), or "
          "LayerStack.dropout_rate and norm_epsilon bound (T5 1.0's legacy "
          "stack)")


def model_layout(model):
  """(RMS_NORM or LEGACY, the legacy stacks' dropout rate or None) of an mtf
  Bitransformer or Unitransformer; its stacks must agree."""
  units = ({"encoder": model.encoder, "decoder": model.decoder}
           if isinstance(model, transformer.Bitransformer)
           else {model.name: model})
  layouts = {name: stack_layout(name, unit) for name, unit in units.items()}
  if len(set(layouts.values())) > 1:
    _refuse(f"the stacks' LayerStacks differ: {layouts}",
            "one layout per model (LayerStack.dropout_rate and norm_epsilon "
            "bound for every stack or for none)")
  layout = layouts.popitem()[1]
  if layout != LEGACY:
    return layout, None
  rates = {f"{_scope(name)}LayerStack.dropout_rate":
               unit.layer_stack.dropout_rate for name, unit in units.items()}
  if len(set(rates.values())) > 1:
    _refuse(f"{rates}", "one dropout rate per model")
  return layout, rates.popitem()[1]


def norm_scopes(stack_name, unitransformer):
  """(scope of each layer's norm, scope of the final norm) of the stack."""
  return NORM_SCOPES[stack_layout(stack_name, unitransformer)]


def check_stack(stack_name, unitransformer, language_model=False):
  """Refuses sublayers, positions and options thattn's T5 lacks; returns
  the stack's layout (RMS_NORM or LEGACY). A `language_model` (a
  decoder-only Unitransformer) may be a prefix LM."""
  layout = stack_layout(stack_name, unitransformer)
  options = {
      "positional_embedding": (unitransformer.positional_embedding, False),
      "sinusoid_positional_embedding": (
          unitransformer.sinusoid_positional_embedding, False),
      "ensemble": (unitransformer.ensemble_dim, None),
      "token_dropout_rate": (unitransformer.token_dropout_rate, 0.0)}
  if not language_model:  # T5Config.prefix_lm needs stacks="decoder"
    options["input_full_attention"] = (unitransformer.input_full_attention,
                                       False)
  for name, (value, wanted) in options.items():
    if value != wanted:
      _refuse(f"{stack_name}/Unitransformer.{name} = {value!r}",
              f"{wanted!r} (thattn's T5 has relative positions only)")
  return layout


def feed_forward_settings(block_list, stack_name):
  """(d_ff, activation, gated) shared by every DenseReluDense of a stack."""
  settings = set()
  for block in block_list:
    ff = block.feed_forward
    if ff.use_bias:
      _refuse(f"{stack_name} layer {ff.name!r} has use_bias=True",
              "DenseReluDense.use_bias = False (T5 has no biases)")
    key = (tuple(ff.activation) if isinstance(ff.activation, (list, tuple))
           else ff.activation)
    if key not in _ACTIVATIONS:
      _refuse(f"{stack_name} layer {ff.name!r} has activation {key!r}",
              f"one of {list(_ACTIVATIONS)}")
    settings.add((ff.hidden_size,) + _ACTIVATIONS[key])
  return settings


def attention_config(layer, d_model):
  """The thattn AttentionConfig of an mtf attention layer."""
  spec = weight_maps.layer_map(layer, d_model=d_model)
  kwargs = spec.keras_kwargs
  if kwargs.get("num_head_groups", 1) > 1:
    _refuse(f"layer {layer.name!r} has {kwargs['num_head_groups']} head "
            "groups", "no heads dim shared by all three head lists (thattn's "
            "model configs have no head groups)")
  if spec.keras_class is weight_maps.keras_layers.GeneralBilinearAttention:
    return models.AttentionConfig(
        variant=_variant_of(reads_memory_width=True),
        num_heads=kwargs["num_heads"])
  if spec.keras_class is weight_maps.keras_layers.MultiHeadAttention:
    return models.AttentionConfig(num_heads=kwargs["num_heads"],
                                  key_dim=kwargs["key_dim"])
  variant = _variant_of(pre_softmax=kwargs["project_logits"],
                        post_softmax=kwargs["project_weights"])
  heads = {} if not variants.get(variant).takes_head_counts else dict(
      num_key_heads=kwargs["num_key_heads"],
      num_value_heads=kwargs["num_value_heads"],
      dynamic_projections=tuple(kwargs["dynamic_projections"]))
  return models.AttentionConfig(
      variant=variant, num_heads=kwargs["num_heads"],
      key_dim=kwargs["key_dim"], value_dim=kwargs["value_dim"], **heads)


def _variant_of(pre_softmax=False, post_softmax=False,
                reads_memory_width=False):
  """The first registered variant (a built-in one) with these projections
  and a Mesh TensorFlow layer, whose options fix no dynamic projections:
  the dynamic ones are read from the layer itself."""
  for record in variants.all_variants():
    if (record.mtf_layer is not None and
        "dynamic_projections" not in record.options and
        (record.pre_softmax, record.post_softmax,
         record.reads_memory_width) == (pre_softmax, post_softmax,
                                        reads_memory_width)):
      return record.name
  raise AssertionError("every mtf attention layer has a built-in variant")


def _one_or_per_layer(configs):
  return configs[0] if len(set(configs)) == 1 else tuple(configs)


def check_relative_bias(stack_name, block_list):
  """The buckets of a stack whose self-attention layers share one bias."""
  kinds = {b.self_attention.relative_attention_type for b in block_list}
  if kinds != {"bias_shared"}:
    _refuse(f"{stack_name}'s self-attention layers have "
            f"relative_attention_type {sorted(map(str, kinds))}",
            "'bias_shared' on every one (thattn's T5 shares one relative "
            "position bias per stack)")
  buckets = {b.self_attention.relative_attention_num_buckets
             for b in block_list}
  if len(buckets) > 1:
    _refuse(f"{stack_name} has relative_attention_num_buckets "
            f"{sorted(buckets)}", "one value per model")
  return buckets.pop()


def _unitransformer_config(model, **common):
  """The one-stack T5Config of an mtf Unitransformer ("lm" or "aligned")."""
  name = model.name
  check_stack(name, model, language_model=model.autoregressive)
  block_list = blocks(name, model, decoder=False)
  settings = feed_forward_settings(block_list, name)
  if len(settings) > 1:
    _refuse(f"{name}'s feed-forward layers differ: (d_ff, activation, "
            f"gated) {sorted(settings)}", "one of each per model")
  (d_ff, activation, gated), = settings
  d_model = model.model_dim.size
  attention = _one_or_per_layer(
      [attention_config(b.self_attention, d_model) for b in block_list])
  stack = "decoder" if model.autoregressive else "encoder"
  return models.T5Config(
      d_model=d_model, num_layers=len(block_list), d_ff=d_ff,
      **{f"{stack}_self_attention": attention}, activation=activation,
      gated_feed_forward=gated,
      tie_embeddings=model.shared_embedding_and_softmax_weights,
      relative_num_buckets=check_relative_bias(name, block_list),
      relative_max_distance=MTF_MAX_DISTANCE, stacks=stack,
      prefix_lm=model.input_full_attention, **common)


def t5_config(model, *, vocab_size, layer_norm_epsilon, dropout_rate):
  """The T5Config of an mtf Bitransformer or Unitransformer (see the module
  docstring): an autoregressive Unitransformer is a decoder-only config, a
  non-autoregressive one an encoder-only config."""
  common = dict(vocab_size=vocab_size, layer_norm_epsilon=layer_norm_epsilon,
                dropout_rate=dropout_rate)
  if type(model) is transformer.Unitransformer:  # pylint: disable=unidiomatic-typecheck
    return _unitransformer_config(model, **common)
  if not isinstance(model, transformer.Bitransformer):
    _refuse(f"the model is a {type(model).__name__}",
            "a Bitransformer (T5's encoder-decoder) or a Unitransformer")
  if not model.shared_embedding:
    _refuse("Bitransformer.shared_embedding = False",
            "True (thattn's T5 has one token embedding)")
  d_model = model.encoder.model_dim.size
  stacks = {}
  for name, unit, decoder in (("encoder", model.encoder, False),
                              ("decoder", model.decoder, True)):
    check_stack(name, unit)
    stacks[name] = blocks(name, unit, decoder=decoder)
  buckets = {check_relative_bias(name, b) for name, b in stacks.items()}
  settings = set().union(*(feed_forward_settings(b, name)
                           for name, b in stacks.items()))
  if len(buckets) > 1 or len(settings) > 1:
    _refuse(f"the stacks differ in buckets {sorted(buckets)} or feed-forward "
            f"(d_ff, activation, gated) {sorted(settings)}",
            "one of each per model")
  (d_ff, activation, gated), = settings
  attention = lambda layers: _one_or_per_layer(
      [attention_config(layer, d_model) for layer in layers])
  return models.T5Config(
      d_model=d_model, num_layers=len(stacks["encoder"]),
      num_decoder_layers=len(stacks["decoder"]), d_ff=d_ff,
      encoder_self_attention=attention(
          [b.self_attention for b in stacks["encoder"]]),
      decoder_self_attention=attention(
          [b.self_attention for b in stacks["decoder"]]),
      encoder_decoder_attention=attention(
          [b.cross_attention for b in stacks["decoder"]]),
      activation=activation, gated_feed_forward=gated,
      tie_embeddings=model.decoder.shared_embedding_and_softmax_weights,
      relative_num_buckets=buckets.pop(),
      relative_max_distance=MTF_MAX_DISTANCE, **common)


def check_vocab_embedding():
  """Refuses vocab embeddings other than mtf's plain VocabEmbedding (gin)."""
  cls = transformer.get_vocab_embedding_cls()
  if cls is not transformer.VocabEmbedding:
    _refuse(f"get_vocab_embedding_cls.cls = {cls.__name__}",
            "VocabEmbedding (a plain embedding table)")


# ---- thattn T5Config -> gin ---------------------------------------------------


def _gin_value(value):
  """A Python value as gin literal text; classes as @references."""
  if isinstance(value, type):
    module = (_MTF_LAYERS if value.__module__.endswith("transformer_layers")
              else "thattn")
    return f"@{module}.{value.__name__}"
  if isinstance(value, dict):
    return "{" + ", ".join(f"{_gin_value(k)}: {_gin_value(v)}"
                           for k, v in value.items()) + "}"
  if isinstance(value, (list, tuple)):
    items = ", ".join(_gin_value(v) for v in value)
    return (f"({items},)" if len(value) == 1 else f"({items})"
            ) if isinstance(value, tuple) else f"[{items}]"
  return repr(value)


def mtf_attention(attention, *, d_model, enc_dec, buckets, dropout_rate):
  """(mtf layer class, its kwargs) computing what `attention` computes."""
  d_k, d_v = attention.head_dims(d_model)
  h, h_k, h_v = (attention.num_heads, attention.key_heads,
                 attention.value_heads)
  relative = {} if enc_dec else dict(relative_attention_type="bias_shared",
                                     relative_attention_num_buckets=buckets)
  common = dict(dropout_rate=dropout_rate, **relative)
  record = variants.get(attention.variant)
  if record.mtf_layer is None:
    raise ValueError(f"Attention variant {record.name!r} has no Mesh "
                     "TensorFlow layer (its registry record names none), so "
                     "it cannot be translated to Mesh TensorFlow.")
  if record.reads_memory_width:
    cls = (_tl.GeneralBilinearEncDecAttention if enc_dec else
           _tl.GeneralBilinearSelfAttention)
    return cls, dict(heads_dims=[("heads", h)], **common)
  if not record.takes_head_counts and d_k == d_v:
    cls = _tl.EncDecAttention if enc_dec else _tl.SelfAttention
    return cls, dict(num_heads=h, key_value_size=d_k, **common)
  # mtf makes P_l (P_w) exactly when the key (value) heads and the softmax
  # heads have different names.
  projects_logits = record.pre_softmax
  projects_weights = record.post_softmax
  dynamic = record.options.get("dynamic_projections",
                               attention.dynamic_projections)
  cls = (_tl.TalkingHeadsEncDecAttention if enc_dec else
         _tl.TalkingHeadsSelfAttention)
  return cls, dict(
      key_heads_dims=[("key_heads" if projects_logits else "heads", h_k)],
      softmax_heads_dims=[("heads", h)],
      value_heads_dims=[("value_heads" if projects_weights else "heads", h_v)],
      key_size=d_k, value_size=d_v, dynamic_projections=list(dynamic),
      **common)


def _stack_layers(config, *, self_attention, cross_attention, count):
  """make_layer_stack's `layers`: [[class, name, kwargs], ...] per block.

  Each block: the `self_attention` type's layer, the `cross_attention`
  type's (None: none), a DenseReluDense; `count` blocks.
  """
  activation, gated = config.activation, config.gated_feed_forward
  if activation not in ("relu", "gelu_approximate"):
    _refuse(f"thattn activation {activation!r}", "'relu' or "
            "'gelu_approximate' (mtf's gelu is the tanh form)")
  mtf_activation = {"relu": "relu", "gelu_approximate": "gelu"}[activation]
  feed_forward = dict(hidden_size=config.d_ff, dropout_rate=config.dropout_rate,
                      activation=[mtf_activation, "linear"] if gated
                      else mtf_activation)
  kinds = ((self_attention, False),) + (
      ((cross_attention, True),) if cross_attention else ())
  layers = []
  for index in range(count):
    for role, (name, enc_dec) in enumerate(kinds):
      cls, kwargs = mtf_attention(
          config.layer_attention(name, index), d_model=config.d_model,
          enc_dec=enc_dec, buckets=config.relative_num_buckets,
          dropout_rate=config.dropout_rate)
      layers.append([cls, f"block_{index:03d}/layer_{role:03d}", kwargs])
    layers.append([_tl.DenseReluDense, f"block_{index:03d}/layer_{len(kinds):03d}",
                   feed_forward])
  return layers


def _stack_lines(scope, layers, config, layer_stack):
  """The gin lines of one stack: its layers, and the legacy bindings."""
  lines = []
  if layer_stack == LEGACY:
    # Binding both puts mtf's LayerStack in legacy mode (see NORM_SCOPES).
    lines += [f"{scope}LayerStack.dropout_rate = {config.dropout_rate!r}",
              f"{scope}LayerStack.norm_epsilon = "
              f"{config.layer_norm_epsilon!r}"]
  lines += [f"{scope}make_layer_stack.block_scope = False",
            f"{scope}make_layer_stack.num_layers = 1",
            f"{scope}make_layer_stack.layers = ["]
  return lines + [f"    {_gin_value(layer)}," for layer in layers] + ["]"]


def gin_text(config, *, layer_stack=RMS_NORM):
  """The operative gin config of the mtf model for a T5Config: a
  Bitransformer, or a Unitransformer ("lm" for a decoder-only config,
  "aligned" for an encoder-only one).

  Every layer is listed with its own arguments (`make_layer_stack` with
  `block_scope=False` and explicit `block_XXX/layer_YYY` names), so per-layer
  attention configs survive and the variable names are T5's. `layer_stack`
  is RMS_NORM (mtf's default stack) or LEGACY (T5 1.0's: norms scoped
  `layer_norm` and `final_layer_norm`).
  """
  if layer_stack not in NORM_SCOPES:
    raise ValueError(f"layer_stack={layer_stack!r}; expected one of "
                     f"{sorted(NORM_SCOPES)}.")
  if not isinstance(config, models.T5Config):
    raise ValueError(f"Mesh TensorFlow export needs a T5Config, got "
                     f"{type(config).__name__} (BERT and ALBERT have no mtf "
                     "counterpart here).")
  if config.relative_max_distance != MTF_MAX_DISTANCE:
    _refuse(f"thattn relative_max_distance={config.relative_max_distance}",
            f"{MTF_MAX_DISTANCE} (mtf's fixed relative position distance)")
  model_type = "delimited_lm" if config.prefix_lm else _MODEL_TYPES[
      config.stacks]
  lines = [
      f"# Written by thattn: the Mesh TensorFlow {model_type} that computes",
      "# what the thattn T5 model computes.",
      f"import {_MTF_LAYERS}", "import thattn.mtf.layers", "",
      f"utils.run.model_type = {model_type!r}",
      f"Unitransformer.d_model = {config.d_model}",
      "Unitransformer.positional_embedding = False",
      "Unitransformer.shared_embedding_and_softmax_weights = "
      f"{config.tie_embeddings}",
      "# thattn's vocabulary is not padded to a multiple of 128.",
      "Unitransformer.vocab_divisor = 1",
      f"sublayer_rms_norm.epsilon = {config.layer_norm_epsilon!r}",
      f"sublayer_dropout.dropout_rate = {config.dropout_rate!r}"]
  stacks = {  # gin scope: (self-attention, enc-dec attention, blocks)
      "encoder_decoder": {
          "encoder/": ("encoder_self_attention", None, config.num_layers),
          "decoder/": ("decoder_self_attention", "encoder_decoder_attention",
                       config.decoder_layers)},
      "decoder": {"": ("decoder_self_attention", None,
                       config.decoder_layers)},
      "encoder": {"": ("encoder_self_attention", None, config.num_layers)},
  }[config.stacks]
  if config.stacks == "encoder_decoder":
    lines.append("Bitransformer.shared_embedding = True")
  if config.prefix_lm:  # the T5 paper's prefix LM, as mtf trains it
    lines += ["Unitransformer.input_full_attention = True",
              "Unitransformer.loss_on_targets_only = True"]
  for scope, (self_attention, cross_attention, count) in stacks.items():
    layers = _stack_layers(config, self_attention=self_attention,
                           cross_attention=cross_attention, count=count)
    lines += _stack_lines(scope, layers, config, layer_stack)
  return "\n".join(lines) + "\n"
