"""Model configurations: frozen dataclasses, and keyword overrides on them.

One dataclass per model family:

- `BertConfig`: BERT, and ALBERT (`embedding_size` and `share_layers`).
- `T5Config`: T5's encoder-decoder.
- `DecoderConfig`: a decoder-only language model in the GPT-2, Llama and
  GPT-NeoX (Pythia) shapes.

They hold their attention layers as `AttentionConfig` objects: BERT and
the decoder-only LM one, T5 one per attention type (encoder self, decoder
self, encoder-decoder), so the experiments of the paper's Table 4 are a
config, not a code change.

`apply_overrides(config, **overrides)` is what `create_model(preset,
**overrides)` uses. Besides the dataclass fields, it understands:

- `attention=`: a variant name (`thattn.core.variants.names()`), a dict of
  `AttentionConfig` fields, or an `AttentionConfig`, for every attention
  layer of the model;
- `num_heads`, `key_dim`, `value_dim`, `num_key_heads`, `num_value_heads`,
  `num_key_value_heads`, `dynamic_projections`: the same field on every
  attention layer;
- for T5, `encoder_self_attention=`, `decoder_self_attention=` and
  `encoder_decoder_attention=`, which take the same forms as `attention=` and
  apply after it. A variant name keeps the other fields, except that a
  variant without P_l and P_w ("multi_head", "general_bilinear") drops h_k,
  h_v and dynamic projections, which it does not have, and one whose heads
  read the whole width ("general_bilinear") drops shared key and value
  heads too. A list of those
  forms, one per layer of the stack,
  gives each layer its own config (as a converted Mesh TensorFlow model may
  need: `thattn.mtf`); the self-attention layers of one stack share its
  relative position bias, so they need one num_heads.

Bad values raise ValueError naming them, before any model is built.
"""

import dataclasses
from typing import Optional, Tuple, Union

from thattn.core import attention_spec
from thattn.core import validation
from thattn.core import variants
from thattn.ops import rotary

ATTENTION_TYPES = ("encoder_self_attention", "decoder_self_attention",
                   "encoder_decoder_attention")
# A T5Config's stacks: T5's encoder-decoder, or one stack (Mesh TensorFlow's
# Unitransformer): a decoder-only language model ("lm") or an encoder-only
# model with one output per input position ("aligned").
T5_STACKS = ("encoder_decoder", "decoder", "encoder")
# A prefix LM's second input (t5x's name), int32 [b, n]: 1 at the positions
# that attend to each other both ways (the prefix, and the position that
# reads its last token), 0 after; query i sees key j where j <= i or both
# are 1.
PREFIX_LM_INPUT = "decoder_causal_attention"
# Overrides that set one AttentionConfig field on every attention layer.
SHARED_ATTENTION_FIELDS = ("num_heads", "key_dim", "value_dim",
                           "num_key_heads", "num_value_heads",
                           "num_key_value_heads", "dynamic_projections")
