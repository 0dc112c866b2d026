"""Task heads in Keras 3, and how a Keras 3 model's weights meet their
tf_keras twins'.

`MaskedLMHead`, `ClassificationHead` and `SpanHead` are the heads of the
tasks masked LM, classification and SQuAD (`thattn.tasks`), their
computations written once for both front ends in `thattn.models.
task_wiring`; this module adds Keras 3's glue. They have the tf_keras
heads' weights' names (`thattn.core.weight_names.shared_name`), so a tf_keras
run's head moves into them by name (`pair_by_name`).
"""

import keras

from thattn.core import weight_names
from thattn.keras3.models import blocks
from thattn.keras3.models import embeddings
from thattn.keras3.models import front_end
from thattn.models import task_wiring


def pair_by_name(sources, targets):
  """[(source, target)] of two lists of weights with the same shared names.

  Args:
    sources: objects with `.name` and `.shape` (tf_keras variables).
    targets: Keras 3 variables (their `.path` is the name).
  Raises:
    ValueError naming the weights one side has and the other lacks, or
    whose shapes differ.
  """
  shared = weight_names.shared_name
  by_name = {shared(source.name): source for source in sources}
  targets_by_name = {shared(target.path): target for target in targets}
  missing = sorted(set(by_name) ^ set(targets_by_name))
  if missing:
    raise ValueError(f"The two models' weights differ in name: "
                     f"{', '.join(missing[:6])}"
                     f"{' ...' if len(missing) > 6 else ''}.")
  pairs = []
  for name, target in targets_by_name.items():
    source = by_name[name]
    if tuple(source.shape) != tuple(target.shape):
      raise ValueError(f"Weight {name}: shape {tuple(source.shape)} in the "
                       f"tf_keras model, {tuple(target.shape)} in Keras 3.")
    pairs.append((source, target))
  return pairs


def _build_sublayer(layer, input_shape):
  if not layer.built:
    layer.build(tuple(input_shape))


@keras.saving.register_keras_serializable(package="thattn")
class MaskedLMHead(task_wiring.MaskedLMHeadWiring, keras.layers.Layer):
  """Float32 logits [b, p, t] at the masked positions (`thattn.tasks.mlm.
  MaskedLMHead`; the computation is `thattn.models.task_wiring.
  MaskedLMHeadWiring`'s).

  Args:
    embedding: the backbone's `TokenEmbedding` (`word_embeddings`), whose
      table scores the outputs (tied; not serialized).
    activation: a name from thattn.models.config.ACTIVATIONS.
    initializer_range: stddev of the truncated-normal transform kernel.
  """

  # The front end's glue for task_wiring.MaskedLMHeadWiring.
  _framework = keras
  _ops = front_end.KERAS3_OPS
  _activation_of = staticmethod(blocks.activation_function)
  _TokenEmbedding = embeddings.TokenEmbedding
  _build_sublayer = staticmethod(_build_sublayer)


@keras.saving.register_keras_serializable(package="thattn")
class ClassificationHead(task_wiring.ClassificationHeadWiring,
                         keras.layers.Layer):
  """Logits [b, num_classes] (regression: [b]) from a pooled output [b, d]
  (`thattn.tasks.classification.ClassificationHead`; the computation is
  `thattn.models.task_wiring.ClassificationHeadWiring`'s)."""

  _framework = keras
  _build_sublayer = staticmethod(_build_sublayer)


@keras.saving.register_keras_serializable(package="thattn")
class SpanHead(task_wiring.SpanHeadWiring, keras.layers.Layer):
  """(start_logits, end_logits) [b, n] from a sequence output [b, n, d]
  (`thattn.tasks.squad.SpanHead`; the computation is `thattn.models.
  task_wiring.SpanHeadWiring`'s)."""

  _framework = keras
  _ops = front_end.KERAS3_OPS
  _build_sublayer = staticmethod(_build_sublayer)
