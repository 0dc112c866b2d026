"""Hugging Face decoder-only LM folders: GPT-2, Llama, GPT-NeoX (Pythia),
DiffLlama, Qwen3 (the gated-attention paper's too), Qwen3-Next (its
full-attention, dense form), and the DCFormer authors' DCPythia and
DCFormer hub folders.

What `save_pretrained` writes for `GPT2LMHeadModel`, `LlamaForCausalLM`,
`GPTNeoXForCausalLM`, `DiffLlamaForCausalLM` and `Qwen3NextForCausalLM`
(config.json with `model_type` "gpt2", "llama", "gpt_neox", "diffllama"
or "qwen3_next", and the weights, `thattn.io.hugging_face_files`), read
as a thattn `DecoderConfig` and a name-and-shape map
(`weight_maps.Rule`s).
Plain Python over NumPy: `thattn.keras3.models.load` reads these folders
with it on JAX or PyTorch alone.

What carries over, field by field: the sizes (Llama's `head_dim` and
`num_key_value_heads` as `key_dim` and `num_key_value_heads`), the
activation, the norm's epsilon, tied or untied output, GPT-NeoX's
`use_parallel_residual`, and the rotary settings of both the released
config.json files (`rope_theta` and `rope_scaling`; GPT-NeoX's
`rotary_emb_base` and `rotary_pct`) and transformers 5's
(`rope_parameters`, with `partial_rotary_factor`). GPT-2's three dropout
rates become one, its residual dropout (`resid_pdrop`).

The weights map without loss. A PyTorch Linear stores [out, in]; GPT-2's
Conv1D already stores [in, out]. The query, key and value outputs split
into heads head-major: GPT-2's `c_attn` holds [Q | K | V] along its output,
GPT-NeoX's `query_key_value` holds them per head ([h, 3, d_k] along its
output), Llama has one Linear each (K and V with h_kv heads). Rotary
embeddings are linear in Q, so 1/sqrt(d_k), which these models apply to the
logits at run time, folds into the query kernel and bias. Llama's
gate_proj is thattn's `input` kernel (the one under the SiLU) and up_proj
its `gate`.

DiffLlama is Llama with differential attention (Ye et al., 2024): its
folders convert as the `differential` variant only (`SOURCE_ATTENTION`),
N maps of `head_dim`, o_proj's input [N K] read as P_o's [N/2, 2K] (index
j 2K + c is channel c of differential head j in both), the four lambda
vectors as they are, and lambda_init from each layer's depth, as
DiffLlama's; its heads' RMSNorm has no weights, and its epsilon is the
model's `rms_norm_eps`.

Qwen3-Next is Llama with gated attention (Qiu et al., 2025): it converts
as the `gated` variant only. `q_proj` holds each head's K query rows then
its K gate rows, split head by head into P_q and P_g. Its q/k RMSNorm
(the config's `query_key_norm`) and its block norms scale by (1 + w);
thattn's scales hold 1 + w. The logits' 1/sqrt(K), which it applies
after the query's norm, folds into the query norm's scale.
Only folders whose layers are all full attention with dense MLPs
convert: a linear-attention (Gated DeltaNet) or mixture-of-experts layer
is refused by name, nothing written.

Qwen3 is Llama with the queries' and keys' RMSNorm, whose scales multiply
plainly (Qwen3-Next's hold 1 + w); its folders hold multi-head attention.
The gated-attention paper's own code (Qiu et al., 2025; qiuzh20/
gated_attention) writes Qwen3 folders whose config.json names a gate,
`headwise_attn_output_gate` or `elementwise_attn_output_gate`: they
convert as `gated_headwise` or `gated` only (`QWEN3_GATES`), q_proj's
rows cut per key-value group (the group's h/h_kv heads' queries, then
their gates), unlike Qwen3-Next's per head.

DCPythia and DCFormer (Xiao et al., 2024; `model_type` "dcpythia" and
"dcformer", the hub folders of the authors' own code, Caiyun-AI/DCFormer)
convert as the `dcmha` variant only: `wqkv`'s rows cut into Q (N K), K
and V (N_kv K each), head-major; DCMHA's `dw1` [D, 1, 4, C], `qkw` [1, 4,
C, 2R, N] and `dd` [D, 1, 4N] without their group axis (G = 1); the q/k
norms' plain scales (1e-6, the code's fixed epsilon), 1/sqrt(K) in the
query's; DCPythia's block is GPT-NeoX's (LayerNorm, exact GELU, the
parallel residual, `rotary_pct`), DCFormer's Llama's (RMSNorm, SwiGLU
with w1 under the SiLU, w3 beside it). The derived `dw_m` and `qkw_m`
are ignored, and `pre_proj.w` / `post_proj.w` must be the identity
buffers they are in both releases (the code has no key for another
static mix). The local layers (`window_type`: None is "LG", or the named
patterns, which fix the window at 256) get the released prefill's window,
the w + 1 keys j in [i - w, i]: `sliding_window` = `window_size` + 1.

Refused by name, before anything is read or written: a rope type other
than "default" and "llama3" (yarn, dynamic, linear, longrope, ...), a
sliding window, GPT-2's `scale_attn_by_inverse_layer_idx`, unscaled
attention or cross-attention, biases in only some of the projections
(thattn's `use_bias` is all or none), an activation thattn lacks.
"""

