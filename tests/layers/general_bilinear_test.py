"""GeneralBilinearAttention (Section 6) against the NumPy reference.

Also checks Section 6's identities: multi-head and talking-heads attention are
general bilinear attention with P and Q factored, both in the reference alone
(which guards the oracle itself) and across the layers.
"""

import numpy as np
import pytest
import tensorflow as tf

from thattn.layers import GeneralBilinearAttention
from thattn.layers import MultiHeadAttention
from thattn.layers import TalkingHeadsAttention

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

BATCH = 2
SHAPES = {
    "self": dict(n=5, m=5, d_x=10, d_m=10, self_attention=True),
    "cross": dict(n=3, m=6, d_x=10, d_m=8, self_attention=False),
}
MASKS = ("none", "random", "causal", "random_and_causal")


def _make_inputs(rng, shape):
  return ref.make_inputs(rng, BATCH, shape["n"], shape["m"], shape["d_x"],
                         shape["d_m"], shape["self_attention"])


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


def _random_weights(rng, d_x, d_m, d_y, h_k, h, h_v, d_k, d_v):
  normal = lambda *s: rng.normal(size=s) / np.sqrt(s[0])
  return dict(P_q=normal(d_x, h_k, d_k), P_k=normal(d_m, h_k, d_k),
              P_v=normal(d_m, h_v, d_v), P_o=normal(h_v, d_v, d_y),
              P_l=normal(h_k, h), P_w=normal(h, h_v))


# ---------------------------------------------------------------------------
# The reference agrees with itself (no layers involved).
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask_kind", ("none", "random_and_causal"))
def test_reference_identities(mask_kind):
  rng = np.random.default_rng(20)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  _, _, mask = ref.make_masks(rng, mask_kind, BATCH, shape["n"], shape["m"])
  w = _random_weights(rng, shape["d_x"], shape["d_m"], 7, 2, 4, 3, 5, 6)
  th = ref.talking_heads_attention(x, mem, mask=mask, **w)

  # Section 6: talking heads is GBMA with three-factor P and Q.
  np.testing.assert_allclose(
      ref.talking_heads_attention_inefficient(x, mem, mask=mask, **w), th,
      rtol=1e-10, atol=1e-12)
  # Appendix A without dynamic terms is Section 4.
  np.testing.assert_allclose(
      ref.talking_heads_attention_with_dynamic_projections(
          x, mem, mask=mask, **w), th, rtol=1e-12, atol=1e-12)

  # Multi-head: Section 3.3 == Section 6 two-factor form == talking heads
  # with identity projections == talking heads with no projections.
  mh = {k: w[k] for k in ("P_q", "P_k", "P_v", "P_o")}
  mh["P_v"] = rng.normal(size=(shape["d_m"], 2, 3))
  mh["P_o"] = rng.normal(size=(2, 3, 7))
  want = ref.multi_head_attention(x, mem, mask=mask, **mh)
  eye = np.eye(2)
  for got in (
      ref.multi_head_attention_inefficient(x, mem, mask=mask, **mh),
      ref.talking_heads_attention(x, mem, P_l=eye, P_w=eye, mask=mask, **mh),
      ref.talking_heads_attention(x, mem, mask=mask, **mh),
  ):
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_reference_masked_positions_get_no_weight():
  rng = np.random.default_rng(21)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  _, _, mask = ref.make_masks(rng, "random_and_causal", BATCH, shape["n"],
                              shape["m"])
  w = _random_weights(rng, shape["d_x"], shape["d_m"], 7, 2, 4, 3, 5, 6)
  _, u = ref.talking_heads_attention(x, mem, mask=mask, return_weights=True,
                                     **w)
  assert u.shape == (BATCH, 3, shape["n"], shape["m"])
  assert np.all(u[np.broadcast_to(~mask[:, None], u.shape)] == 0.0)


