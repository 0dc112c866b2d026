"""Presets: named model configurations, each citing its source.

Published architectures:

- `bert_base`: BERT-Base, uncased (Devlin et al., 2018, Section 3 and the
  released bert_config.json): L=12, H=768, A=12, d_ff=3072, vocab 30522,
  512 positions, 2 token types, GELU, dropout 0.1. 109,482,240 parameters
  with the pooler.
- `bert_large`: BERT-Large, uncased (Devlin et al., 2018): L=24, H=1024,
  A=16, d_ff=4096.
- `albert_base`: ALBERT-base (Lan et al., 2019, Table 1, and the released
  albert_base v2 config): L=12, H=768, E=128, A=12, d_ff=3072, vocab 30000,
  all layers shared, gelu (tanh form), no dropout. 11,683,584 parameters
  with the pooler.
- `t5_base`: T5-Base (Raffel et al., 2019, Section 3.1.1; the released
  t5-base checkpoint): 12+12 layers, d_model=768, d_ff=3072, 12 heads of
  d_kv=64, ReLU, vocab 32128, 32 relative position buckets, dropout 0.1,
  tied embeddings. 222,903,552 parameters.
- `t5_1_1_base`: T5.1.1-Base (the released t5.1.1 checkpoints' gin config):
  gated-GELU with d_ff=2048, untied embeddings.

Decoder-only language models (`DecoderConfig`), each count as transformers
counts the released model (a tied table once):

- `gpt2`: GPT-2 small (Radford et al., 2019; the released gpt2
  config.json): 12 layers, width 768, 12 heads, d_ff 3072, vocab 50257,
  1024 learned positions, LayerNorm eps 1e-5, the tanh GELU, biases,
  dropout 0.1, tied. 124,439,808 parameters.
- `pythia_160m`, `pythia_410m`: Pythia (Biderman et al., 2023, Table 1;
  EleutherAI/pythia-160m and -410m config.json), GPT-NeoX's block:
  vocab 50304, 2048 positions, rotary embeddings on a quarter of each head
  (base 10000), a parallel residual, the exact GELU, biases, untied;
  12 layers of width 768 with 12 heads (162,322,944 parameters) and 24 of
  width 1024 with 16 heads (405,334,016).
- `llama_3_2_1b`: Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json):
  16 layers, width 2048, 32 heads of 64 over 8 key and value heads, d_ff
  8192 in SwiGLU, RMSNorm eps 1e-5, vocab 128256, rotary base 500000 with
  the `llama3` scaling (factor 32, low and high frequency factors 1 and 4,
  8192 original positions), 131072 positions, no biases, tied.
  1,235,814,400 parameters.

The paper's experiments (talking-heads-attention.md; the experiment name is
the row of the table it comes from):

- T5, Section 7.1, Tables 1-4 and 8-10: `t5_base_<variant>_<h>` and the
  rows described next to each preset below. As in Section 7.1, there is no
  dropout during pre-training.
- ALBERT, Section 7.2, Tables 5 and 6: `albert_base_<variant>_<h>`.
- BERT, Section 7.3, Table 7: `bert_base_relative_<variant>_<h>`, with T5's
  relative position bias in place of the position table.
- Fixed head size (Bhojanapalli et al., 2020, Table 3(A)): 24 layers of
  width 768 with h heads of size 128, `bert_fixed_head_128_h<h>`.

Tiny presets for CPU tests and demos: `bert_tiny`, `albert_tiny`, `t5_tiny`,
`t5_tiny_lm` (its decoder alone, Mesh TensorFlow's LM), and the decoder-only `lm_tiny` (Llama-shaped: 4 heads over 2 key and value
heads), `gpt2_tiny` and `pythia_tiny`, each of 2 layers of width 32.
"""

import dataclasses
from typing import Union

from thattn.core import validation
from thattn.models import config as config_lib
# The table below spells the configs by class name.
from thattn.models.config import AttentionConfig
from thattn.models.config import BertConfig
from thattn.models.config import DecoderConfig
from thattn.models.config import T5Config

_CONFIG_TYPES = (BertConfig, T5Config, DecoderConfig)


@dataclasses.dataclass(frozen=True)
class Preset:
  config: Union[BertConfig, T5Config, DecoderConfig]
  source: str


