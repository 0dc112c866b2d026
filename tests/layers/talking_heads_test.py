"""TalkingHeadsAttention against the NumPy transcription of the paper.

Each test builds a layer, calls it once to create its weights, overwrites the
weights with random values, reads them back by name token and compares the
layer's output and attention scores with `numpy_reference`.
"""

import numpy as np
import pytest
import tensorflow as tf

from thattn.core import attention_spec
from thattn.layers import MultiHeadAttention
from thattn.layers import TalkingHeadsAttention

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

BATCH = 2
# Self-attention: the memory is the query sequence itself.
SELF = dict(n=5, m=5, d_x=12, d_m=12, self_attention=True)
# Cross-attention: different lengths and widths, so an n/m or d_X/d_M mix-up
# fails loudly instead of passing by symmetry.
CROSS = dict(n=4, m=7, d_x=12, d_m=8, self_attention=False)
SHAPES = {"self": SELF, "cross": CROSS}
MASKS = ("none", "random", "causal", "random_and_causal")

# Head configurations: (h_k, h, h_v, d_k, d_v, project_logits, project_weights)
CONFIGS = {
    "square": (3, 3, 3, 4, 4, True, True),
    "non_square": (2, 4, 3, 5, 3, True, True),
    "logits_only": (2, 3, 3, 4, 5, True, False),    # no P_w: h_v = h
    "weights_only": (3, 3, 2, 5, 4, False, True),   # no P_l: h_k = h
    "neither": (3, 3, 3, 4, 4, False, False),       # multi-head attention
}


def _make_inputs(rng, shape):
  return ref.make_inputs(rng, BATCH, shape["n"], shape["m"], shape["d_x"],
                         shape["d_m"], shape["self_attention"])


def _masks(rng, kind, n, m):
  return ref.make_masks(rng, kind, BATCH, n, m)


def _call(layer, x, mem, mask=None, causal=False):
  out, scores = layer(
      tf.constant(x, tf.float32), tf.constant(mem, tf.float32),
      attention_mask=None if mask is None else tf.constant(mask),
      use_causal_mask=causal, return_attention_scores=True, training=False)
  return out.numpy(), scores.numpy()


def _build_randomized(layer, rng, x, mem):
  _call(layer, x, mem)  # creates the weights
  ref.randomize_weights(layer, rng)
  return ref.reference_kwargs(layer)


def _th_layer(config, **kwargs):
  h_k, h, h_v, d_k, d_v, logits, weights = config
  return TalkingHeadsAttention(
      num_heads=h, key_dim=d_k, value_dim=d_v, num_key_heads=h_k,
      num_value_heads=h_v, project_logits=logits, project_weights=weights,
      **kwargs)


def _expected_tokens(project_logits, project_weights, dynamic=()):
  tokens = {"query", "key", "value", "output"}
  if project_logits:
    tokens.add("pre_softmax_projection")
  if project_weights:
    tokens.add("post_softmax_projection")
  return tokens | set(dynamic)


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_matches_reference(config_name, shape_name, mask_kind):
  rng = np.random.default_rng(0)
  config, shape = CONFIGS[config_name], SHAPES[shape_name]
  h_k, h, h_v, d_k, d_v, logits, weights = config
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, ref_mask = _masks(rng, mask_kind, shape["n"],
                                        shape["m"])
  layer = _th_layer(config)
  w = _build_randomized(layer, rng, x, mem)
  assert set(ref.weights_by_token(layer)) == _expected_tokens(logits, weights)

  got, got_scores = _call(layer, x, mem, layer_mask, causal)
  want, want_scores = ref.talking_heads_attention(
      x, mem, w["P_q"], w["P_k"], w["P_v"], w["P_o"], w.get("P_l"),
      w.get("P_w"), mask=ref_mask, return_weights=True)
  assert got.shape == (BATCH, shape["n"], shape["d_x"])
  assert got_scores.shape == (BATCH, h_v, shape["n"], shape["m"])
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)


def test_weight_shapes_follow_the_contract():
  rng = np.random.default_rng(1)
  h_k, h, h_v, d_k, d_v = 2, 4, 3, 5, 6
  x, mem = _make_inputs(rng, CROSS)
  layer = TalkingHeadsAttention(
      num_heads=h, key_dim=d_k, value_dim=d_v, num_key_heads=h_k,
      num_value_heads=h_v, dynamic_projections=("x2l", "m2l", "x2w", "m2w"))
  _call(layer, x, mem)
  d_x, d_m = CROSS["d_x"], CROSS["d_m"]
  shapes = {t: tuple(v.shape) for t, v in ref.weights_by_token(layer).items()}
  assert shapes == {
      "query": (d_x, h_k, d_k),
      "key": (d_m, h_k, d_k),
      "value": (d_m, h_v, d_v),
      "output": (h_v, d_v, d_x),
      "pre_softmax_projection": (h_k, h),
      "post_softmax_projection": (h, h_v),
      "x2l": (d_x, h_k, h),
      "m2l": (d_m, h_k, h),
      "x2w": (d_x, h, h_v),
      "m2w": (d_m, h, h_v),
  }