import dataclasses
import os

import numpy as np

from thattn.core import weight_maps
from thattn.io import hugging_face_files
from thattn.models import config as config_lib

MODEL_TYPES = ("gpt2", "llama", "gpt_neox", "diffllama", "qwen3_next",
               "dcpythia", "dcformer", "qwen3")
# The attention of the model types that do not hold multi-head attention:
# they convert as that variant only (`variants.converted_attention`).
SOURCE_ATTENTION = {"diffllama": "differential", "qwen3_next": "gated",
                    "dcpythia": "dcmha", "dcformer": "dcmha"}
# Qwen3 folders of the gated-attention paper's code (qiuzh20/
# gated_attention) name their gate in config.json; a Qwen3 folder without
# one holds multi-head attention.
QWEN3_GATES = {"headwise_attn_output_gate": "gated_headwise",
               "elementwise_attn_output_gate": "gated"}
# config.json's activation -> DecoderConfig.activation.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate",
               "gelu_pytorch_tanh": "gelu_approximate",
               "gelu_fast": "gelu_approximate", "silu": "silu",
               "relu": "relu"}
# The weights' prefix in a task model's checkpoint; a bare model (what
# GPT2Model, LlamaModel, GPTNeoXModel save) has none.
_PREFIXES = {"gpt2": "transformer.", "llama": "model.",
             "gpt_neox": "gpt_neox.", "diffllama": "model.",
             "qwen3_next": "model.", "dcpythia": "", "dcformer": "",
             "qwen3": "model."}
# Buffers some checkpoints hold beside the weights (GPT-2's causal masks,
# GPT-NeoX's masks and inverse frequencies), which thattn computes, and
# Qwen3-Next's multi-token-prediction module (`mtp.*`), which transformers
# does not load either.
DROPPED = (r".*\.attn\.(masked_)?bias", r".*\.attention\.(masked_)?bias",
           r".*rotary_emb\.inv_freq", r"mtp\..*")
# DCPythia's and DCFormer's derived weights (merge_weights' `dw_m`,
# `qkw_m`) and identity buffers (checked in `read`).
DCFORMER_DROPPED = (r".*\.dyn_w_proj\.(dw_m|qkw_m)",
                    r".*\.dyn_w_proj\.(pre|post)_proj\.w")
# The authors' named window patterns ("L" local, "G" global), which fix
# the window at 256 whatever `window_size` says; None is "LG" with it.
DCFORMER_WINDOW_PATTERNS = {"LG": "LG", "LGLL": "LGLL", "LGL6": "LGLLLLLL"}
# The q/k RMSNorm's epsilon, fixed in the authors' code.
DCFORMER_QUERY_KEY_EPSILON = 1e-6


def is_source(path):
  """Whether `path` is a Hugging Face GPT-2, Llama, GPT-NeoX or DiffLlama
  folder."""
  return hugging_face_files.model_type(path) in MODEL_TYPES


def source_attention(path):
  """The attention variant the folder `path` holds: "multi_head", or
  `SOURCE_ATTENTION`'s for its model type, or a Qwen3 folder's gate
  (`QWEN3_GATES`)."""
  model_type = hugging_face_files.model_type(path)
  if model_type == "qwen3":
    return _qwen3_attention(hugging_face_files.read_config(path), path)
  return SOURCE_ATTENTION.get(model_type, "multi_head")


def held_attentions():
  """Every variant a folder may hold other than multi-head attention,
  which converts only as itself."""
  return tuple(sorted(set(SOURCE_ATTENTION.values()) |
                      set(QWEN3_GATES.values())))


def _qwen3_attention(hf_config, path):
  gates = [key for key in QWEN3_GATES if hf_config.get(key)]
  if len(gates) > 1:
    _refuse(path, " and ".join(gates), True, "one gate, head-wise or "
            "element-wise")
  return QWEN3_GATES[gates[0]] if gates else "multi_head"


def _where(path):
  return os.path.join(path, hugging_face_files.CONFIG_FILE)


def _field(hf_config, name, path):
  if name not in hf_config:
    raise ValueError(f"{_where(path)} has no {name!r}; expected a "
                     f"{hf_config.get('model_type')} config.json.")
  return hf_config[name]


def _refuse(path, name, value, represented):
  raise ValueError(f"{_where(path)}: {name}={value!r}; thattn represents "
                   f"only {represented} (nothing was written).")


