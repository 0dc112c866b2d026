"""T5 decoding in Keras 3 on one backend: the tf_keras decode, token for
token.

Run by `decoding_test.py` in a process per backend (KERAS_BACKEND set),
with THATTN_DECODING_EXCHANGE naming a folder where the parent left, per
case, a tf_keras T5's weights, encoder inputs and its greedy decode
(`thattn.models.generate`). Each check builds the Keras 3 model of the same
preset, sets those weights and decodes with `thattn.keras3.models.
generation.T5Generator`: the same tokens, and scores within float32
rounding.
"""

import os
import pathlib

import keras
from keras import ops
import numpy as np
import pytest

from thattn.keras3 import models
from thattn.keras3.models import generation

EXCHANGE = pathlib.Path(os.environ.get("THATTN_DECODING_EXCHANGE", "."))


def cases():
  return sorted(path.name.split(".")[0]
                for path in EXCHANGE.glob("*.tf_keras.npz"))


@pytest.mark.parametrize("case", cases())
def test_the_greedy_decode_equals_tf_keras_s(case):
  saved = np.load(EXCHANGE / f"{case}.tf_keras.npz", allow_pickle=False)
  model = models.create_model(str(saved["preset"]),
                              attention=str(saved["attention"]),
                              tie_embeddings=bool(saved["tied"]))
  model.set_weights([saved[f"weight_{index}"]
                     for index in range(len(model.weights))])
  max_length = saved["tokens"].shape[1]
  generator = generation.T5Generator(model, max_length=max_length)
  decoded = generator(saved["encoder_tokens"])
  np.testing.assert_array_equal(ops.convert_to_numpy(decoded["tokens"]),
                                saved["tokens"])
  np.testing.assert_allclose(ops.convert_to_numpy(decoded["scores"]),
                             saved["scores"], rtol=1e-5)
  # Another batch of the same shape, under changed weights, reuses the
  # compiled decode.
  model.set_weights([w * 0.5 for w in model.get_weights()])
  generator(saved["encoder_tokens"][::-1])
  if keras.backend.backend() == "jax":
    # One compile for the whole decode (the steps a loop inside it), not
    # one per step, per batch or per weight update.
    assert generator.jitted._cache_size() == 1  # pylint: disable=protected-access
    text = generator.jitted.lower([v.value for v in model.variables],
                                  saved["encoder_tokens"]).as_text()
    assert text.count("stablehlo.while") == 1


def test_a_model_without_an_encoder_is_refused_by_name():
  model = models.create_model("t5_tiny", stacks="decoder")
  with pytest.raises(ValueError, match="encoder and a decoder"):
    generation.T5Generator(model, max_length=3)