# Feed-forward activations. "gelu" is the exact (erf) form of BERT and
# GPT-NeoX; "gelu_approximate" the tanh form of ALBERT v2, T5.1.1 and GPT-2;
# "silu" (x sigmoid(x)) Llama's, in its gated SwiGLU.
ACTIVATIONS = ("relu", "gelu", "gelu_approximate", "silu")
POSITION_EMBEDDINGS = ("absolute", "relative")
# A decoder-only LM's positions: a learned table added to the token
# embeddings (GPT-2), or rotary embeddings in every attention layer (Llama,
# GPT-NeoX).
DECODER_POSITIONS = ("learned", "rotary")
# The norm before each sublayer: LayerNorm with its bias (GPT-2, GPT-NeoX)
# or RMSNorm (Llama, T5).
DECODER_NORMS = ("layer_norm", "rms_norm")


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
  """One attention layer, in the arguments of `thattn.layers`.

  Attributes:
    variant: a registered variant's name (`thattn.core.variants`).
    num_heads: h, the softmax heads (the only heads of multi-head attention
      and general bilinear attention).
    key_dim: d_k. None means d_model / h, which must divide; any explicit
      value gives a fixed head size (Bhojanapalli et al., 2020).
    value_dim: d_v; None means the key dim.
    num_key_heads, num_value_heads: h_k and h_v of talking heads; None means h.
    num_key_value_heads: h_kv, the heads P_k and P_v project to, shared by
      groups of the h_k key heads and h_v value heads (grouped-query
      attention, as in Llama); None means no sharing. It must divide h_k and
      h_v; P_l and P_w still mix all h_k and h of the logits and h and h_v
      of the weights.
    dynamic_projections: Appendix A's projections for "talking_heads" (and
      the logits or weights half for "project_logits" / "project_weights");
      "dynamic" always has all four (a variant whose options set them).
  """
  variant: str = "multi_head"
  num_heads: int = 12
  key_dim: Optional[int] = None
  value_dim: Optional[int] = None
  num_key_heads: Optional[int] = None
  num_value_heads: Optional[int] = None
  dynamic_projections: Tuple[str, ...] = ()
  num_key_value_heads: Optional[int] = None

  def __post_init__(self):
    owner = "AttentionConfig"
    record = variants.get(self.variant, owner=owner)
    validation.positive_int("num_heads", self.num_heads, owner=owner)
    for name in ("key_dim", "value_dim", "num_key_heads", "num_value_heads",
                 "num_key_value_heads"):
      validation.positive_int(name, getattr(self, name), owner=owner,
                              optional=True)
    if self.num_key_value_heads is not None:
      if record.reads_memory_width:
        raise ValueError(
            f"{owner}: variant {self.variant!r} reads the whole width in "
            "every head and has no key or value heads to share; "
            f"num_key_value_heads={self.num_key_value_heads} needs a "
            "projected variant.")
      attention_spec.checked_key_value_heads(
          owner, self.num_key_value_heads, self.key_heads, self.value_heads)
    # The layer's own check, with the static projections the variant has.
    attention_spec.checked_dynamic_projections(
        self.dynamic_projections, owner=f"{owner}: variant {self.variant!r}",
        project_logits=record.pre_softmax,
        project_weights=record.post_softmax)
    object.__setattr__(self, "dynamic_projections",
                       tuple(self.dynamic_projections))
    record.check_heads(self.num_heads, self.num_key_heads,
                       self.num_value_heads, owner=owner)

  @property
  def key_heads(self):
    return self.num_key_heads or self.num_heads

  @property
  def value_heads(self):
    return self.num_value_heads or self.num_heads

  def head_dims(self, d_model, owner="AttentionConfig"):
    """(d_k, d_v) for a model of width d_model."""
    if variants.get(self.variant).reads_memory_width:
      # Its heads read the whole width: any h works, d_k = d_v = d_model.
      return d_model, d_model
    key_dim = self.key_dim
    if key_dim is None:
      if d_model % self.num_heads:
        raise ValueError(
            f"{owner}: num_heads={self.num_heads} does not divide d_model="
            f"{d_model}; give key_dim= for a fixed head size.")
      key_dim = d_model // self.num_heads
    return key_dim, self.value_dim or key_dim

  def make_layer(self, d_model, *, name, dropout_rate, use_bias=False,
                 kernel_initializer=None, front_end="tf_keras",
                 rotary=None, layer_index=0, norm_epsilon=None,
                 query_key_norm_epsilon=None, sliding_window=None):
    """The attention layer this config describes, from `front_end`'s
    layers: "tf_keras" (thattn.layers) or "keras3" (thattn.keras3).
    `rotary`: the layer's rotary arguments (`rotary_base`, `rotary_pct`,
    `rotary_scaling`), which a model's positions decide, or None.
    `layer_index` (the block's 0-based depth) and `norm_epsilon` (the
    model's norms' epsilon): for the variants that take them
    (`variants.make_attention`). `query_key_norm_epsilon`: the layers' q/k
    norm, or None. `sliding_window`: the layer's local window, or None."""
    record = variants.get(self.variant)
    if record.reads_memory_width:
      if rotary:
        raise ValueError(
            f"{name}: variant {self.variant!r} reads the whole width in "
            "every head, so it has no queries and keys to turn by rotary "
            "position embeddings; use learned positions or a projected "
            "variant.")
      # Its heads read the whole memory: no d_k, no biases. Its own
      # initializer keeps the logits at unit scale.
      window = {} if sliding_window is None else {
          "sliding_window": sliding_window}
      return variants.make_attention(front_end, self.variant, self.num_heads,
                                     None, dropout=dropout_rate, name=name,
                                     **window)
    key_dim, value_dim = self.head_dims(d_model)
    kwargs = dict(value_dim=value_dim, use_bias=use_bias,
                  dropout=dropout_rate, name=name, **(rotary or {}))
    if query_key_norm_epsilon is not None:
      kwargs["query_key_norm_epsilon"] = query_key_norm_epsilon
    if sliding_window is not None:
      kwargs["sliding_window"] = sliding_window
    if self.num_key_value_heads is not None:
      kwargs["num_key_value_heads"] = self.num_key_value_heads
    if kernel_initializer is not None:
      kwargs["kernel_initializer"] = kernel_initializer
    if record.takes_head_counts:
      kwargs.update(num_key_heads=self.key_heads,
                    num_value_heads=self.value_heads)
    if record.takes_dynamic_projections:
      kwargs["dynamic_projections"] = self.dynamic_projections
    return variants.make_attention(front_end, self.variant, self.num_heads,
                                   key_dim, layer_index=layer_index,
                                   norm_epsilon=norm_epsilon, **kwargs)


