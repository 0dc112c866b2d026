"""A tf_keras model's initial weights drawn from the run's seed by weight
name (`thattn.core.initial_weights`), so that a Keras run and a keras3 run
of one seed start equal without either building the other's model
(`thattn.keras3.models.initial_weights` draws the Keras 3 model's).

Each weight's initializer is read where its layer keeps it: Keras's
convention, weight `w` beside `w_initializer` (Dense's and EinsumDense's
`kernel` and `bias`, LayerNormalization's `gamma` and `beta`, Embedding's
and thattn's embeddings, RMSNorm's `scale`, the masked-LM head's
`output_bias`), and the attention layers' `weight_initializers` for what
they make themselves (P_l, P_w, a registered variant's own weights).
"""

import tf_keras

from thattn.core import initial_weights

_SUFFIX = "_initializer"


def initializers_of(layers):
  """[(variable, serialized initializer)] of every weight of `layers` (and
  their sublayers), each weight once.

  Raises:
    ValueError naming the weights whose layers keep no initializer for
    them.
  """
  found = {}
  for layer in _layers_in(layers):
    own = vars(layer)
    for attribute, initializer in own.items():
      if not attribute.endswith(_SUFFIX) or initializer is None:
        continue
      weight = own.get(attribute[:-len(_SUFFIX)])
      if weight is not None and hasattr(weight, "assign"):
        found.setdefault(id(weight), (weight, initializer))
    by_name = getattr(layer, "weight_initializers", None) or {}
    for weight in layer.weights:
      if weight.name in by_name:
        found.setdefault(id(weight), (weight, by_name[weight.name]))
  weights = {id(w): w for layer in layers for w in layer.weights}
  missing = sorted(w.name for key, w in weights.items() if key not in found)
  if missing:
    raise ValueError(
        f"No initializer is known for the weights {', '.join(missing)}: a "
        "run's initial weights are drawn from each weight's initializer, "
        "which its layer keeps as `<weight>_initializer` (Keras's "
        "convention) or in `weight_initializers` (thattn's attention "
        "layers).")
  return [(weight, tf_keras.initializers.serialize(
      tf_keras.initializers.get(initializer)))
          for key, (weight, initializer) in found.items() if key in weights]


def assign(layers, seed):
  """Sets every weight of `layers` to its seeded draw
  (`thattn.core.initial_weights.sample`); returns how many it set."""
  pairs = initializers_of(layers)
  for weight, config in pairs:
    weight.assign(initial_weights.sample(config, weight.shape, seed,
                                         weight.name))
  return len(pairs)


def _layers_in(layers):
  """Every tf_keras layer of `layers`, theirs included, once each."""
  seen = {}
  for layer in layers:
    for module in [layer, *layer.submodules]:
      if isinstance(module, tf_keras.layers.Layer):
        seen.setdefault(id(module), module)
  return list(seen.values())
