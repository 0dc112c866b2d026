"""A small pre-norm Transformer encoder for the recall task.

The model of `thattn-train --task=recall` (`thattn.tasks.recall`). It exists
so that attention variants can be compared on a task that trains in minutes
on a CPU and that needs the heads to carry information (the low-rank
bottleneck of Bhojanapalli et al., 2020).

Per block (T5-style pre-norm, relative position bias shared by all blocks):
    x += attention(norm(x), norm(x), position_bias=B)
    x += W_2 relu(W_1 norm(x))
"""

import tf_keras

from thattn.ops import autograph
from thattn.layers import relative_position
from thattn.models import front_end
from thattn.models import task_wiring


@tf_keras.utils.register_keras_serializable(package="thattn")
class RecallEncoder(task_wiring.RecallEncoderWiring, tf_keras.Model):
  """Value classifier: logits[b, L, num_values] for (key, value) tokens[b, L, 2]
  (the model is `thattn.models.task_wiring.RecallEncoderWiring`'s).

  The input embedding is E_key[key] + E_value[value]; value ids run up to
  num_values, the last one meaning "unknown".
  """

  # The front end's glue for task_wiring.RecallEncoderWiring.
  _framework = tf_keras
  _ops = front_end.TF_KERAS_OPS
  _attention_front_end = "tf_keras"
  _RelativePositionBias = relative_position.RelativePositionBias

  call = autograph.unconverted(task_wiring.RecallEncoderWiring.call)
