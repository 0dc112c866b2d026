"""Presets, overrides and their errors: configs only, no TensorFlow graphs."""

import dataclasses

import pytest

from thattn import models

AttentionConfig = models.AttentionConfig


def test_every_preset_cites_its_source_and_is_a_valid_config():
  assert len(models.PRESETS) > 40
  for name, preset in models.PRESETS.items():
    assert preset.source, name
    assert isinstance(preset.config, (models.BertConfig, models.T5Config,
                                      models.DecoderConfig))
    # A frozen config re-validates as itself.
    assert dataclasses.replace(preset.config) == preset.config


def test_published_presets_have_the_published_shapes():
  bert = models.model_config("bert_base")
  assert (bert.vocab_size, bert.d_model, bert.num_layers, bert.d_ff) == (
      30522, 768, 12, 3072)
  assert bert.attention.head_dims(768) == (64, 64)
  assert (bert.max_position_embeddings, bert.type_vocab_size) == (512, 2)
  assert bert.family == "bert" and bert.use_bias
  albert = models.model_config("albert_base")
  assert (albert.vocab_size, albert.embedding_size, albert.share_layers) == (
      30000, 128, True)
  assert albert.family == "albert"
  t5 = models.model_config("t5_base")
  assert (t5.vocab_size, t5.d_model, t5.num_layers, t5.decoder_layers,
          t5.d_ff) == (32128, 768, 12, 12, 3072)
  assert t5.tie_embeddings and t5.activation == "relu"
  for kind in models.ATTENTION_TYPES:
    assert getattr(t5, kind).head_dims(768) == (64, 64)


def test_paper_presets_follow_the_tables():
  config = models.model_config("t5_base_talking_heads_24")
  for kind in models.ATTENTION_TYPES:
    attention = getattr(config, kind)
    assert attention.variant == "talking_heads"
    assert (attention.key_heads, attention.num_heads,
            attention.value_heads) == (24, 24, 24)
    assert attention.head_dims(768) == (32, 32)
  assert config.dropout_rate == 0.0  # no dropout in pre-training, Sec. 7.1

  table2 = models.model_config("t5_base_talking_heads_24_24_6")
  attention = table2.encoder_self_attention
  assert (attention.key_heads, attention.num_heads, attention.value_heads,
          *attention.head_dims(768)) == (24, 24, 6, 32, 128)

  table4 = models.model_config("t5_base_th_encdec_24")
  assert [getattr(table4, kind).variant for kind in models.ATTENTION_TYPES
         ] == ["multi_head", "multi_head", "talking_heads"]
  assert {getattr(table4, kind).num_heads
          for kind in models.ATTENTION_TYPES} == {24}

  table9 = models.model_config("t5_base_dynamic_m2w_12").decoder_self_attention
  assert table9.dynamic_projections == ("m2w",)

  bert = models.model_config("bert_base_relative_talking_heads_768")
  assert bert.position_embedding == "relative"
  assert bert.attention.head_dims(768) == (1, 1)


def test_attention_override_sets_every_layer_and_per_type_overrides_win():
  config = models.model_config(
      "t5_tiny", attention="talking_heads", num_heads=8, num_key_heads=2,
      decoder_self_attention="multi_head",
      encoder_decoder_attention={"variant": "dynamic", "num_key_heads": 8})
  encoder = config.encoder_self_attention
  assert (encoder.variant, encoder.num_heads, encoder.key_heads) == (
      "talking_heads", 8, 2)
  assert config.decoder_self_attention.variant == "multi_head"
  assert config.encoder_decoder_attention.variant == "dynamic"
  assert config.encoder_decoder_attention.key_heads == 8
  replaced = AttentionConfig("general_bilinear", num_heads=2)
  assert models.model_config(
      "t5_tiny", encoder_self_attention=replaced).encoder_self_attention == (
          replaced)


