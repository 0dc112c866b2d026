"""Prints how `--backend=keras3 --mesh_shape=...` lays out a T5's weights.

Run by keras3_backend_test.py in a process of its own (KERAS_BACKEND=jax;
JAX's host platform is split into the mesh's devices before JAX starts):
`python keras3_mesh_script.py batch:2,model:2` prints one JSON object,
{"devices": N, "weights": {path: [mesh axis or null per dimension]},
"slots": {path: {slot: [...]}}} (Adafactor's slots of each trainable
weight), read from the sharded values JAX holds.
"""

import json
import sys

import jax

from thattn import models
from thattn import tasks
from thattn.training import keras3_backend
from thattn.training import keras3_mesh
from thattn.training import keras3_steps
from thattn.training import options as options_lib


def main(mesh_shape):
  options = options_lib.TrainOptions(backend="keras3", mesh_shape=mesh_shape,
                                     batch_size=4)
  mesh = keras3_mesh.KerasMesh(options)
  config = models.model_config("t5_tiny", vocab_size=128)
  task = tasks.get("span_corruption")
  with mesh.distribution(keras3_steps.TaskLoss(task, config)).scope():
    layer = keras3_steps.TaskLoss(task, config)
    optimizer = keras3_backend.make_optimizer(options)
    optimizer.build(layer.trainable_variables)
  weights = {weight.path: _axes(weight) for weight in layer.weights}
  slots = {weight.path: {name: _axes(slot) for name, slot in by_name.items()}
           for weight, by_name in zip(layer.trainable_variables,
                                      optimizer._slots)}  # pylint: disable=protected-access
  print(json.dumps({"devices": len(jax.devices()), "weights": weights,
                    "slots": slots}))


def _axes(variable):
  """The mesh axis (or None) of each dimension of a variable's value."""
  spec = tuple(variable.value.sharding.spec)
  spec += (None,) * (len(variable.shape) - len(spec))
  return [axis if axis is None else str(axis) for axis in spec]


if __name__ == "__main__":
  main(sys.argv[1])
