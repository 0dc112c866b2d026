"""thattn.keras3.models on one Keras 3 backend: the tf_keras models' weights.

Run by `models_test.py` in a process per backend (KERAS_BACKEND set), with
THATTN_MODELS_EXCHANGE naming a folder where the parent left, per case, a
tf_keras model's weights, names, inputs and outputs (`<case>.tf_keras.npz`).
Each check builds the Keras 3 model of the same preset, compares names and
shapes, sets the tf_keras weights and compares the outputs; then leaves its
own random weights and outputs (`<case>.<backend>.npz`) for the parent to
check the other direction. The weights a run draws from its seed are the
tf_keras model's draws (`drawn_<index>`), without that model.
"""

import os
import pathlib

import keras
from keras import ops
import numpy as np
import pytest

from thattn.keras3 import models
from thattn.keras3.models import initial_weights

EXCHANGE = pathlib.Path(os.environ.get("THATTN_MODELS_EXCHANGE", "."))
BACKEND = keras.backend.backend()
DRAW_SEED = 11  # the seed both front ends' models are drawn from


def normalized_name(name):
  """A weight's name without ':0' and without tf_keras's doubled scope
  ('block_0/attention/attention/query/kernel' -> 'block_0/attention/query/
  kernel'): what the two front ends' names share."""
  parts = name.split(":")[0].split("/")
  return "/".join(part for index, part in enumerate(parts)
                  if index == 0 or part != parts[index - 1])


def outputs_of(model, inputs):
  outputs = model(inputs, training=False)
  if isinstance(outputs, dict):
    return {key: np.asarray(ops.convert_to_numpy(value))
            for key, value in outputs.items()}
  return {"logits": np.asarray(ops.convert_to_numpy(outputs))}


def cases():
  return sorted(path.name.split(".")[0]
                for path in EXCHANGE.glob("*.tf_keras.npz"))


@pytest.mark.parametrize("case", cases())
def test_tf_keras_weights_give_the_same_outputs(case):
  saved = np.load(EXCHANGE / f"{case}.tf_keras.npz", allow_pickle=False)
  preset, attention = str(saved["preset"]), str(saved["attention"])
  model = models.create_model(preset, attention=attention)
  names = [normalized_name(w.path) for w in model.weights]
  assert names == [normalized_name(n) for n in saved["names"]]
  weights = [saved[f"weight_{index}"] for index in range(len(names))]
  assert [tuple(w.shape) for w in model.weights] == [w.shape for w in
                                                      weights]
  model.set_weights(weights)
  inputs = {key[len("input_"):]: saved[key] for key in saved.files
            if key.startswith("input_")}
  got = outputs_of(model, inputs)
  for key, value in got.items():
    want = saved[f"output_{key}"]
    scale = np.abs(want).max()
    np.testing.assert_allclose(value, want, rtol=0, atol=1e-5 * scale,
                               err_msg=f"{case}: {key}")
  # The other direction: this model's own weights, random, for the parent.
  rng = np.random.default_rng(1)
  own = [rng.normal(size=w.shape).astype("float32") * 0.2 for w in weights]
  model.set_weights(own)
  mine = outputs_of(model, inputs)
  np.savez(EXCHANGE / f"{case}.{BACKEND}.npz",
           **{f"weight_{index}": w for index, w in enumerate(own)},
           **{f"output_{key}": value for key, value in mine.items()})


@pytest.mark.parametrize("case", cases())
def test_the_seeded_draw_is_the_tf_keras_model_s(case):
  saved = np.load(EXCHANGE / f"{case}.tf_keras.npz", allow_pickle=False)
  model = models.create_model(str(saved["preset"]),
                              attention=str(saved["attention"]))
  assert initial_weights.assign([model], DRAW_SEED) == len(model.weights)
  drawn = {normalized_name(name): saved[f"drawn_{index}"]
           for index, name in enumerate(saved["names"])}
  for weight in model.weights:
    np.testing.assert_array_equal(ops.convert_to_numpy(weight.value),
                                  drawn[normalized_name(weight.path)],
                                  err_msg=f"{case}: {weight.path}")