def test_sizes_and_fixed_head_size_overrides():
  config = models.model_config("bert_tiny", num_layers=3, d_model=48,
                               d_ff=96, vocab_size=50, dropout_rate=0.2)
  assert (config.num_layers, config.d_model, config.d_ff,
          config.vocab_size, config.dropout_rate) == (3, 48, 96, 50, 0.2)
  assert config.attention.head_dims(48) == (12, 12)
  # An explicit key_dim frees d_k from d_model / h, so h need not divide.
  fixed = models.model_config("bert_tiny", num_heads=5, key_dim=16,
                              value_dim=8)
  assert fixed.attention.head_dims(32) == (16, 8)


def test_a_config_object_is_a_preset_too():
  config = models.model_config("albert_tiny")
  assert models.model_config(config, num_layers=4).num_layers == 4


@pytest.mark.parametrize("preset, overrides, message", [
    ("bert_huge", {}, "Unknown preset 'bert_huge'"),
    ("bert_tiny", {"num_layer": 3}, r"Unknown override\(s\) \['num_layer'\]"),
    ("bert_tiny", {"encoder_self_attention": "talking_heads"},
     r"Unknown override\(s\) \['encoder_self_attention'\]"),
    ("bert_base", {"num_heads": 7},
     "num_heads=7 does not divide d_model=768"),
    ("t5_tiny", {"decoder_self_attention": {"num_heads": 3}},
     "decoder_self_attention: num_heads=3 does not divide d_model=32"),
    ("bert_tiny", {"attention": "talking_head"},
     "unknown attention variant 'talking_head'"),
    ("bert_tiny", {"dynamic_projections": ["x2l"]},
     r"variant 'multi_head': dynamic projection 'x2l' is added to the "
     r"static P_l"),
    ("bert_tiny", {"attention": "project_logits",
                   "dynamic_projections": ["m2w"]},
     r"variant 'project_logits': dynamic projection 'm2w' is added to the "
     r"static P_w"),
    ("bert_tiny", {"dynamic_projections": "x2l"},
     "got the string 'x2l'"),
    ("bert_tiny", {"num_key_heads": 2},
     r"multi_head has no P_l\[h_k, h\], so num_key_heads=2 must equal "
     "num_heads=4"),
    ("bert_tiny", {"attention": "project_logits", "num_value_heads": 2},
     r"project_logits has no P_w\[h, h_v\], so num_value_heads=2 must equal "
     "num_heads=4"),
    ("bert_tiny", {"attention": "project_weights", "num_key_heads": 8},
     "num_key_heads=8 must equal num_heads=4"),
    ("bert_tiny", {"num_heads": 0}, "num_heads must be a positive integer"),
    ("t5_tiny", {"d_model": -4}, "d_model must be a positive integer, got -4"),
    ("t5_tiny", {"dropout_rate": 1.5}, r"dropout_rate must be in \[0, 1\)"),
    ("t5_tiny", {"activation": "swish"}, "unknown activation 'swish'"),
    ("bert_tiny", {"position_embedding": "rotary"},
     "unknown position_embedding 'rotary'"),
    ("t5_tiny", {"attention": {"heads": 2}},
     r"unknown attention fields \['heads'\]"),
    ("t5_tiny", {"attention": 3}, "must be a variant name"),
])
def test_bad_overrides_raise_value_errors_naming_the_values(preset, overrides,
                                                            message):
  with pytest.raises(ValueError, match=message):
    models.create_model(preset, **overrides)


def test_bad_preset_type_is_a_value_error():
  with pytest.raises(ValueError, match="preset must be a preset name"):
    models.model_config(42)


@pytest.mark.parametrize("options, message", [
    ({"method": "nucleus"}, "Unknown method 'nucleus'"),
    ({"temperature": 0.0}, "temperature must be positive, got 0.0"),
    ({"max_length": 0}, "max_length must be a positive integer, got 0"),
    ({"beam_size": 0}, "beam_size must be a positive integer, got 0"),
    ({"top_k": -1}, "top_k must be an integer >= 0, got -1"),
])
def test_bad_generation_options_raise_value_errors(options, message):
  arguments = dict(max_length=4)
  arguments.update(options)
  # The options are checked before the model is looked at.
  with pytest.raises(ValueError, match=message):
    models.T5Generator(None, **arguments)
