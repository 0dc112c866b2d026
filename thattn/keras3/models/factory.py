"""`create_model(preset, **overrides)` for Keras 3: thattn.models' presets
and configs to a Keras 3 model."""

from thattn.keras3.models import front_end
from thattn.models import wiring


def build_model(config, name=None):
  """The Keras 3 functional model of a `BertConfig` or `T5Config`."""
  return wiring.build_model(config, front_end.KERAS3, name)


def create_model(preset, **overrides):
  """The Keras 3 twin of `thattn.models.create_model(preset, **overrides)`:
  the same config, the same weights' names, shapes and order."""
  return wiring.create_model(preset, front_end.KERAS3, **overrides)
