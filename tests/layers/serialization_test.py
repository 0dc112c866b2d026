"""get_config round trips and SavedModel export/reload of functional models."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers

LAYERS = {
    "multi_head": lambda: layers.MultiHeadAttention(
        2, 4, value_dim=3, output_dim=6, use_bias=True, dropout_rate=0.1),
    "talking_heads": lambda: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=6,
        dynamic_projections=["m2w", "x2l"], dropout_rate=0.1,
        talking_heads_initializer="orthogonal"),
    "logits_only": lambda: layers.TalkingHeadsAttention(
        3, 4, num_value_heads=3, project_weights=False),
    "grouped": lambda: layers.TalkingHeadsAttention(
        4, 3, num_key_heads=2, num_head_groups=2,
        dynamic_projections=["x2w"]),
    "general_bilinear": lambda: layers.GeneralBilinearAttention(3,
                                                                output_dim=5),
    "dcmha": lambda: layers.DynamicallyComposableAttention(
        4, 4, num_key_value_heads=2, dynamic_rank=1, static_mix=True,
        sliding_window=5, query_key_norm_epsilon=1e-6, rotary_base=10000.0),
    "relative_bias": lambda: layers.RelativePositionBias(
        4, bidirectional=False, num_buckets=16, max_distance=64),
}


@pytest.mark.parametrize("make_layer", LAYERS.values(), ids=LAYERS.keys())
def test_get_config_round_trip(make_layer):
  layer = make_layer()
  config = layer.get_config()
  clone = type(layer).from_config(config)
  assert clone.get_config() == config
  # The serialized form names the registered class, so Keras can find it.
  serialized = tf_keras.layers.serialize(layer)
  assert serialized["registered_name"].startswith("thattn>")
  assert tf_keras.layers.deserialize(serialized).get_config() == config


def _masked_dynamic_model():
  """A functional model: embeddings, padding mask, dynamic talking heads."""
  tokens = tf_keras.Input([None], dtype=tf.int32, name="tokens")
  x = tf_keras.layers.Embedding(20, 8)(tokens)
  padding = tf_keras.layers.Lambda(lambda t: tf.not_equal(t, 0))(tokens)
  mask = tf_keras.layers.Lambda(
      lambda p: tf.logical_and(p[:, :, None], p[:, None, :]))(padding)
  attention = layers.TalkingHeadsAttention(
      4, 3, num_key_heads=2, num_value_heads=3,
      dynamic_projections=layers.DYNAMIC_PROJECTIONS, name="attention")
  y = attention(x, x, attention_mask=mask)
  return tf_keras.Model(tokens, y)


def test_savedmodel_reloads_with_equal_outputs(tmp_path):
  model = _masked_dynamic_model()
  tokens = tf.constant([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]])
  expected = model(tokens)
  path = str(tmp_path / "model")
  model.save(path, save_format="tf")

  reloaded = tf_keras.models.load_model(path)
  assert isinstance(reloaded.get_layer("attention"),
                    layers.TalkingHeadsAttention)
  np.testing.assert_allclose(reloaded(tokens), expected, rtol=1e-6, atol=1e-6)

  # Plain TensorFlow, without thattn's classes: the traced graph serves.
  restored = tf.saved_model.load(path)
  served = restored.signatures["serving_default"](tokens=tokens)
  np.testing.assert_allclose(list(served.values())[0], expected,
                             rtol=1e-6, atol=1e-6)


def test_savedmodel_loads_in_a_fresh_process_without_thattn(tmp_path):
  model = _masked_dynamic_model()
  tokens = np.array([[3, 4, 5, 0], [6, 7, 8, 9]], np.int32)
  path = str(tmp_path / "model")
  model.save(path, save_format="tf")
  np.save(tmp_path / "expected.npy", model(tokens).numpy())
  script = textwrap.dedent(f"""
      import sys, numpy as np, tensorflow as tf
      assert "thattn" not in sys.modules
      served = tf.saved_model.load({path!r}).signatures["serving_default"](
          tokens=tf.constant({tokens.tolist()}, tf.int32))
      np.testing.assert_allclose(list(served.values())[0],
                                 np.load({str(tmp_path / 'expected.npy')!r}),
                                 rtol=1e-6, atol=1e-6)
      print("served ok")
  """)
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "served ok" in result.stdout


def test_keras_v3_format_round_trip(tmp_path):
  model = _masked_dynamic_model()
  tokens = tf.constant([[3, 4, 5, 0, 0]])
  path = str(tmp_path / "model.keras")
  model.save(path)
  # safe_mode=False only because the test model builds its mask with Lambda
  # layers; thattn's own layers need no such permission.
  reloaded = tf_keras.models.load_model(path, safe_mode=False)
  np.testing.assert_allclose(reloaded(tokens), model(tokens), rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("make_layer", [
    lambda: layers.TalkingHeadsAttention(2, 4, name="attention"),
    lambda: layers.TalkingHeadsAttention(4, 4, num_head_groups=2,
                                         dynamic_projections=["m2l"],
                                         name="attention"),
    lambda: layers.GeneralBilinearAttention(2, name="attention"),
], ids=["talking_heads", "grouped_talking_heads", "general_bilinear"])
def test_mixed_precision_savedmodel_reload_keeps_a_working_layer(tmp_path,
                                                                 make_layer):
  tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
  try:
    inputs = tf_keras.Input([None, 8])
    model = tf_keras.Model(inputs, make_layer()(inputs, inputs))
    x = tf.random.normal([2, 5, 8])
    expected = model(x)
    model.save(str(tmp_path / "model"), save_format="tf")
    reloaded = tf_keras.models.load_model(str(tmp_path / "model"))
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  np.testing.assert_allclose(tf.cast(reloaded(x), tf.float32),
                             tf.cast(expected, tf.float32), rtol=1e-2,
                             atol=1e-2)
  layer = reloaded.get_layer("attention")
  assert layer.build_shapes["value_shape"] == [None, None, 8]
  cache = layer.initial_cache(2, 5)  # needs the build shapes after reload
  assert all(t.shape[:2] == (2, 5) for t in cache.values())
