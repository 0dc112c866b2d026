"""Files written by the release before the drop-in change still load.

`previous_release/` was written by `previous_release/write_fixtures.py` at
e4958b1, when the layers' configs said `dropout_rate` and `output_dim`; the
saved outputs are that release's. Loading must give the same layers (now
configured under tf_keras's names) and the same numbers: to float32
rounding, not bit for bit, since the fixtures were computed on one CPU and
CI may run on another (oneDNN picks kernels by CPU).
"""

import pathlib

import numpy as np
import tensorflow as tf
import tf_keras

from thattn import layers
from thattn import models

FIXTURES = pathlib.Path(__file__).parent / "previous_release"
EXPECTED = np.load(FIXTURES / "expected.npz")


def _assert_close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_keras_file_of_the_previous_release_loads():
  model = tf_keras.models.load_model(FIXTURES / "attention_layers.keras")
  talking, multi, bilinear = model([EXPECTED["query"], EXPECTED["memory"]])
  _assert_close(talking, EXPECTED["talking"])
  _assert_close(multi, EXPECTED["multi"])
  _assert_close(bilinear, EXPECTED["bilinear"])
  config = model.get_layer("talking").get_config()
  assert (config["dropout"], config["output_shape"]) == (0.25, 10)
  assert "dropout_rate" not in config
  assert isinstance(model.get_layer("multi"), layers.MultiHeadAttention)
  assert model.get_layer("multi").get_config()["output_shape"] == 7


def test_model_dir_of_the_previous_release_loads():
  backbone = models.load(str(FIXTURES / "model_dir"))
  logits = backbone({
      name: tf.constant(EXPECTED[name], tf.int32)
      for name in ("encoder_input_tokens", "decoder_input_tokens")})
  _assert_close(logits, EXPECTED["t5_logits"])
