"""`create_model(preset, **overrides)` for Keras 3: thattn.models' presets
and configs to a Keras 3 model."""

from thattn.keras3.models import bert
from thattn.keras3.models import t5
from thattn.models import config as config_lib
from thattn.models import presets


def build_model(config, name=None):
  """The Keras 3 functional model of a `BertConfig` or `T5Config`."""
  if isinstance(config, config_lib.T5Config):
    return t5.build_t5(config, name=name)
  if isinstance(config, config_lib.BertConfig):
    return bert.build_bert(config, name=name)
  raise ValueError(f"Expected a BertConfig or T5Config, got {config!r}.")


def create_model(preset, **overrides):
  """The Keras 3 twin of `thattn.models.create_model(preset, **overrides)`:
  the same config, the same weights' names, shapes and order."""
  config = presets.model_config(preset, **overrides)
  return build_model(config, name=preset if isinstance(preset, str) else None)
