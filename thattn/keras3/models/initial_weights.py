"""A Keras 3 model's initial weights drawn from the run's seed by weight
name (`thattn.core.initial_weights`): the same values the tf_keras model of
that seed gets (`thattn.models.initial_weights`), without building it.

Each weight's initializer is read where its layer keeps it: Keras's
convention, weight `w` (or `_w` behind a property) beside `w_initializer`
(Dense's and EinsumDense's `kernel` and `bias`, LayerNormalization's
`gamma` and `beta`, thattn's embeddings, RMSNorm's `scale`, the masked-LM
head's `output_bias`), and the attention layers' `weight_initializers`
for what they make themselves (P_l, P_w, a registered variant's own
weights).
"""

import keras

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
      name = attribute[:-len(_SUFFIX)]
      weight = own.get(name, own.get("_" + name))
      if isinstance(weight, keras.Variable):
        found.setdefault(id(weight), (weight, initializer))
    by_path = getattr(layer, "weight_initializers", None) or {}
    for weight in layer.weights:
      if weight.path in by_path:
        found.setdefault(id(weight), (weight, by_path[weight.path]))
  weights = {id(w): w for layer in layers for w in layer.weights}
  missing = sorted(w.path for key, w in weights.items() if key not in found)
  if missing:
    raise ValueError(
        f"No initializer is known for the weights {', '.join(missing)}: a "
        "run's initial weights are drawn from each weight's initializer, "
        "which its layer keeps as `<weight>_initializer` (Keras's "
        "convention) or in `weight_initializers` (thattn's attention "
        "layers).")
  return [(weight, keras.initializers.serialize(
      keras.initializers.get(initializer)))
          for key, (weight, initializer) in found.items() if key in weights]


def assign(layers, seed):
  """Sets every weight of `layers` to its seeded draw
  (`thattn.core.initial_weights.sample`); returns how many it set."""
  pairs = initializers_of(layers)
  for weight, config in pairs:
    weight.assign(initial_weights.sample(config, weight.shape, seed,
                                         weight.path))
  return len(pairs)


def _layers_in(layers):
  """Every Keras 3 layer of `layers`, theirs included, once each
  (`_flatten_layers`: Keras keeps no public recursive list)."""
  seen = {}
  for layer in layers:
    for sublayer in layer._flatten_layers(include_self=True, recursive=True):  # pylint: disable=protected-access
      seen.setdefault(id(sublayer), sublayer)
  return list(seen.values())
