"""`create_model(preset, **overrides)`: a preset or a config to a model."""

from thattn.models import bert
from thattn.models import config as config_lib
from thattn.models import presets
from thattn.models import t5

# The config of a preset with overrides: plain Python, in presets.
model_config = presets.model_config


def build_model(config, name=None):
  """The functional model of a `BertConfig` or `T5Config`."""
  if isinstance(config, config_lib.T5Config):
    return t5.build_t5(config, name=name)
  if isinstance(config, config_lib.BertConfig):
    return bert.build_bert(config, name=name)
  raise ValueError(f"Expected a BertConfig or T5Config, got {config!r}.")


def create_model(preset, **overrides):
  """Builds the backbone of `preset` (a name or a config) with overrides.

  BERT and ALBERT: the encoder with its pooler (see `thattn.models.bert`).
  T5: encoder and decoder with the LM head (see `thattn.models.t5`).
  Overrides are config fields and the attention options described in
  `thattn.models.config`; for example
  `create_model("t5_base", attention="talking_heads", num_heads=24)` or
  `create_model("t5_base", encoder_self_attention="talking_heads")`.
  The model is named after the preset.
  """
  config = model_config(preset, **overrides)
  return build_model(config, name=preset if isinstance(preset, str) else None)