def rotary_settings(hf_config, path):
  """(rotary_base, rotary_pct, rotary_scaling) of a config.json, in either
  the released files' keys or transformers 5's `rope_parameters`."""
  parameters = dict(hf_config.get("rope_parameters") or {})
  scaling = dict(hf_config.get("rope_scaling") or parameters)
  base = parameters.get("rope_theta", hf_config.get(
      "rope_theta", hf_config.get("rotary_emb_base", 10000.0)))
  pct = parameters.get("partial_rotary_factor", hf_config.get(
      "partial_rotary_factor", hf_config.get("rotary_pct", 1.0)))
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  if rope_type == "default":
    return float(base), pct, None
  if rope_type != "llama3":
    _refuse(path, "rope_type", rope_type, "'default' and 'llama3' rotary "
            "embeddings")
  fields = ("factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings")
  missing = [name for name in fields if name not in scaling]
  if missing:
    raise ValueError(f"{_where(path)}: the llama3 rope scaling has no "
                     f"{missing} (nothing was written).")
  return float(base), pct, {name: scaling[name] for name in fields}


def _activation(hf_config, key, path):
  activation = _field(hf_config, key, path)
  if activation not in ACTIVATIONS:
    _refuse(path, key, activation, f"{sorted(ACTIVATIONS)}")
  return ACTIVATIONS[activation]


def _gpt2_config(hf_config, path, attention):
  for name, represented in (("scale_attn_by_inverse_layer_idx", False),
                            ("scale_attn_weights", True),
                            ("add_cross_attention", False)):
    if hf_config.get(name, represented) != represented:
      _refuse(path, name, hf_config[name], f"{name}={represented}")
  width = _field(hf_config, "n_embd", path)
  return config_lib.DecoderConfig(
      vocab_size=_field(hf_config, "vocab_size", path), d_model=width,
      num_layers=_field(hf_config, "n_layer", path),
      d_ff=hf_config.get("n_inner") or 4 * width,
      attention=config_lib.AttentionConfig(
          variant=attention, num_heads=_field(hf_config, "n_head", path)),
      position_embedding="learned",
      max_position_embeddings=_field(hf_config, "n_positions", path),
      norm="layer_norm",
      activation=_activation(hf_config, "activation_function", path),
      use_bias=True, tie_embeddings=hf_config.get("tie_word_embeddings",
                                                  True),
      dropout_rate=hf_config.get("resid_pdrop", 0.1),
      layer_norm_epsilon=hf_config.get("layer_norm_epsilon", 1e-5),
      initializer_range=hf_config.get("initializer_range", 0.02))


def _llama_config(hf_config, path, attention):
  if hf_config.get("sliding_window"):
    _refuse(path, "sliding_window", hf_config["sliding_window"],
            "attention over the whole past (no sliding window)")
  biases = {name: bool(hf_config.get(name, False))
            for name in ("attention_bias", "mlp_bias")}
  if len(set(biases.values())) > 1:
    _refuse(path, "attention_bias, mlp_bias", tuple(biases.values()),
            "biases in every projection or in none")
  width = _field(hf_config, "hidden_size", path)
  heads = _field(hf_config, "num_attention_heads", path)
  base, pct, scaling = rotary_settings(hf_config, path)
  return config_lib.DecoderConfig(
      vocab_size=_field(hf_config, "vocab_size", path), d_model=width,
      num_layers=_field(hf_config, "num_hidden_layers", path),
      d_ff=_field(hf_config, "intermediate_size", path),
      attention=config_lib.AttentionConfig(
          variant=attention, num_heads=heads,
          key_dim=hf_config.get("head_dim") or width // heads,
          num_key_value_heads=hf_config.get("num_key_value_heads") or heads),
      position_embedding="rotary",
      max_position_embeddings=_field(hf_config, "max_position_embeddings",
                                     path),
      rotary_base=base, rotary_pct=pct, rotary_scaling=scaling,
      norm="rms_norm", activation=_activation(hf_config, "hidden_act", path),
      gated_feed_forward=True, use_bias=biases["attention_bias"],
      tie_embeddings=hf_config.get("tie_word_embeddings", False),
      dropout_rate=hf_config.get("attention_dropout", 0.0),
      layer_norm_epsilon=hf_config.get("rms_norm_eps", 1e-6),
      initializer_range=hf_config.get("initializer_range", 0.02))


def _diff_llama_config(hf_config, path, attention):
  if attention != SOURCE_ATTENTION["diffllama"]:
    _refuse(path, "attention", attention, "DiffLlama's differential "
            "attention (attention='differential')")
  if hf_config.get("attention_dropout", 0.0):
    _refuse(path, "attention_dropout", hf_config["attention_dropout"],
            "DiffLlama without attention dropout (transformers refuses it)")
  # Its heads' RMSNorm takes the model's epsilon, rms_norm_eps, as
  # DiffLlama's (the models pass their norms' epsilon to the layer).
  return _llama_config(hf_config, path, attention)