# ---------------------------------------------------------------------------
# The layer against the reference.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_matches_reference(shape_name, mask_kind):
  rng = np.random.default_rng(22)
  shape = SHAPES[shape_name]
  h = 3
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, ref_mask = ref.make_masks(rng, mask_kind, BATCH,
                                                shape["n"], shape["m"])
  layer = GeneralBilinearAttention(num_heads=h)
  w = _build_randomized(layer, rng, x, mem)
  assert set(w) == {"P", "Q"}

  got, got_scores = _call(layer, x, mem, layer_mask, causal)
  want, want_scores = ref.general_bilinear_attention(
      x, mem, mask=ref_mask, return_weights=True, **w)
  assert got.shape == (BATCH, shape["n"], shape["d_x"])
  assert got_scores.shape == (BATCH, h, shape["n"], shape["m"])
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)


def test_weight_shapes_follow_the_contract():
  rng = np.random.default_rng(23)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  layer = GeneralBilinearAttention(num_heads=3, output_dim=7)
  got, _ = _call(layer, x, mem)
  assert got.shape == (BATCH, shape["n"], 7)
  shapes = {t: tuple(v.shape) for t, v in ref.weights_by_token(layer).items()}
  assert shapes == {"bilinear_p": (shape["d_x"], shape["d_m"], 3),
                    "bilinear_q": (shape["d_m"], 7, 3)}


def test_output_dim_matches_reference():
  rng = np.random.default_rng(24)
  shape = SHAPES["cross"]
  x, mem = _make_inputs(rng, shape)
  layer = GeneralBilinearAttention(num_heads=2, output_dim=7)
  w = _build_randomized(layer, rng, x, mem)
  got, _ = _call(layer, x, mem)
  ref.assert_close(got, ref.general_bilinear_attention(x, mem, **w))


def test_matches_reference_with_initial_weights():
  rng = np.random.default_rng(25)
  x, mem = _make_inputs(rng, SHAPES["cross"])
  layer = GeneralBilinearAttention(num_heads=2)
  _call(layer, x, mem)
  w = ref.reference_kwargs(layer)
  got, _ = _call(layer, x, mem)
  ref.assert_close(got, ref.general_bilinear_attention(x, mem, **w))


# ---------------------------------------------------------------------------
# Section 6 across the layers: set P and Q from a factored layer's weights.
# ---------------------------------------------------------------------------


def _set_bilinear(gba, P, Q):
  weights = ref.weights_by_token(gba)
  weights["bilinear_p"].assign(P.astype(np.float32))
  weights["bilinear_q"].assign(Q.astype(np.float32))


@pytest.mark.parametrize("mask_kind", ("none", "random_and_causal"))
@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_factored_talking_heads_is_general_bilinear(shape_name, mask_kind):
  rng = np.random.default_rng(26)
  shape = SHAPES[shape_name]
  h_k, h, h_v, d_k, d_v, d_y = 2, 4, 3, 5, 3, 6
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, _ = ref.make_masks(rng, mask_kind, BATCH, shape["n"],
                                         shape["m"])
  th = TalkingHeadsAttention(num_heads=h, key_dim=d_k, value_dim=d_v,
                             num_key_heads=h_k, num_value_heads=h_v,
                             output_dim=d_y)
  w = _build_randomized(th, rng, x, mem)
  gba = GeneralBilinearAttention(num_heads=h, output_dim=d_y)
  _call(gba, x, mem)
  _set_bilinear(gba, *ref.talking_heads_bilinear_factors(**w))

  want, _ = _call(th, x, mem, layer_mask, causal)
  got, _ = _call(gba, x, mem, layer_mask, causal)
  ref.assert_close(got, want)


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
def test_factored_multi_head_is_general_bilinear(shape_name):
  rng = np.random.default_rng(27)
  shape = SHAPES[shape_name]
  x, mem = _make_inputs(rng, shape)
  layer_mask, causal, _ = ref.make_masks(rng, "random_and_causal", BATCH,
                                         shape["n"], shape["m"])
  mha = MultiHeadAttention(num_heads=3, key_dim=4, value_dim=2)
  w = _build_randomized(mha, rng, x, mem)
  gba = GeneralBilinearAttention(num_heads=3)
  _call(gba, x, mem)
  _set_bilinear(gba, *ref.multi_head_bilinear_factors(**w))

  want, want_scores = _call(mha, x, mem, layer_mask, causal)
  got, got_scores = _call(gba, x, mem, layer_mask, causal)
  ref.assert_close(got, want)
  # Same logits, so the same softmax weights.
  ref.assert_close(got_scores, want_scores)