def _check_sizes(config, names):
  owner = type(config).__name__
  for name in names:
    validation.positive_int(name, getattr(config, name), owner=owner,
                            optional=True)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """BERT (Devlin et al., 2018) and ALBERT (Lan et al., 2019).

  Post-LN Transformer encoder with token-type embeddings and a pooler.
  ALBERT is this with `embedding_size` (E < d_model, then a learned E -> H
  projection) and `share_layers` (one layer applied `num_layers` times).
  `position_embedding="relative"` replaces the absolute position table with
  T5's relative position bias, one shared by all layers (the paper's
  Section 7.3).
  """
  vocab_size: int = 30522
  d_model: int = 768
  num_layers: int = 12
  d_ff: int = 3072
  attention: AttentionConfig = dataclasses.field(
      default_factory=AttentionConfig)
  embedding_size: Optional[int] = None
  share_layers: bool = False
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  position_embedding: str = "absolute"
  relative_num_buckets: int = 32
  relative_max_distance: int = 128
  activation: str = "gelu"
  use_bias: bool = True
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-12
  initializer_range: float = 0.02

  def __post_init__(self):
    owner = type(self).__name__
    _check_sizes(self, ("vocab_size", "d_model", "num_layers", "d_ff",
                        "embedding_size", "max_position_embeddings",
                        "type_vocab_size", "relative_num_buckets",
                        "relative_max_distance"))
    validation.one_of("position_embedding", self.position_embedding,
                      POSITION_EMBEDDINGS, owner=owner)
    validation.one_of("activation", self.activation, ACTIVATIONS, owner=owner)
    validation.rate("dropout_rate", self.dropout_rate, owner=owner)
    if not isinstance(self.attention, AttentionConfig):
      raise ValueError(f"{owner}: attention must be an AttentionConfig, got "
                       f"{self.attention!r}.")
    self.attention.head_dims(self.d_model, owner)

  @property
  def family(self):
    return "albert" if self.share_layers or self.embedding_size else "bert"


