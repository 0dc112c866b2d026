"""Layers under tf_keras mixed-precision policies: float32 softmax, safe masks."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers

POLICIES = ["mixed_float16", "mixed_bfloat16"]

VARIANTS = {
    "multi_head": lambda **kw: layers.MultiHeadAttention(2, 4, **kw),
    "talking_heads": lambda **kw: layers.TalkingHeadsAttention(
        4, 4, num_key_heads=2, num_value_heads=3,
        dynamic_projections=layers.DYNAMIC_PROJECTIONS, **kw),
    "grouped_talking_heads": lambda **kw: layers.TalkingHeadsAttention(
        4, 4, num_key_heads=2, num_value_heads=6, num_head_groups=2,
        dynamic_projections=layers.DYNAMIC_PROJECTIONS, **kw),
    "general_bilinear": lambda **kw: layers.GeneralBilinearAttention(2, **kw),
    # The family after talking heads: the gate with the q/k norm, and
    # differential attention (its lambda and heads' norm in float32).
    "gated_query_key_norm": lambda **kw: layers.MultiHeadAttention(
        2, 4, use_gate=True, query_key_norm_epsilon=1e-6, **kw),
    "differential": lambda **kw: layers.DifferentialAttention(
        4, 2, num_key_value_heads=2, layer_index=1, use_gate=True,
        headwise_gate=True, **kw),
    # DCMHA (its w_1 norm in float32, the compose in the compute dtype).
    "dcmha": lambda **kw: layers.DynamicallyComposableAttention(
        4, 2, num_key_value_heads=2, static_mix=True,
        query_key_norm_epsilon=1e-6, **kw),
}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
def test_fully_masked_rows_are_finite_and_close_to_float32(policy, make_layer):
  tf.random.set_seed(3)
  x = tf.random.normal([2, 5, 8])
  # Query row 1 of example 0 may attend nothing; example 1 attends nothing.
  mask = np.ones([2, 5, 5], bool)
  mask[0, 1, :] = False
  mask[1] = False
  reference = make_layer(dtype="float32")
  expected, expected_scores = reference(x, x, attention_mask=mask,
                                        return_attention_scores=True)

  layer = make_layer(dtype=tf_keras.mixed_precision.Policy(policy))
  got, scores = layer(x, x, attention_mask=mask, return_attention_scores=True)
  layer.set_weights(reference.get_weights())
  got, scores = layer(x, x, attention_mask=mask, return_attention_scores=True)

  compute_dtype = tf.float16 if policy == "mixed_float16" else tf.bfloat16
  assert got.dtype == compute_dtype
  assert all(v.dtype == tf.float32 for v in layer.weights)
  assert np.isfinite(tf.cast(got, tf.float32).numpy()).all()
  assert np.isfinite(tf.cast(scores, tf.float32).numpy()).all()
  tolerance = 2e-2 if policy == "mixed_float16" else 1e-1
  np.testing.assert_allclose(tf.cast(got, tf.float32), expected,
                             rtol=tolerance, atol=tolerance)
  np.testing.assert_allclose(tf.cast(scores, tf.float32), expected_scores,
                             rtol=tolerance, atol=tolerance)


def test_softmax_runs_in_float32_and_masks_with_a_float32_constant():
  # float16 logits (60000 and 59968 are exact float16 values) come back as
  # float32 weights; the mask value -1e9 is not representable in float16 and
  # would become -inf there.
  logits = tf.constant([[[[60000.0, 59968.0, -60000.0]]]], tf.float16)
  mask = tf.constant([[[[True, True, False]]]])
  weights = layers.attention_ops.masked_softmax(logits, mask)
  assert weights.dtype == tf.float32
  np.testing.assert_allclose(weights[0, 0, 0], [1.0, np.exp(-32.0), 0.0],
                             rtol=1e-6, atol=1e-12)


def test_gradients_are_finite_under_mixed_float16_with_masked_rows():
  layer = VARIANTS["talking_heads"](
      dtype=tf_keras.mixed_precision.Policy("mixed_float16"))
  x = tf.random.normal([2, 4, 8])
  mask = tf.zeros([2, 4, 4], tf.bool)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.cast(layer(x, x, attention_mask=mask), tf.float32))
  grads = tape.gradient(loss, layer.trainable_variables)
  assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_keras_implicit_masks_from_embeddings_are_applied():
  tokens = tf.constant([[5, 6, 0, 0], [7, 0, 0, 0]])
  embed = tf_keras.layers.Embedding(10, 8, mask_zero=True)
  x = embed(tokens)
  layer = layers.TalkingHeadsAttention(2, 4)
  _, implicit = layer(x, x, return_attention_scores=True)
  explicit_mask = tf.cast(tokens != 0, tf.bool)
  mask = explicit_mask[:, :, None] & explicit_mask[:, None, :]
  _, explicit = layer(tf.identity(x), tf.identity(x), attention_mask=mask,
                      return_attention_scores=True)
  np.testing.assert_allclose(implicit, explicit, rtol=1e-6, atol=1e-7)
