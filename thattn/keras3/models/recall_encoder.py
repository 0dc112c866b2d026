"""The recall task's model in Keras 3 (`thattn.models.RecallEncoder`'s
twin: the same weights, by name; the model is `thattn.models.task_wiring.
RecallEncoderWiring`'s, this module adds Keras 3's glue)."""

import keras

from thattn.keras3 import relative_position
from thattn.keras3.models import front_end
from thattn.models import task_wiring


@keras.saving.register_keras_serializable(package="thattn")
class RecallEncoder(task_wiring.RecallEncoderWiring, keras.Model):
  """Value logits [b, n, num_values] for (key, value) tokens [b, n, 2]."""

  # The front end's glue for task_wiring.RecallEncoderWiring.
  _framework = keras
  _ops = front_end.KERAS3_OPS
  _attention_front_end = "keras3"
  _RelativePositionBias = relative_position.RelativePositionBias