def _qwen3_next_config(hf_config, path, attention):
  if attention != SOURCE_ATTENTION["qwen3_next"]:
    _refuse(path, "attention", attention, "Qwen3-Next's gated attention "
            "(attention='gated')")
  layers = _field(hf_config, "num_hidden_layers", path)
  layer_types = hf_config.get("layer_types") or []
  linear = [index for index, kind in enumerate(layer_types)
            if kind != "full_attention"]
  if len(layer_types) != layers or linear:
    _refuse(path, "layer_types", layer_types, "full attention in every "
            f"layer (layers {linear} are not; linear attention, Gated "
            "DeltaNet, has no thattn layer)")
  step = hf_config.get("decoder_sparse_step", 1)
  experts = [index for index in range(layers)
             if hf_config.get("num_experts", 0) > 0 and
             index not in (hf_config.get("mlp_only_layers") or []) and
             (index + 1) % step == 0]
  if experts:
    _refuse(path, "num_experts", hf_config["num_experts"], "dense MLPs "
            f"(layers {experts} would be mixtures of experts)")
  if hf_config.get("attention_bias"):
    _refuse(path, "attention_bias", True, "Qwen3-Next without biases (its "
            "q_proj's would interleave query and gate biases too)")
  return dataclasses.replace(_llama_config(hf_config, path, attention),
                             query_key_norm=True)