PRESETS = {}


def _add(name, config, source):
  PRESETS[name] = Preset(config, source)


def _derive(name, base, source, **overrides):
  _add(name, config_lib.apply_overrides(PRESETS[base].config, **overrides),
       source)


# ---- published architectures ----------------------------------------------
_add("bert_base", BertConfig(),
     "Devlin et al. 2018, BERT-Base uncased (bert_config.json)")
_add("bert_large",
     BertConfig(d_model=1024, num_layers=24, d_ff=4096,
                attention=AttentionConfig(num_heads=16)),
     "Devlin et al. 2018, BERT-Large uncased (bert_config.json)")
_add("albert_base",
     BertConfig(vocab_size=30000, embedding_size=128, share_layers=True,
                activation="gelu_approximate", dropout_rate=0.0),
     "Lan et al. 2019, Table 1, ALBERT base; albert_base v2 config")
# T5's d_kv = 64 is d_model / h here, so that a `num_heads=` override keeps
# h * d_k = d_model as the paper's Table 1 does; `key_dim=` fixes it instead.
_add("t5_base", T5Config(),
     "Raffel et al. 2019, Section 3.1.1, T5-Base (t5-base checkpoint)")
_add("t5_1_1_base",
     dataclasses.replace(PRESETS["t5_base"].config, d_ff=2048,
                         activation="gelu_approximate",
                         gated_feed_forward=True, tie_embeddings=False),
     "T5.1.1-Base (released t5.1.1 gin config): gated-GELU, untied")

# Decoder-only LMs. DecoderConfig's defaults are GPT-2 small's.
_add("gpt2", DecoderConfig(),
     "Radford et al. 2019, GPT-2 small (the released gpt2 config.json)")
_PYTHIA = dict(vocab_size=50304, position_embedding="rotary",
               max_position_embeddings=2048, rotary_pct=0.25,
               activation="gelu", parallel_residual=True,
               tie_embeddings=False, dropout_rate=0.0)
_add("pythia_160m",
     DecoderConfig(**_PYTHIA, attention=AttentionConfig(num_heads=12)),
     "Biderman et al. 2023, Table 1, Pythia-160M "
     "(EleutherAI/pythia-160m config.json)")
_add("pythia_410m",
     DecoderConfig(**_PYTHIA, d_model=1024, num_layers=24, d_ff=4096,
                   attention=AttentionConfig(num_heads=16)),
     "Biderman et al. 2023, Table 1, Pythia-410M "
     "(EleutherAI/pythia-410m config.json)")
_LLAMA = dict(position_embedding="rotary", norm="rms_norm",
              activation="silu", gated_feed_forward=True, use_bias=False,
              dropout_rate=0.0)
_add("llama_3_2_1b",
     DecoderConfig(
         **_LLAMA, vocab_size=128256, d_model=2048, num_layers=16, d_ff=8192,
         attention=AttentionConfig(num_heads=32, key_dim=64,
                                   num_key_value_heads=8),
         max_position_embeddings=131072, rotary_base=500000.0,
         rotary_scaling=dict(factor=32.0, low_freq_factor=1.0,
                             high_freq_factor=4.0,
                             original_max_position_embeddings=8192)),
     "Meta 2024, Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json)")
# DCMHA's releases (docs/family_sources.md, 1.2): the q/k RMSNorm with
# epsilon 1e-6, local (window 256, so 257 keys in the released prefill)
# and global layers alternating from the first, vocab 50257, 2048
# positions, untied.
_DCFORMER = dict(vocab_size=50257, position_embedding="rotary",
                 max_position_embeddings=2048, tie_embeddings=False,
                 dropout_rate=0.0, query_key_norm=True,
                 query_key_epsilon=1e-6, sliding_window=257,
                 window_pattern="LG")
_add("dcformer_2p8b",
     DecoderConfig(**dict(_LLAMA, **_DCFORMER), d_model=2560, num_layers=32,
                   d_ff=6912, layer_norm_epsilon=1e-6,
                   attention=AttentionConfig("dcmha", num_heads=32)),
     "Xiao et al. 2024, DCFormer-2.8B (Caiyun-AI/DCFormer "
     "pytorch/dcformer/config.json at 39e6198): SwiGLU, RMSNorm")
