"""A weight's name as both front ends and a keras3 checkpoint know it.

Plain Python: the tf_keras readers of a keras3 run's checkpoint and the
Keras 3 run that writes it name each weight the same way.
"""


def shared_name(name):
  """What a weight's name is in both front ends: without ':0' and without
  tf_keras's doubled attention scope ('block_0/attention/attention/query/
  kernel' -> 'block_0/attention/query/kernel')."""
  parts = name.split(":")[0].split("/")
  return "/".join(part for index, part in enumerate(parts)
                  if index == 0 or part != parts[index - 1])


def checkpoint_key(name):
  """The key of a weight (a tf_keras `name` or Keras 3 `path`) in a keras3
  run's Orbax checkpoint: 'weight.block_0.attention.query.kernel' (Orbax
  reads '/' in a key as a folder)."""
  return "weight." + shared_name(name).replace("/", ".")
