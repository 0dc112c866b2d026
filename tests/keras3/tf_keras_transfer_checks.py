"""thattn.keras3 and thattn.layers hold the same weights (TensorFlow backend).

Run by `backends_test.py` with KERAS_BACKEND=tensorflow: tf_keras and
Keras 3 in one process, weights moved both ways, outputs compared.
"""

import keras
from keras import ops
import numpy as np
import pytest
import tensorflow as tf

from thattn import keras3
from thattn import layers

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 8)).astype("float32")
M = RNG.normal(size=(2, 7, 6)).astype("float32")
MASK = RNG.random((2, 5, 7)) > 0.3
# DCMHA generates both sides' dynamic weights with one set of kernels: its
# memory is as wide as X.
M_AS_WIDE = RNG.normal(size=(2, 7, 8)).astype("float32")

PAIRS = {
    "multi_head": lambda module: module.MultiHeadAttention(
        3, 4, value_dim=5, use_bias=True, bias_initializer="random_normal"),
    "talking_heads": lambda module: module.TalkingHeadsAttention(
        3, 4, num_key_heads=2, num_value_heads=4, use_bias=True,
        bias_initializer="random_normal"),
    "dynamic_grouped": lambda module: module.TalkingHeadsAttention(
        4, 4, num_key_heads=2, num_value_heads=6, num_head_groups=2,
        dynamic_projections=["x2l", "m2l", "m2w"]),
    "general_bilinear": lambda module: module.GeneralBilinearAttention(2),
    # Grouped-query: P_k and P_v project to 2 heads, shared.
    "shared_key_value_heads": lambda module: module.TalkingHeadsAttention(
        3, 4, num_key_heads=4, num_value_heads=6, num_key_value_heads=2,
        use_bias=True, bias_initializer="random_normal"),
    # Rotary positions with Llama 3's scaling, over shared heads.
    "rotary": lambda module: module.MultiHeadAttention(
        4, 4, num_key_value_heads=2, rotary_base=500000.0,
        rotary_scaling={"factor": 8.0, "original_max_position_embeddings": 4}),
    # Qwen3-Next's layout: the gate, q/k RMSNorm, half of each head turned.
    "gated_query_key_norm": lambda module: module.MultiHeadAttention(
        4, 4, num_key_value_heads=2, use_gate=True,
        query_key_norm_epsilon=1e-6, rotary_base=10000.0, rotary_pct=0.5),
    "headwise_gated_talking_heads": lambda module: (
        module.TalkingHeadsAttention(3, 4, use_gate=True, headwise_gate=True,
                                     use_bias=True,
                                     bias_initializer="random_normal")),
    "differential": lambda module: module.DifferentialAttention(
        4, 2, num_key_value_heads=2, layer_index=1, use_gate=True,
        query_key_norm_epsilon=1e-6),
    "dcmha": lambda module: module.DynamicallyComposableAttention(
        4, 2, num_key_value_heads=2, static_mix=True, use_gate=True,
        query_key_norm_epsilon=1e-6, rotary_base=10000.0, sliding_window=3),
}


def _outputs(layer, memory):
  output, scores = layer(X, memory, attention_mask=MASK,
                         return_attention_scores=True)
  return np.asarray(ops.convert_to_numpy(output)), np.asarray(
      ops.convert_to_numpy(scores))


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("direction", ["to_keras3", "to_tf_keras"])
def test_weights_carry_over_with_equal_outputs(pair, direction):
  memory = M_AS_WIDE if pair == "dcmha" else M
  source_module, target_module = ((layers, keras3) if direction == "to_keras3"
                                  else (keras3, layers))
  source = PAIRS[pair](source_module)
  target = PAIRS[pair](target_module)
  source(X, memory)
  target(X, memory)
  # The same names, shapes and order: get_weights of one is set_weights of
  # the other.
  source_names = [w.name.split(":")[0].split("/", 1)[1] if ":" in w.name
                  else w.path.split("/", 1)[1] for w in source.weights]
  target_names = [w.name.split(":")[0].split("/", 1)[1] if ":" in w.name
                  else w.path.split("/", 1)[1] for w in target.weights]
  assert source_names == target_names
  target.set_weights(source.get_weights())
  for got, want in zip(_outputs(target, memory), _outputs(source, memory)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_tf_keras_config_builds_the_keras3_layer():
  source = layers.TalkingHeadsAttention(3, 4, num_key_heads=2,
                                        dynamic_projections=["x2w"])
  source(X, X)
  target = keras3.TalkingHeadsAttention.from_config(source.get_config())
  assert target.built
  target.set_weights(source.get_weights())
  np.testing.assert_allclose(ops.convert_to_numpy(target(X, X)),
                             source(X, X).numpy(), rtol=1e-5, atol=1e-6)


def test_tf_function_traces_the_keras3_layer():
  layer = keras3.TalkingHeadsAttention(3, 4, dynamic_projections=["m2w"])
  eager = ops.convert_to_numpy(layer(X, X, use_causal_mask=True))
  traced = tf.function(lambda x: layer(x, x, use_causal_mask=True))
  np.testing.assert_allclose(traced(tf.constant(X)).numpy(), eager,
                             rtol=1e-5, atol=1e-6)
  assert keras.backend.backend() == "tensorflow"


@pytest.mark.parametrize("arguments", [
    {},
    {"dynamic_projections": ["x2l", "m2w"]},
    {"num_head_groups": 2, "num_key_heads": 4, "num_value_heads": 2},
], ids=["static", "dynamic", "grouped"])
def test_the_fused_kernel_runs_and_equals_keras_ops(arguments):
  kwargs = dict(num_heads=4, key_dim=4, **arguments)
  fused = keras3.TalkingHeadsAttention(**kwargs)
  plain = keras3.TalkingHeadsAttention(fused_kernel=False, **kwargs)
  fused(X, X)
  plain(X, X)
  plain.set_weights(fused.get_weights())
  x = tf.constant(X)

  def step(layer):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x, x, attention_mask=MASK[:, :, :5], use_causal_mask=True)
      loss = tf.reduce_sum(tf.square(y))
    return [y] + tape.gradient(loss, [x] + layer.trainable_variables)

  for got, want in zip(step(fused), step(plain)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4,
                               atol=1e-5)
  graph = tf.function(lambda x: fused(x, x)).get_concrete_function(x).graph
  assert "ThattnTalkingHeadsSoftmax" in {op.type for op in
                                         graph.get_operations()}