@dataclasses.dataclass(frozen=True)
class T5Config:
  """T5 (Raffel et al., 2019): a pre-norm encoder-decoder.

  RMSNorm without mean or bias, no biases anywhere, a relative position
  bias shared within each stack (bidirectional in the encoder,
  unidirectional in the decoder), and tied input/output embeddings, whose
  logits are scaled by d_model**-0.5. Token 0 pads and starts decoding, and
  token 1 ends a sequence, as in T5's vocabulary.
  """
  vocab_size: int = 32128
  d_model: int = 768
  num_layers: int = 12
  num_decoder_layers: Optional[int] = None  # None: num_layers
  d_ff: int = 3072
  # One AttentionConfig for every layer of the stack, or a tuple of one per
  # layer (`layer_attention(name, index)` reads either).
  encoder_self_attention: Union[AttentionConfig, Tuple[AttentionConfig, ...]] = (
      dataclasses.field(default_factory=AttentionConfig))
  decoder_self_attention: Union[AttentionConfig, Tuple[AttentionConfig, ...]] = (
      dataclasses.field(default_factory=AttentionConfig))
  encoder_decoder_attention: Union[AttentionConfig,
                                   Tuple[AttentionConfig, ...]] = (
                                       dataclasses.field(
                                           default_factory=AttentionConfig))
  activation: str = "relu"
  gated_feed_forward: bool = False
  tie_embeddings: bool = True
  relative_num_buckets: int = 32
  relative_max_distance: int = 128
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-6
  # "encoder_decoder" (T5), or one stack: "decoder" (a language model of
  # decoder_layers causal blocks with decoder_self_attention, read from
  # `decoder_input_tokens`) or "encoder" (num_layers bidirectional blocks
  # with encoder_self_attention, read from `encoder_input_tokens`); both
  # give logits at every position.
  stacks: str = "encoder_decoder"
  # stacks="decoder" only: a prefix LM (the T5 paper's; Mesh TensorFlow's
  # `Unitransformer.input_full_attention`): attention is bidirectional
  # over each row's prefix, as is the decoder's position bias, and the
  # model takes `decoder_causal_attention` too (see PREFIX_LM_INPUT).
  prefix_lm: bool = False

  def __post_init__(self):
    owner = type(self).__name__
    _check_sizes(self, ("vocab_size", "d_model", "num_layers",
                        "num_decoder_layers", "d_ff", "relative_num_buckets",
                        "relative_max_distance"))
    validation.one_of("stacks", self.stacks, T5_STACKS, owner=owner)
    if self.prefix_lm and self.stacks != "decoder":
      raise ValueError(f"{owner}: prefix_lm=True is a decoder-only model's; "
                       f"it needs stacks='decoder', got {self.stacks!r}.")
    validation.one_of("activation", self.activation, ACTIVATIONS, owner=owner)
    validation.rate("dropout_rate", self.dropout_rate, owner=owner)
    for name in self.attention_types:
      self._check_attention(name, owner)

  @property
  def attention_types(self):
    """The attention types the stacks have (the others are not built)."""
    return {"encoder_decoder": ATTENTION_TYPES,
            "decoder": ("decoder_self_attention",),
            "encoder": ("encoder_self_attention",)}[self.stacks]

  def _check_attention(self, name, owner):
    """One AttentionConfig, or one per layer of the stack."""
    attention = getattr(self, name)
    layers_count = (self.num_layers if name == "encoder_self_attention" else
                    self.decoder_layers)
    if isinstance(attention, (list, tuple)):
      attention = tuple(attention)
      object.__setattr__(self, name, attention)
      if len(attention) != layers_count:
        raise ValueError(
            f"{owner}: {name} has {len(attention)} per-layer configs, "
            f"expected one AttentionConfig or {layers_count}, one per layer.")
    configs = attention if isinstance(attention, tuple) else (attention,)
    for index, config in enumerate(configs):
      where = f"{owner}.{name}" + (
          f"[{index}]" if isinstance(attention, tuple) else "")
      if not isinstance(config, AttentionConfig):
        raise ValueError(f"{where} must be an AttentionConfig, got "
                         f"{config!r}.")
      config.head_dims(self.d_model, where)
    # The stack's relative position bias is one weight [buckets, h] that
    # every self-attention layer of the stack adds to its logits.
    heads = sorted({config.num_heads for config in configs})
    if name != "encoder_decoder_attention" and len(heads) > 1:
      raise ValueError(
          f"{owner}: {name} has layers with num_heads {heads}; a stack "
          "shares one relative position bias, so every self-attention layer "
          "of a stack needs the same num_heads.")

  @property
  def family(self):
    return "t5"

  @property
  def decoder_layers(self):
    return self.num_decoder_layers or self.num_layers

  def layer_attention(self, name, index):
    """The AttentionConfig of layer `index` for attention type `name`."""
    attention = getattr(self, name)
    return attention[index] if isinstance(attention, tuple) else attention


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """A decoder-only language model: pre-norm causal blocks over token
  embeddings, and logits for the next token at every position.

  Three published shapes are settings of it (the presets cite each):

  - GPT-2 (Radford et al., 2019): learned positions, LayerNorm, the tanh
    GELU, biases everywhere, the output tied to the token embedding;
  - Llama (Touvron et al., 2023; Llama 3, 2024): rotary positions, RMSNorm,
    a gated SiLU feed-forward (SwiGLU), no biases, shared key and value
    heads (`attention.num_key_value_heads`), the `llama3` rotary scaling of
    the 3.1 and 3.2 releases, tied or untied output;
  - GPT-NeoX / Pythia (Black et al., 2022; Biderman et al., 2023): a
    parallel residual, rotary positions on a part of each head
    (`rotary_pct`), the exact GELU, biases, an untied output.

  Each block is
      h = x + dropout(attention(norm(x), causal))
      y = h + dropout(feed_forward(norm(h)))
  or, with `parallel_residual`, both sublayers read x:
      y = x + dropout(attention(norm_1(x))) + dropout(feed_forward(norm_2(x)))
  and the logits are final_norm(y) E^T (tied) or final_norm(y) W_lm.

  Attributes:
    position_embedding: "learned" (a table of `max_position_embeddings`
      rows added to the token embeddings) or "rotary" (`rotary_base`,
      `rotary_pct`, `rotary_scaling` in every attention layer; then
      `max_position_embeddings` is the length the model was trained on).
    rotary_scaling: None, or the `llama3` scaling's fields as a dict
      (`thattn.ops.rotary.Llama3Scaling`).
    norm: "layer_norm" (with a bias) or "rms_norm", before every sublayer
      and at the end.
    use_bias: biases in the attention projections and the feed-forward
      layers.
    initializer_range: the standard deviation of every kernel and table at
      the start, as transformers starts Llama and GPT-NeoX (P_q also takes
      d_k**-0.5, which thattn folds into it; GPT-2's smaller residual
      projections are not reproduced).
    prefix_lm: a prefix LM (the T5 paper's): attention is bidirectional
      over each row's prefix and causal after it, and the model takes
      `decoder_causal_attention` too (see PREFIX_LM_INPUT). The weights
      are a causal LM's, so either loads the other's.
    query_key_norm: every attention layer RMS-normalizes its queries and
      keys per head, with learned scales and `layer_norm_epsilon`
      (Qwen3's q/k norm; the layers' `query_key_norm_epsilon`).
    query_key_epsilon: the q/k norm's epsilon where it is not
      `layer_norm_epsilon` (DCFormer and DCPythia fix 1e-6); None: that.
    sliding_window: None, or w: the local layers' queries attend only to
      their last w keys, their own included (the layers' and Keras 3's
      `sliding_window`; DCFormer's released prefill, window 256, is 257).
    window_pattern: which layers are local, a string of "L" (local) and
      "G" (global) repeated over the depth: "L" (every layer) by default,
      DCFormer's "LG" the even layers. Ignored without `sliding_window`.
  """
  vocab_size: int = 50257
  d_model: int = 768
  num_layers: int = 12
  d_ff: int = 3072
  attention: AttentionConfig = dataclasses.field(
      default_factory=AttentionConfig)
  position_embedding: str = "learned"
  max_position_embeddings: int = 1024
  rotary_base: float = 10000.0
  rotary_pct: float = 1.0
  rotary_scaling: Optional[dict] = None
  norm: str = "layer_norm"
  activation: str = "gelu_approximate"
  gated_feed_forward: bool = False
  parallel_residual: bool = False
  use_bias: bool = True
  tie_embeddings: bool = True
  dropout_rate: float = 0.1
  layer_norm_epsilon: float = 1e-5
  initializer_range: float = 0.02
  prefix_lm: bool = False
  query_key_norm: bool = False
  query_key_epsilon: Optional[float] = None
  sliding_window: Optional[int] = None
  window_pattern: str = "L"

  def __post_init__(self):
    owner = type(self).__name__
    validation.positive_int("sliding_window", self.sliding_window,
                            owner=owner, optional=True)
    if (not isinstance(self.window_pattern, str) or not self.window_pattern
        or set(self.window_pattern) - set("LG")):
      raise ValueError(
          f"{owner}: window_pattern={self.window_pattern!r} must be a "
          "non-empty string of 'L' (a local layer) and 'G' (a global "
          "one), e.g. 'LG' for DCFormer's.")
    if self.query_key_epsilon is not None:
      if not self.query_key_norm:
        raise ValueError(
            f"{owner}: query_key_epsilon={self.query_key_epsilon!r} is the "
            "q/k norm's; it needs query_key_norm=True.")
      attention_spec.checked_query_key_norm(owner, self.query_key_epsilon)
    _check_sizes(self, ("vocab_size", "d_model", "num_layers", "d_ff",
                        "max_position_embeddings"))
    if not isinstance(self.query_key_norm, bool) or (
        self.query_key_norm and
        variants.get(self.attention.variant).reads_memory_width):
      raise ValueError(
          f"{owner}: query_key_norm={self.query_key_norm!r} needs True or "
          "False, and True a variant with queries and keys (not "
          f"{self.attention.variant!r}).")
    validation.one_of("position_embedding", self.position_embedding,
                      DECODER_POSITIONS, owner=owner)
    validation.one_of("norm", self.norm, DECODER_NORMS, owner=owner)
    validation.one_of("activation", self.activation, ACTIVATIONS, owner=owner)
    validation.rate("dropout_rate", self.dropout_rate, owner=owner)
    if not isinstance(self.attention, AttentionConfig):
      raise ValueError(f"{owner}: attention must be an AttentionConfig, got "
                       f"{self.attention!r}.")
    key_dim, _ = self.attention.head_dims(self.d_model, owner)
    if self.position_embedding == "rotary":
      if variants.get(self.attention.variant).reads_memory_width:
        raise ValueError(
            f"{owner}: variant {self.attention.variant!r} reads the whole "
            "width in every head, so it has no queries and keys to turn by "
            "rotary position embeddings; give position_embedding='learned' "
            "or a projected variant.")
      # The layers' own checks, before any layer is built.
      rotary.layer_frequencies(owner, key_dim, self.rotary_base,
                               self.rotary_pct,
                               rotary.llama3_scaling(self.rotary_scaling))
    elif self.rotary_scaling is not None or self.rotary_pct != 1.0:
      raise ValueError(
          f"{owner}: rotary_pct={self.rotary_pct!r} and rotary_scaling="
          f"{self.rotary_scaling!r} are rotary settings; they need "
          "position_embedding='rotary' (got 'learned').")

  @property
  def family(self):
    return "decoder_lm"

  def query_key_norm_epsilon(self):
    """The attention layers' `query_key_norm_epsilon`: None without the
    q/k norm."""
    if not self.query_key_norm:
      return None
    return (self.layer_norm_epsilon if self.query_key_epsilon is None else
            self.query_key_epsilon)

  def layer_window(self, index):
    """The `sliding_window` of the attention layer at depth `index`: None
    for a global layer."""
    if self.sliding_window is None:
      return None
    local = self.window_pattern[index % len(self.window_pattern)] == "L"
    return self.sliding_window if local else None

  def rotary_arguments(self):
    """The attention layers' rotary arguments, or None for learned
    positions."""
    if self.position_embedding != "rotary":
      return None
    return dict(rotary_base=float(self.rotary_base),
                rotary_pct=self.rotary_pct,
                rotary_scaling=self.rotary_scaling)


