"""MultiHeadAttention against the NumPy transcription of Section 3.3."""

import numpy as np
import pytest
import tensorflow as tf

from thattn.layers import MultiHeadAttention

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

BATCH = 2
SHAPES = {
    "self": dict(n=6, m=6, d_x=16, d_m=16, self_attention=True),
    "cross": dict(n=3, m=5, d_x=16, d_m=10, self_attention=False),
}
MASKS = ("none", "random", "causal", "random_and_causal")
# (h, d_k, d_v): equal and unequal key/value sizes.
HEADS = {"dk_eq_dv": (4, 4, 4), "dk_ne_dv": (2, 3, 5)}


def _make_inputs(rng, shape):
  return ref.make_inputs(rng, BATCH, shape["n"], shape["m"], shape["d_x"],
                         shape["d_m"], shape["self_attention"])


def _call(layer, x, mem, mask=None, causal=False, **kwargs):
  out, scores = layer(
      tf.constant(x, tf.float32), tf.constant(mem, tf.float32),
      attention_mask=None if mask is None else tf.constant(mask),
      use_causal_mask=causal, return_attention_scores=True, training=False,
      **kwargs)
  return out.numpy(), scores.numpy()


def _build_randomized(layer, rng, x, mem):
  _call(layer, x, mem)  # creates the weights
  ref.randomize_weights(layer, rng)
  return ref.reference_kwargs(layer)


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("heads_name", sorted(HEADS))
def test_matches_reference(heads_name, shape_name, mask_kind):
  rng = np.random.default_rng(10)
  shape = SHAPES[shape_name]
  h, d_k, d_v = HEADS[heads_name]
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, ref_mask = ref.make_masks(rng, mask_kind, BATCH,
                                                shape["n"], shape["m"])
  layer = MultiHeadAttention(num_heads=h, key_dim=d_k, value_dim=d_v)
  w = _build_randomized(layer, rng, x, mem)
  assert set(w) == {"P_q", "P_k", "P_v", "P_o"}

  got, got_scores = _call(layer, x, mem, layer_mask, causal)
  want, want_scores = ref.multi_head_attention(
      x, mem, mask=ref_mask, return_weights=True, **w)
  assert got.shape == (BATCH, shape["n"], shape["d_x"])
  assert got_scores.shape == (BATCH, h, shape["n"], shape["m"])
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)


def test_weight_shapes_follow_the_contract():
  rng = np.random.default_rng(11)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5,
                             output_dim=7)
  _call(layer, x, mem)
  shapes = {t: tuple(v.shape) for t, v in ref.weights_by_token(layer).items()}
  assert shapes == {
      "query": (shape["d_x"], 2, 3),
      "key": (shape["d_m"], 2, 3),
      "value": (shape["d_m"], 2, 5),
      "output": (2, 5, 7),
  }


def test_value_dim_defaults_to_key_dim():
  rng = np.random.default_rng(12)
  x, mem = _make_inputs(rng, SHAPES["cross"])
  layer = MultiHeadAttention(num_heads=2, key_dim=3)
  _call(layer, x, mem)
  assert tuple(ref.weights_by_token(layer)["value"].shape)[1:] == (2, 3)


def test_output_dim():
  rng = np.random.default_rng(13)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5,
                             output_dim=7)
  w = _build_randomized(layer, rng, x, mem)
  got, _ = _call(layer, x, mem)
  assert got.shape == (BATCH, shape["n"], 7)
  ref.assert_close(got, ref.multi_head_attention(x, mem, **w))


def test_matches_reference_with_initial_weights():
  rng = np.random.default_rng(14)
  x, mem = _make_inputs(rng, SHAPES["cross"])
  layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5)
  _call(layer, x, mem)
  w = ref.reference_kwargs(layer)
  got, _ = _call(layer, x, mem)
  ref.assert_close(got, ref.multi_head_attention(x, mem, **w))


def test_explicit_key_equal_to_value_changes_nothing():
  rng = np.random.default_rng(15)
  x, mem = _make_inputs(rng, SHAPES["cross"])
  layer = MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5)
  _build_randomized(layer, rng, x, mem)
  got, got_scores = _call(layer, x, mem, key=tf.constant(mem, tf.float32))
  want, want_scores = _call(layer, x, mem)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mask_kind", ("none", "random_and_causal"))
def test_scores_are_softmax_weights(mask_kind):
  # Public-output property of multi-head attention: each query's weights
  # over the memory form a distribution, and masked positions get none.
  rng = np.random.default_rng(16)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, ref_mask = ref.make_masks(rng, mask_kind, BATCH,
                                                shape["n"], shape["m"])
  layer = MultiHeadAttention(num_heads=3, key_dim=4)
  _build_randomized(layer, rng, x, mem)
  _, scores = _call(layer, x, mem, layer_mask, causal)
  assert scores.shape == (BATCH, 3, shape["n"], shape["m"])
  np.testing.assert_allclose(scores.sum(axis=-1), 1.0, rtol=0, atol=1e-5)
  assert np.all(scores >= 0.0)
  if ref_mask is not None:
    assert np.all(scores[np.broadcast_to(~ref_mask[:, None], scores.shape)]
                  < 1e-6)


def test_return_attention_scores_shape():
  rng = np.random.default_rng(17)
  shape = SHAPES["self"]
  x, mem = _make_inputs(rng, shape)
  layer = MultiHeadAttention(num_heads=4, key_dim=4)
  out = layer(tf.constant(x, tf.float32), tf.constant(mem, tf.float32))
  out2, scores = layer(tf.constant(x, tf.float32),
                       tf.constant(mem, tf.float32),
                       return_attention_scores=True)
  assert out.shape == (BATCH, shape["n"], shape["d_x"])
  assert scores.shape == (BATCH, 4, shape["n"], shape["m"])
  np.testing.assert_allclose(out.numpy(), out2.numpy(), rtol=0, atol=0)
