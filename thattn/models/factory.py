"""`create_model(preset, **overrides)`: a preset or a config to a model."""

from thattn.models import front_end
from thattn.models import wiring


def build_model(config, name=None):
  """The functional tf_keras model of a `BertConfig` or `T5Config`."""
  return wiring.build_model(config, front_end.TF_KERAS, name)


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
  return wiring.create_model(preset, front_end.TF_KERAS, **overrides)