def _gpt_neox_config(hf_config, path, attention):
  if not hf_config.get("attention_bias", True):
    _refuse(path, "attention_bias", False, "attention_bias=True (GPT-NeoX's "
            "feed-forward layers always have biases)")
  width = _field(hf_config, "hidden_size", path)
  heads = _field(hf_config, "num_attention_heads", path)
  base, pct, scaling = rotary_settings(hf_config, path)
  return config_lib.DecoderConfig(
      vocab_size=_field(hf_config, "vocab_size", path), d_model=width,
      num_layers=_field(hf_config, "num_hidden_layers", path),
      d_ff=_field(hf_config, "intermediate_size", path),
      attention=config_lib.AttentionConfig(variant=attention, num_heads=heads,
                                       key_dim=width // heads),
      position_embedding="rotary",
      max_position_embeddings=_field(hf_config, "max_position_embeddings",
                                     path),
      rotary_base=base, rotary_pct=pct, rotary_scaling=scaling,
      norm="layer_norm",
      activation=_activation(hf_config, "hidden_act", path),
      parallel_residual=hf_config.get("use_parallel_residual", True),
      use_bias=True,
      tie_embeddings=hf_config.get("tie_word_embeddings", False),
      dropout_rate=hf_config.get("hidden_dropout", 0.0),
      layer_norm_epsilon=hf_config.get("layer_norm_eps", 1e-5),
      initializer_range=hf_config.get("initializer_range", 0.02))


def _dcformer_config(hf_config, path, attention):
  """DCPythia's and DCFormer's config.json (the authors' config classes'
  keys) as a DecoderConfig."""
  model_type = hf_config["model_type"]
  if attention != "dcmha":
    _refuse(path, "attention", attention, f"{model_type}'s DCMHA "
            "(attention='dcmha')")
  for name, released in (("use_dcmha", True), ("query_wise", False),
                         ("tie_word_embeddings", False)):
    if hf_config.get(name, released) != released:
      _refuse(path, name, hf_config[name], f"{name}={released} (as both "
              "releases)")
  width, heads = _field(hf_config, "dim", path), _field(hf_config, "n_head",
                                                        path)
  kv_heads = hf_config.get("n_local_heads", -1)
  pythia = model_type == "dcpythia"
  window_type = hf_config.get("window_type")
  window = hf_config.get("window_size")
  if window_type is not None:
    if window_type not in DCFORMER_WINDOW_PATTERNS:
      _refuse(path, "window_type", window_type,
              f"None or {sorted(DCFORMER_WINDOW_PATTERNS)}")
    window = 256  # the named patterns' own
  d_ff = hf_config.get("intermediate_size") or (
      4 * width if pythia else -(-int(8 * width / 3) // 256) * 256)
  return config_lib.DecoderConfig(
      vocab_size=_field(hf_config, "vocab_size", path), d_model=width,
      num_layers=_field(hf_config, "n_layer", path), d_ff=d_ff,
      attention=config_lib.AttentionConfig(
          variant="dcmha", num_heads=heads, key_dim=width // heads,
          num_key_value_heads=(None if kv_heads in (-1, heads) else
                               kv_heads)),
      position_embedding="rotary",
      max_position_embeddings=hf_config.get("block_size", 2048),
      rotary_base=float(hf_config.get("rope_base", 10000.0)),
      rotary_pct=hf_config.get("rotary_pct", 1.0) if pythia else 1.0,
      norm="layer_norm" if pythia else "rms_norm",
      activation="gelu" if pythia else "silu",
      gated_feed_forward=not pythia,
      parallel_residual=pythia and hf_config.get("use_parallel_residual",
                                                 True),
      use_bias=pythia and hf_config.get("use_linear_bias", True),
      tie_embeddings=False, dropout_rate=0.0,
      layer_norm_epsilon=hf_config.get("norm_eps", 1e-5),
      query_key_norm=bool(hf_config.get("use_qk_norm", False)),
      query_key_epsilon=(DCFORMER_QUERY_KEY_EPSILON
                         if hf_config.get("use_qk_norm") else None),
      sliding_window=None if window is None else window + 1,
      window_pattern=DCFORMER_WINDOW_PATTERNS.get(window_type, "LG"))


def _qwen3_config(hf_config, path, attention):
  """Qwen3's config.json (transformers' and the gated-attention paper's):
  Llama's with the q/k norm (plain scales, `rms_norm_eps`), and the
  paper's gate where it names one."""
  held = _qwen3_attention(hf_config, path)
  if attention != held and held != "multi_head":
    _refuse(path, "attention", attention, f"this Qwen3 folder's {held} "
            f"attention (attention={held!r})")
  if hf_config.get("use_sliding_window"):
    _refuse(path, "use_sliding_window", True, "attention over the whole "
            "past (no sliding window)")
  if hf_config.get("attention_bias") or hf_config.get("qkv_bias"):
    _refuse(path, "attention_bias", True, "Qwen3 without biases (its MLP "
            "has none, and thattn's use_bias is all or none)")
  llama = {key: value for key, value in hf_config.items()
           if key not in ("sliding_window", "attention_bias", "qkv_bias")}
  return dataclasses.replace(
      _llama_config(llama, path, attention),
      query_key_norm=bool(hf_config.get("use_qk_norm", True)))


_CONFIGS = {"gpt2": _gpt2_config, "llama": _llama_config,
            "gpt_neox": _gpt_neox_config, "diffllama": _diff_llama_config,
            "qwen3_next": _qwen3_next_config, "dcpythia": _dcformer_config,
            "dcformer": _dcformer_config, "qwen3": _qwen3_config}


def decoder_config(hf_config, path, attention="multi_head"):
  """thattn's DecoderConfig for a config.json, or ValueError naming the
  field thattn cannot represent."""
  model_type = _field(hf_config, "model_type", path)
  if model_type not in _CONFIGS:
    _refuse(path, "model_type", model_type, f"{list(MODEL_TYPES)}")
  width = hf_config.get("n_embd", hf_config.get("hidden_size"))
  heads = hf_config.get("n_head", hf_config.get("num_attention_heads"))
  width = width or hf_config.get("dim")
  if (model_type not in ("llama", "diffllama", "qwen3_next", "qwen3") or
      not hf_config.get("head_dim")) and (
      width and heads and width % heads):
    raise ValueError(f"{_where(path)}: the width {width} is not a multiple "
                     f"of the {heads} heads (nothing was written).")
  return _CONFIGS[model_type](hf_config, path, attention)


def read_arrays(path, model_type):
  """{name: float32 array} of the folder's weights, without the task
  model's prefix (`transformer.`, `model.`, `gpt_neox.`), which a bare
  model lacks."""
  return hugging_face_files.read_arrays(path, (_PREFIXES[model_type],))


def _rule(target, source, transform=None):
  if transform is None:
    return weight_maps.Rule(target, source)
  return weight_maps.Rule(target, source, transform)


def _heads(array, heads, head_dim, scale=1.0):
  """[..., heads * head_dim] -> [..., heads, head_dim], times `scale`."""
  array = np.asarray(array) * scale
  return array.reshape(array.shape[:-1] + (heads, head_dim))


def _norm(target, source, config, transform=None):
  """A norm's rules: RMSNorm's scale (`transform`ed: Qwen3-Next's 1 + w),
  or LayerNorm's gamma and beta."""
  if config.norm == "rms_norm":
    return [_rule(f"{target}/scale", f"{source}.weight", transform)]
  return [_rule(f"{target}/gamma", f"{source}.weight"),
          _rule(f"{target}/beta", f"{source}.bias")]


def _dense(target, source, transform, use_bias):
  """A Dense's rules from a source layer with `weight` (and `bias`)."""
  rules = [_rule(f"{target}/kernel", f"{source}.weight", transform)]
  if use_bias:
    rules.append(_rule(f"{target}/bias", f"{source}.bias"))
  return rules


def _attention(block, config, query_key_value, output, use_bias,
               output_heads=None):
  """One attention layer's rules. `query_key_value`: {"query", "key",
  "value": (source name of the weight, [...] -> that part's [in, out]
  kernel or bias, before its split into heads)}; `output`: the output
  layer's source name and its [in, out] kernel transform; `output_heads`:
  (heads, width) of P_o's input, (h, d_v) unless given. The logits'
  1/sqrt(d_k) folds into P_q, or with the q/k norm into the query norm's
  scale (`_qwen3_next_rules`)."""
  h = config.attention.num_heads
  d_k, d_v = config.attention.head_dims(config.d_model)
  output_heads = output_heads or (h, d_v)
  h_kv = config.attention.num_key_value_heads or h
  query_scale = 1.0 if config.query_key_norm else d_k ** -0.5
  sizes = {"query": (h, d_k, query_scale), "key": (h_kv, d_k, 1.0),
           "value": (h_kv, d_v, 1.0)}
  target = f"{block}/self_attention/self_attention"
  rules = []
  for part, (heads, size, scale) in sizes.items():
    source, piece = query_key_value[part]
    for which in ("weight", "bias") if use_bias else ("weight",):
      rules.append(_rule(
          f"{target}/{part}/{'kernel' if which == 'weight' else 'bias'}",
          f"{source}.{which}",
          lambda array, piece=piece, heads=heads, size=size, scale=scale:
          _heads(piece(array), heads, size, scale)))
  source, kernel = output
  rules.append(_rule(f"{target}/output/kernel", f"{source}.weight",
                     lambda array: kernel(array).reshape(*output_heads, -1)))
  if use_bias:
    rules.append(_rule(f"{target}/output/bias", f"{source}.bias"))
  return rules


def _gpt2_rules(config):
  d = config.d_model
  rules = [_rule("token_embedding/embeddings", "wte.weight"),
           _rule("position_embedding/embeddings", "wpe.weight")]
  rules += _norm("decoder_final_norm", "ln_f", config)
  for index in range(config.num_layers):
    block, layer = f"decoder_block_{index}", f"h.{index}"
    # c_attn: a Conv1D, [in, out] = [d, 3d], its output [Q | K | V].
    thirds = {part: (f"{layer}.attn.c_attn",
                     lambda array, third=third: np.asarray(array)[
                         ..., third * d:(third + 1) * d])
              for third, part in enumerate(("query", "key", "value"))}
    rules += _attention(block, config, thirds,
                        (f"{layer}.attn.c_proj", np.asarray), True)
    rules += _dense(f"{block}/feed_forward/input", f"{layer}.mlp.c_fc",
                    np.asarray, True)
    rules += _dense(f"{block}/feed_forward/output", f"{layer}.mlp.c_proj",
                    np.asarray, True)
    rules += _norm(f"{block}/self_attention_norm", f"{layer}.ln_1", config)
    rules += _norm(f"{block}/feed_forward_norm", f"{layer}.ln_2", config)
  return rules


def _llama_rules(config, output_heads=None):
  """Llama's rules; `output_heads` as `_attention`'s."""
  rules = [_rule("token_embedding/embeddings", "embed_tokens.weight")]
  rules += _norm("decoder_final_norm", "norm", config)
  linear = lambda array: np.asarray(array).T  # a Linear's [out, in]
  for index in range(config.num_layers):
    block, layer = f"decoder_block_{index}", f"layers.{index}"
    parts = {part: (f"{layer}.self_attn.{short}_proj", linear)
             for part, short in (("query", "q"), ("key", "k"),
                                 ("value", "v"))}
    rules += _attention(block, config, parts,
                        (f"{layer}.self_attn.o_proj", linear),
                        config.use_bias, output_heads)
    # SiLU(x W_gate) * x W_up: thattn's gated network applies its
    # activation to the `input` kernel's output.
    for target, source in (("input", "gate_proj"), ("gate", "up_proj"),
                           ("output", "down_proj")):
      rules += _dense(f"{block}/feed_forward/{target}",
                      f"{layer}.mlp.{source}", linear, config.use_bias)
    rules += _norm(f"{block}/self_attention_norm",
                   f"{layer}.input_layernorm", config)
    rules += _norm(f"{block}/feed_forward_norm",
                   f"{layer}.post_attention_layernorm", config)
  return rules


def _diff_llama_rules(config):
  """Llama's rules, o_proj's input as N/2 heads of 2K, and each layer's
  four lambda vectors."""
  maps = config.attention.num_heads
  d_k, _ = config.attention.head_dims(config.d_model)
  rules = _llama_rules(config, output_heads=(maps // 2, 2 * d_k))
  for index in range(config.num_layers):
    rules += [_rule(f"decoder_block_{index}/self_attention/self_attention/"
                    f"{name}", f"layers.{index}.self_attn.{name}")
              for name in ("lambda_q1", "lambda_k1", "lambda_q2",
                           "lambda_k2")]
  return rules


def _qwen3_next_rules(config):
  """Llama's rules with q_proj split head by head into P_q and P_g, the
  q/k norms, and every norm's (1 + w) as the scale."""
  h = config.attention.num_heads
  d_k, _ = config.attention.head_dims(config.d_model)
  linear = lambda array: np.asarray(array).T  # a Linear's [out, in]
  plus_one = lambda array: 1.0 + np.asarray(array)

  def query_or_gate(array, which):
    """[in, h K] of q_proj's query (0) or gate (1) rows, head by head."""
    rows = np.asarray(array).reshape(h, 2, d_k, -1)[:, which]
    return rows.reshape(h * d_k, -1).T

  rules = [_rule("token_embedding/embeddings", "embed_tokens.weight")]
  rules += _norm("decoder_final_norm", "norm", config, plus_one)
  for index in range(config.num_layers):
    block, layer = f"decoder_block_{index}", f"layers.{index}"
    attention = f"{layer}.self_attn"
    target = f"{block}/self_attention/self_attention"
    parts = {"query": (f"{attention}.q_proj",
                       lambda array: query_or_gate(array, 0)),
             "key": (f"{attention}.k_proj", linear),
             "value": (f"{attention}.v_proj", linear)}
    rules += _attention(block, config, parts, (f"{attention}.o_proj", linear),
                        False)
    rules += [
        _rule(f"{target}/gate/kernel", f"{attention}.q_proj.weight",
              lambda array: _heads(query_or_gate(array, 1), h, d_k)),
        # 1/sqrt(d_k), applied after the query's norm there.
        _rule(f"{target}/query_norm", f"{attention}.q_norm.weight",
              lambda array: plus_one(array) * d_k ** -0.5),
        _rule(f"{target}/key_norm", f"{attention}.k_norm.weight", plus_one)]
    for part, source in (("input", "gate_proj"), ("gate", "up_proj"),
                         ("output", "down_proj")):
      rules += _dense(f"{block}/feed_forward/{part}",
                      f"{layer}.mlp.{source}", linear, False)
    rules += _norm(f"{block}/self_attention_norm",
                   f"{layer}.input_layernorm", config, plus_one)
    rules += _norm(f"{block}/feed_forward_norm",
                   f"{layer}.post_attention_layernorm", config, plus_one)
  return rules


def _gpt_neox_rules(config):
  h = config.attention.num_heads
  d_k, _ = config.attention.head_dims(config.d_model)
  rules = [_rule("token_embedding/embeddings", "embed_in.weight")]
  rules += _norm("decoder_final_norm", "final_layer_norm", config)
  linear = lambda array: np.asarray(array).T
  for index in range(config.num_layers):
    block, layer = f"decoder_block_{index}", f"layers.{index}"

    # query_key_value: a Linear whose output is [h, 3, d_k]: each head's
    # query, key and value side by side.
    def part_of(array, which):
      array = np.asarray(array)
      array = array.T if array.ndim == 2 else array
      fused = array.reshape(array.shape[:-1] + (h, 3, d_k))
      return fused[..., which, :].reshape(array.shape[:-1] + (h * d_k,))

    parts = {part: (f"{layer}.attention.query_key_value",
                    lambda array, which=which: part_of(array, which))
             for which, part in enumerate(("query", "key", "value"))}
    rules += _attention(block, config, parts,
                        (f"{layer}.attention.dense", linear), True)
    rules += _dense(f"{block}/feed_forward/input",
                    f"{layer}.mlp.dense_h_to_4h", linear, True)
    rules += _dense(f"{block}/feed_forward/output",
                    f"{layer}.mlp.dense_4h_to_h", linear, True)
    rules += _norm(f"{block}/self_attention_norm",
                   f"{layer}.input_layernorm", config)
    rules += _norm(f"{block}/feed_forward_norm",
                   f"{layer}.post_attention_layernorm", config)
  return rules


def _dcformer_rules(config):
  """DCPythia's and DCFormer's rules: wqkv cut into Q, K and V, DCMHA's
  kernels without their group axis, the q/k norms, the feed-forward
  network (DCPythia's w1, w2; DCFormer's SwiGLU w1, w3, w2)."""
  h = config.attention.num_heads
  h_kv = config.attention.num_key_value_heads or h
  d_k, _ = config.attention.head_dims(config.d_model)
  linear = lambda array: np.asarray(array).T  # a Linear's [out, in]
  bounds = {"query": (0, h * d_k), "key": (h * d_k, (h + h_kv) * d_k),
            "value": ((h + h_kv) * d_k, (h + 2 * h_kv) * d_k)}

  def rows(array, part):
    """wqkv's rows (or bias entries) of `part`, as [in, out] (or [out])."""
    start, stop = bounds[part]
    return linear(np.asarray(array)[start:stop])

  rules = [_rule("token_embedding/embeddings", "tok_embeddings.weight")]
  rules += _norm("decoder_final_norm", "norm", config)
  for index in range(config.num_layers):
    block, layer = f"decoder_block_{index}", f"layers.{index}"
    attention = f"{layer}.attention"
    target = f"{block}/self_attention/self_attention"
    parts = {part: (f"{attention}.wqkv",
                    lambda array, part=part: rows(array, part))
             for part in bounds}
    rules += _attention(block, config, parts, (f"{attention}.wo", linear),
                        config.use_bias)
    squeezed = lambda array: np.asarray(array)[:, 0]  # [D, G=1, ...]
    rules += [
        _rule(f"{target}/dynamic_hidden", f"{attention}.dyn_w_proj.dw1",
              squeezed),
        _rule(f"{target}/dynamic_factors", f"{attention}.dyn_w_proj.qkw",
              lambda array: np.asarray(array)[0]),
        _rule(f"{target}/dynamic_gates", f"{attention}.dyn_w_proj.dd",
              lambda array: squeezed(array).reshape(
                  array.shape[0], 4, h))]
    if config.query_key_norm:
      rules += [
          # 1/sqrt(d_k), applied to the logits after the norm there.
          _rule(f"{target}/query_norm", f"{attention}.q_norm.scale",
                lambda array: np.asarray(array) * d_k ** -0.5),
          _rule(f"{target}/key_norm", f"{attention}.k_norm.scale")]
    ff_parts = (("input", "w1"), ("gate", "w3"), ("output", "w2"))
    for part, source in ff_parts if config.gated_feed_forward else (
        ff_parts[0], ff_parts[2]):
      rules += _dense(f"{block}/feed_forward/{part}",
                      f"{layer}.feed_forward.{source}", linear,
                      config.use_bias)
    rules += _norm(f"{block}/self_attention_norm", f"{layer}.attention_norm",
                   config)
    rules += _norm(f"{block}/feed_forward_norm", f"{layer}.ffn_norm", config)
  return rules


def _qwen3_rules(config):
  """Llama's rules with the q/k norms' plain scales (the query's times
  1/sqrt(d_k)) and, in the gated-attention paper's folders, q_proj's rows
  cut per key-value group: each group's queries [h/h_kv, K], then its
  gates ([h/h_kv] head-wise, [h/h_kv, K] element-wise)."""
  h = config.attention.num_heads
  h_kv = config.attention.num_key_value_heads or h
  d_k, _ = config.attention.head_dims(config.d_model)
  group = h // h_kv
  linear = lambda array: np.asarray(array).T  # a Linear's [out, in]
  gated = config.attention.variant in QWEN3_GATES.values()
  gate_width = (1 if config.attention.variant == "gated_headwise" else d_k)

  def query_rows(array):  # [in, h K] of q_proj's queries
    rows = np.asarray(array).reshape(h_kv, group * (d_k + gate_width), -1)
    return rows[:, :group * d_k].reshape(h * d_k, -1).T

  def gate_rows(array):  # P_g: [in, h] or [in, h, K]
    rows = np.asarray(array).reshape(h_kv, group * (d_k + gate_width), -1)
    gates = rows[:, group * d_k:].reshape(h * gate_width, -1).T
    return gates if gate_width == 1 else gates.reshape(-1, h, d_k)

  rules = [rule for rule in _llama_rules(config)
           if not (gated and rule.source.endswith("self_attn.q_proj.weight"))]
  for index in range(config.num_layers):
    attention = f"layers.{index}.self_attn"
    target = f"decoder_block_{index}/self_attention/self_attention"
    if gated:
      rules += [
          _rule(f"{target}/query/kernel", f"{attention}.q_proj.weight",
                lambda array: _heads(query_rows(array), h, d_k,
                                     1.0 if config.query_key_norm else
                                     d_k ** -0.5)),
          _rule(f"{target}/gate/kernel", f"{attention}.q_proj.weight",
                gate_rows)]
    if config.query_key_norm:
      rules += [
          _rule(f"{target}/query_norm", f"{attention}.q_norm.weight",
                lambda array: np.asarray(array) * d_k ** -0.5),
          _rule(f"{target}/key_norm", f"{attention}.k_norm.weight")]
  return rules


_RULES = {"gpt2": _gpt2_rules, "llama": _llama_rules,
          "gpt_neox": _gpt_neox_rules, "diffllama": _diff_llama_rules,
          "qwen3_next": _qwen3_next_rules, "dcpythia": _dcformer_rules,
          "dcformer": _dcformer_rules, "qwen3": _qwen3_rules}
# The untied output layer's source name.
_LM_HEADS = {"gpt2": "lm_head", "llama": "lm_head", "gpt_neox": "embed_out",
             "diffllama": "lm_head", "qwen3_next": "lm_head",
             "dcpythia": "output", "dcformer": "output", "qwen3": "lm_head"}


def rules(config, model_type):
  """Every Rule of a decoder-only LM of this thattn config read from a
  `model_type` folder."""
  result = _RULES[model_type](config)
  if not config.tie_embeddings:
    result.append(_rule("lm_head/kernel", f"{_LM_HEADS[model_type]}.weight",
                        lambda array: np.asarray(array).T))
  return result


def dropped(config, model_type):
  """The source names meant to be left out: the buffers, and a tied
  model's copy of its embedding as the output layer."""
  result = DROPPED
  if model_type in ("dcpythia", "dcformer"):
    result += DCFORMER_DROPPED
  if config.tie_embeddings:
    result += (rf"{_LM_HEADS[model_type]}\.weight",)
  return result


def _check_identity_buffers(arrays, path):
  """DCMHA's `pre_proj.w` and `post_proj.w` buffers as both releases hold
  them, the identity (the compose's residual); another static mix has no
  config key in the authors' code, so it is refused by name."""
  for name, array in arrays.items():
    if name.endswith(("pre_proj.w", "post_proj.w")):
      array = np.asarray(array)
      if array.ndim != 3 or array.shape[0] != 1 or not np.array_equal(
          array[0], np.eye(array.shape[-1])):
        raise ValueError(
            f"{path}: {name} is not the identity; thattn reads DCMHA's "
            "static mix as the identity that both releases hold (nothing "
            "was written).")


def read(path, attention):
  """The folder as a `weight_maps.Source`, without its tokenizer
  (`thattn.converters.hugging_face_lm` reads it)."""
  hf_config = hugging_face_files.read_config(path)
  config = decoder_config(hf_config, path, attention)
  family = hf_config["model_type"]
  arrays = read_arrays(path, family)
  _check_identity_buffers(arrays, path)
  return weight_maps.Source(
      config=config, arrays=arrays,
      rules=rules(config, family), dropped=dropped(config, family),
      tokenizer=None, family=family)