_add("dcpythia_6p9b",
     DecoderConfig(**dict(_PYTHIA, **_DCFORMER), d_model=4096,
                   num_layers=32, d_ff=16384,
                   attention=AttentionConfig("dcmha", num_heads=32)),
     "Xiao et al. 2024, DCPythia-6.9B (Caiyun-AI/DCFormer "
     "pytorch/dcpythia/config.json): Pythia-6.9B's block, LayerNorm, the "
     "parallel residual, a quarter of each head rotated")

# ---- tiny, for CPU ----------------------------------------------------------
_TINY_ATTENTION = AttentionConfig(num_heads=4)
_add("bert_tiny",
     BertConfig(vocab_size=128, d_model=32, num_layers=2, d_ff=64,
                attention=_TINY_ATTENTION, max_position_embeddings=64),
     "thattn: a 2-layer BERT of width 32 for CPU tests")
_add("albert_tiny",
     BertConfig(vocab_size=128, d_model=32, num_layers=2, d_ff=64,
                attention=_TINY_ATTENTION, max_position_embeddings=64,
                embedding_size=16, share_layers=True,
                activation="gelu_approximate"),
     "thattn: a 2-layer ALBERT of width 32, E=16, for CPU tests")
# Relative positions to T5's distance 128, which Mesh TensorFlow fixes: the
# tiny T5 trains and converts there too (thattn.mtf).
_add("t5_tiny",
     T5Config(vocab_size=64, d_model=32, num_layers=2, d_ff=64,
              encoder_self_attention=_TINY_ATTENTION,
              decoder_self_attention=_TINY_ATTENTION,
              encoder_decoder_attention=_TINY_ATTENTION,
              relative_num_buckets=8),
     "thattn: a 2+2-layer T5 of width 32 for CPU tests")
_add("lm_tiny",
     DecoderConfig(**_LLAMA, vocab_size=128, d_model=32, num_layers=2,
                   d_ff=64, attention=AttentionConfig(num_heads=4,
                                                      num_key_value_heads=2),
                   max_position_embeddings=128),
     "thattn: a 2-layer Llama-shaped LM of width 32 (4 heads over 2 key and "
     "value heads) for CPU tests and demos")
_TINY_LM = dict(vocab_size=128, d_model=32, num_layers=2, d_ff=64,
                attention=_TINY_ATTENTION, max_position_embeddings=128)
_add("gpt2_tiny", DecoderConfig(**_TINY_LM),
     "thattn: a 2-layer GPT-2-shaped LM of width 32 for CPU tests")
_add("pythia_tiny", DecoderConfig(**dict(_PYTHIA, **_TINY_LM)),
     "thattn: a 2-layer Pythia-shaped LM of width 32 (a quarter of each "
     "head rotated, the parallel residual) for CPU tests")
_derive("t5_tiny_lm", "t5_tiny", "thattn: t5_tiny's decoder alone, a "
        "language model (Mesh TensorFlow's LM Unitransformer), for the "
        "causal LM on every backend", stacks="decoder")
_derive("t5_tiny_encoder", "t5_tiny", "thattn: t5_tiny's encoder with its LM "
        "head (Mesh TensorFlow's aligned Unitransformer), for masked LM",
        stacks="encoder")

# ---- the paper's T5 experiments (Section 7.1; no pre-training dropout) -----
_T5_TABLES = "Shazeer et al. 2020, talking heads, "
_NO_DROPOUT = dict(dropout_rate=0.0)
for _h in (6, 12, 24, 48):
  _derive(f"t5_base_multi_head_{_h}", "t5_base", _T5_TABLES + "Table 1",
          attention="multi_head", num_heads=_h, **_NO_DROPOUT)
  _derive(f"t5_base_talking_heads_{_h}", "t5_base", _T5_TABLES + "Table 1",
          attention="talking_heads", num_heads=_h,
          **_NO_DROPOUT)
_derive("t5_base_multi_head_24_dk64", "t5_base",
        _T5_TABLES + "Table 1 (24 heads of d_k = d_v = 64)",
        num_heads=24, key_dim=64, **_NO_DROPOUT)
_derive("t5_base_general_bilinear_12", "t5_base", _T5_TABLES + "Table 1",
        attention="general_bilinear", num_heads=12,
        **_NO_DROPOUT)