def _attention_fields(config):
  return ATTENTION_TYPES if isinstance(config, T5Config) else ("attention",)


def _updated_attention(attention, value, key):
  """`attention` with an override: a variant name, a dict or a config.

  For T5, a list or tuple of these gives each layer of the stack its own
  config (each applied to the stack's config or to its own layer's).
  """
  if isinstance(value, (list, tuple)):
    return tuple(_updated_attention(
        attention[min(index, len(attention) - 1)]
        if isinstance(attention, tuple) else attention,
        item, f"{key}[{index}]") for index, item in enumerate(value))
  if isinstance(attention, tuple):
    return tuple(_updated_attention(item, value, key) for item in attention)
  if isinstance(value, AttentionConfig):
    return value
  if isinstance(value, str):
    record = variants.get(value, owner=key)
    dropped = {}
    if not record.takes_head_counts:
      # Options only the head-mixing variants have do not carry over.
      dropped.update(num_key_heads=None, num_value_heads=None,
                     dynamic_projections=())
    if record.reads_memory_width:  # nor do the projected variants' ones
      dropped.update(num_key_value_heads=None)
    return dataclasses.replace(attention, variant=value, **dropped)
  if isinstance(value, dict):
    fields = {field.name for field in dataclasses.fields(AttentionConfig)}
    unknown = sorted(set(value) - fields)
    if unknown:
      raise ValueError(f"{key}={value!r}: unknown attention fields {unknown}; "
                       f"expected some of {sorted(fields)}.")
    return dataclasses.replace(attention, **value)
  raise ValueError(f"{key} must be a variant name, a dict of AttentionConfig "
                   f"fields or an AttentionConfig, got {value!r}.")


def known_overrides(config):
  """The keyword names `apply_overrides` accepts for this config."""
  fields = {field.name for field in dataclasses.fields(config)}
  return sorted(fields | {"attention"} | set(SHARED_ATTENTION_FIELDS))


def apply_overrides(config, **overrides):
  """A copy of `config` with the overrides applied (see the module doc)."""
  known = known_overrides(config)
  unknown = sorted(set(overrides) - set(known))
  if unknown:
    raise ValueError(
        f"Unknown override(s) {unknown} for {type(config).__name__} "
        f"({config.family}); expected some of {known}.")
  attention_fields = _attention_fields(config)
  shared = {name: overrides[name] for name in SHARED_ATTENTION_FIELDS
            if name in overrides}
  changes = {name: value for name, value in overrides.items()
             if name not in attention_fields and name != "attention" and
             name not in shared}
  for field in attention_fields:
    attention = getattr(config, field)
    if "attention" in overrides:
      attention = _updated_attention(attention, overrides["attention"],
                                     "attention")
    if shared:
      attention = _updated_attention(attention, shared, "shared fields")
    if field != "attention" and field in overrides:
      attention = _updated_attention(attention, overrides[field], field)
    changes[field] = attention
  return dataclasses.replace(config, **changes)