def test_matches_reference_with_initial_weights():
  # No randomization: whatever the initializers produced must still be what
  # the layer computes with.
  rng = np.random.default_rng(2)
  x, mem = _make_inputs(rng, CROSS)
  layer = _th_layer(CONFIGS["non_square"])
  _call(layer, x, mem)
  w = ref.reference_kwargs(layer)
  got, _ = _call(layer, x, mem)
  want = ref.talking_heads_attention(x, mem, **w)
  ref.assert_close(got, want)


DYNAMIC = {
    "x2l": ("x2l",),
    "m2l": ("m2l",),
    "x2w": ("x2w",),
    "m2w": ("m2w",),
    "all": ("x2l", "m2l", "x2w", "m2w"),
}


@pytest.mark.parametrize("mask_kind", ("none", "random_and_causal"))
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("dynamic_name", sorted(DYNAMIC))
def test_dynamic_projections_match_reference(dynamic_name, shape_name,
                                             mask_kind):
  rng = np.random.default_rng(3)
  shape, dynamic = SHAPES[shape_name], DYNAMIC[dynamic_name]
  h_k, h, h_v, d_k, d_v = 2, 4, 3, 5, 3
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, ref_mask = _masks(rng, mask_kind, shape["n"],
                                        shape["m"])
  layer = TalkingHeadsAttention(
      num_heads=h, key_dim=d_k, value_dim=d_v, num_key_heads=h_k,
      num_value_heads=h_v, dynamic_projections=dynamic)
  w = _build_randomized(layer, rng, x, mem)
  assert set(ref.weights_by_token(layer)) == _expected_tokens(True, True,
                                                              dynamic)

  got, got_scores = _call(layer, x, mem, layer_mask, causal)
  want, want_scores = ref.talking_heads_attention_with_dynamic_projections(
      x, mem, mask=ref_mask, return_weights=True, **w)
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)
  # The dynamic terms must matter: the static-only answer is different.
  static = ref.talking_heads_attention(
      x, mem, w["P_q"], w["P_k"], w["P_v"], w["P_o"], w["P_l"], w["P_w"],
      mask=ref_mask)
  assert np.max(np.abs(static - want)) > 1e-3


def test_output_dim():
  rng = np.random.default_rng(4)
  x, mem = _make_inputs(rng, CROSS)
  layer = _th_layer(CONFIGS["non_square"], output_dim=7)
  w = _build_randomized(layer, rng, x, mem)
  got, _ = _call(layer, x, mem)
  assert got.shape == (BATCH, CROSS["n"], 7)
  ref.assert_close(got, ref.talking_heads_attention(x, mem, **w))


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_return_attention_scores_shape(shape_name):
  rng = np.random.default_rng(5)
  shape = SHAPES[shape_name]
  x, mem = _make_inputs(rng, shape)
  layer = _th_layer(CONFIGS["non_square"])
  out = layer(tf.constant(x, tf.float32), tf.constant(mem, tf.float32))
  out2, scores = layer(tf.constant(x, tf.float32),
                       tf.constant(mem, tf.float32),
                       return_attention_scores=True)
  assert out.shape == (BATCH, shape["n"], shape["d_x"])
  # [b, h_v, n, m]: the weights U applied to the values.
  assert scores.shape == (BATCH, 3, shape["n"], shape["m"])
  np.testing.assert_allclose(out.numpy(), out2.numpy(), rtol=0, atol=0)


@pytest.mark.parametrize("mask_kind", ("none", "random_and_causal"))
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_identity_projections_give_multi_head(shape_name, mask_kind):
  """Talking heads with P_l = P_w = I is multi-head attention (Section 4)."""
  rng = np.random.default_rng(6)
  shape = SHAPES[shape_name]
  h, d_k, d_v = 3, 4, 5
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, _ = _masks(rng, mask_kind, shape["n"], shape["m"])

  mha = MultiHeadAttention(num_heads=h, key_dim=d_k, value_dim=d_v)
  _build_randomized(mha, rng, x, mem)
  th = TalkingHeadsAttention(num_heads=h, key_dim=d_k, value_dim=d_v)
  _call(th, x, mem)
  th_weights = ref.weights_by_token(th)
  for token, v in ref.weights_by_token(mha).items():
    th_weights[token].assign(v.numpy())
  th_weights["pre_softmax_projection"].assign(np.eye(h, dtype=np.float32))
  th_weights["post_softmax_projection"].assign(np.eye(h, dtype=np.float32))

  want, want_scores = _call(mha, x, mem, layer_mask, causal)
  got, got_scores = _call(th, x, mem, layer_mask, causal)
  # Two float32 layers computing the same thing in different orders.
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)


def test_the_dynamic_projection_check_orders_and_refuses_by_name():
  assert attention_spec.checked_dynamic_projections(["m2w", "x2l"]) == (
      "x2l", "m2w")
  with pytest.raises(ValueError, match=r"^owner: unknown dynamic "
                     r"projections \['q2l'\]"):
    attention_spec.checked_dynamic_projections(["q2l"], owner="owner")
  with pytest.raises(ValueError, match="'x2l' is added to the static P_l, "
                     "so it needs project_logits=True"):
    attention_spec.checked_dynamic_projections(["x2l"], project_logits=False)