# Table 2: (h_k, h, h_v, d_k, d_v).
for _hk, _h, _hv, _dk, _dv in ((6, 24, 6, 128, 128), (24, 6, 24, 32, 32),
                               (6, 24, 24, 128, 32), (24, 24, 6, 32, 128)):
  _derive(f"t5_base_talking_heads_{_hk}_{_h}_{_hv}", "t5_base",
          _T5_TABLES + f"Table 2 (d_k={_dk}, d_v={_dv})",
          attention="talking_heads", num_key_heads=_hk, num_heads=_h,
          num_value_heads=_hv, key_dim=_dk, value_dim=_dv, **_NO_DROPOUT)
for _variant in ("project_logits", "project_weights"):
  _derive(f"t5_base_{_variant}_24", "t5_base", _T5_TABLES + "Table 3",
          attention=_variant, num_heads=24, **_NO_DROPOUT)
# Table 4: talking heads in one attention type, multi-head (24 heads of 32)
# in the other two.
for _name, _kind in (("enc_self", "encoder_self_attention"),
                     ("dec_self", "decoder_self_attention"),
                     ("encdec", "encoder_decoder_attention")):
  _derive(f"t5_base_th_{_name}_24", "t5_base", _T5_TABLES + "Table 4",
          num_heads=24, **{_kind: "talking_heads"},
          **_NO_DROPOUT)
# Tables 8 and 9: dynamic projections, all four or one at a time.
for _h in (12, 24):
  _derive(f"t5_base_dynamic_{_h}", "t5_base", _T5_TABLES + "Table 8",
          attention="dynamic", num_heads=_h, **_NO_DROPOUT)
for _projection in ("x2l", "x2w", "m2l", "m2w"):
  _derive(f"t5_base_dynamic_{_projection}_12", "t5_base",
          _T5_TABLES + "Table 9", attention="talking_heads", num_heads=12,
          dynamic_projections=(_projection,), **_NO_DROPOUT)
# Table 10: dynamic projections in the encoder self-attention only.
_derive("t5_base_dp_enc_self_24", "t5_base", _T5_TABLES + "Table 10",
        num_heads=24, encoder_self_attention="dynamic",
        **_NO_DROPOUT)

# ---- the paper's ALBERT experiments (Section 7.2) ---------------------------
for _h in (6, 12, 24, 48):
  for _variant in ("multi_head", "talking_heads"):
    _derive(f"albert_base_{_variant}_{_h}", "albert_base",
            _T5_TABLES + "Table 5", attention=_variant, num_heads=_h)
for _variant in ("project_logits", "project_weights"):
  _derive(f"albert_base_{_variant}_12", "albert_base",
          _T5_TABLES + "Table 6", attention=_variant, num_heads=12)

# ---- the paper's BERT experiments (Section 7.3, relative positions) --------
_derive("bert_base_relative_multi_head_12", "bert_base",
        _T5_TABLES + "Table 7", position_embedding="relative")
for _h in (6, 12, 24, 48, 64, 96, 192, 384, 768):
  _derive(f"bert_base_relative_talking_heads_{_h}", "bert_base",
          _T5_TABLES + "Table 7", position_embedding="relative",
          attention="talking_heads", num_heads=_h)

# ---- fixed head size (Bhojanapalli et al. 2020, Table 3(A)) -----------------
for _h in (8, 12, 16, 20):
  _derive(f"bert_fixed_head_128_h{_h}", "bert_base",
          "Bhojanapalli et al. 2020, Table 3(A): 24 layers, d_model 768, "
          "head size 128", num_layers=24, num_heads=_h, key_dim=128)


def preset_names():
  return sorted(PRESETS)


def get_preset(name):
  validation.one_of("preset", name, preset_names())
  return PRESETS[name]


def model_config(preset, **overrides):
  """The frozen config of a preset name (or config) with overrides applied
  (plain Python: both model front ends build from it)."""
  if isinstance(preset, _CONFIG_TYPES):
    config = preset
  elif isinstance(preset, str):
    config = get_preset(preset).config
  else:
    raise ValueError(f"preset must be a preset name or a BertConfig / "
                     f"T5Config / DecoderConfig, got {preset!r}.")
  return config_lib.apply_overrides(config, **overrides)
