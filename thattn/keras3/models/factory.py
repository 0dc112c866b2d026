"""`create_model(preset, **overrides)` for Keras 3: thattn.models' presets
and configs to a Keras 3 model."""

from thattn.keras3.models import front_end
from thattn.models import wiring


def build_model(config, name=None):
  """The Keras 3 functional model of a `BertConfig` or `T5Config`."""
  return wiring.build_model(config, front_end.KERAS3, name)


def create_model(preset, **overrides):
  """The Keras 3 backbone of `preset` (a name of `thattn.models.PRESETS` or
  a `BertConfig` / `T5Config`) with `overrides`, named after the preset.

  BERT and ALBERT: the encoder with its pooler (`build_bert`); T5: encoder
  and decoder with the LM head (`build_t5`). `overrides` are
  `thattn.models.config`'s fields, for example
  `create_model("t5_base", attention="talking_heads", num_heads=24)`. The
  weights' names, shapes and order are those of the tf_keras model that
  `thattn.models.create_model` builds from the same arguments.
  """
  return wiring.create_model(preset, front_end.KERAS3, **overrides)
