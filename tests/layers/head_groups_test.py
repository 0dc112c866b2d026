"""Grouped talking heads: TalkingHeadsAttention(num_head_groups=G).

The heads fall into G contiguous groups and P_l, P_w and the dynamic
projections are block-diagonal. Checked here against the NumPy transcription
of the paper with block-diagonal projections (G in {1, 2, 4}), against the
ungrouped layer (G=1 is that layer; G groups equal the ungrouped layer with
the blocks on its diagonal), against multi-head attention (G=h), and against
thattn.core.complexity's parameter counts.
"""

import numpy as np
import pytest
import tensorflow as tf

from thattn.core import complexity
from thattn.core import dims
from thattn.layers import DYNAMIC_PROJECTIONS
from thattn.layers import MultiHeadAttention
from thattn.layers import TalkingHeadsAttention

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

BATCH = 2
# Cross-attention with different lengths and widths, so that an n/m or
# d_X/d_M mix-up fails instead of passing by symmetry.
N, M, D_X, D_M = 4, 7, 12, 8
# h_k, h, h_v all divisible by 4, and all different.
H_K, H, H_V, D_K, D_V = 4, 8, 12, 3, 5


def _inputs(rng, self_attention=False):
  return ref.make_inputs(rng, BATCH, N, N if self_attention else M, D_X,
                         D_X if self_attention else D_M, self_attention)


def _call(layer, x, mem, mask=None, causal=False):
  out, scores = layer(
      tf.constant(x, tf.float32), tf.constant(mem, tf.float32),
      attention_mask=None if mask is None else tf.constant(mask),
      use_causal_mask=causal, return_attention_scores=True, training=False)
  return out.numpy(), scores.numpy()


def _grouped(groups, **kwargs):
  return TalkingHeadsAttention(
      num_heads=H, key_dim=D_K, value_dim=D_V, num_key_heads=H_K,
      num_value_heads=H_V, num_head_groups=groups, **kwargs)


def _copy(source, target):
  """Copies weights by contract token; shapes must match."""
  targets = ref.weights_by_token(target)
  for token, variable in ref.weights_by_token(source).items():
    targets[token].assign(variable.numpy())


@pytest.mark.parametrize("dynamic", [(), DYNAMIC_PROJECTIONS],
                         ids=["static", "dynamic"])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_matches_the_papers_talking_heads_with_block_diagonal_projections(
    groups, dynamic):
  rng = np.random.default_rng(groups)
  x, mem = _inputs(rng)
  layer_mask, _, ref_mask = ref.make_masks(rng, "random", BATCH, N, M)
  layer = _grouped(groups, dynamic_projections=dynamic)
  _call(layer, x, mem)
  ref.randomize_weights(layer, rng)
  w = ref.reference_kwargs(layer)
  got, got_scores = _call(layer, x, mem, layer_mask)
  if groups == 1:  # the paper's layer: the full matrices themselves
    want, want_scores = ref.talking_heads_attention_with_dynamic_projections(
        x, mem, mask=ref_mask, return_weights=True, **w)
  else:
    want, want_scores = ref.grouped_talking_heads_attention(
        x, mem, mask=ref_mask, return_weights=True, **w)
  ref.assert_close(got, want)
  ref.assert_close(got_scores, want_scores)


def test_weight_shapes_and_logical_axes():
  rng = np.random.default_rng(0)
  x, mem = _inputs(rng)
  layer = _grouped(2, dynamic_projections=DYNAMIC_PROJECTIONS)
  _call(layer, x, mem)
  shapes = {t: tuple(v.shape) for t, v in ref.weights_by_token(layer).items()}
  assert shapes == {
      "query": (D_X, H_K, D_K), "key": (D_M, H_K, D_K),
      "value": (D_M, H_V, D_V), "output": (H_V, D_V, D_X),
      "pre_softmax_projection": (2, H_K // 2, H // 2),
      "post_softmax_projection": (2, H // 2, H_V // 2),
      "x2l": (D_X, 2, H_K // 2, H // 2), "m2l": (D_M, 2, H_K // 2, H // 2),
      "x2w": (D_X, 2, H // 2, H_V // 2), "m2w": (D_M, 2, H // 2, H_V // 2),
  }
  axes = {ref.token_of(v): layer.logical_axes[v.name] for v in layer.weights}
  logits = (dims.HEAD_GROUPS, dims.KEY_HEADS_PER_GROUP, dims.HEADS_PER_GROUP)
  weights = (dims.HEAD_GROUPS, dims.HEADS_PER_GROUP,
             dims.VALUE_HEADS_PER_GROUP)
  assert axes["pre_softmax_projection"] == logits
  assert axes["post_softmax_projection"] == weights
  assert axes["x2l"] == axes["m2l"] == (dims.D_MODEL,) + logits
  assert axes["x2w"] == axes["m2w"] == (dims.D_MODEL,) + weights
  assert axes["query"] == (dims.D_MODEL, dims.KEY_HEADS, dims.D_K)


def test_one_group_is_the_ungrouped_layer_bit_for_bit():
  rng = np.random.default_rng(1)
  x, mem = _inputs(rng)
  mask, _, _ = ref.make_masks(rng, "random", BATCH, N, M)
  default = TalkingHeadsAttention(H, D_K, value_dim=D_V, num_key_heads=H_K,
                                  num_value_heads=H_V,
                                  dynamic_projections=DYNAMIC_PROJECTIONS)
  one_group = _grouped(1, dynamic_projections=DYNAMIC_PROJECTIONS)
  for layer in (default, one_group):
    _call(layer, x, mem)
  ref.randomize_weights(default, rng)
  _copy(default, one_group)
  shapes = {t: tuple(v.shape)
            for t, v in ref.weights_by_token(one_group).items()}
  assert shapes["pre_softmax_projection"] == (H_K, H)
  assert shapes["post_softmax_projection"] == (H, H_V)
  assert default.get_config()["num_head_groups"] == 1
  for got, want in zip(_call(one_group, x, mem, mask),
                       _call(default, x, mem, mask)):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dynamic", [(), DYNAMIC_PROJECTIONS],
                         ids=["static", "dynamic"])
def test_groups_equal_the_full_layer_with_the_blocks_on_its_diagonal(dynamic):
  rng = np.random.default_rng(2)
  x, mem = _inputs(rng)
  mask, _, _ = ref.make_masks(rng, "random", BATCH, N, M)
  grouped, full = (_grouped(g, dynamic_projections=dynamic) for g in (2, 1))
  for layer in (grouped, full):
    _call(layer, x, mem)
  ref.randomize_weights(grouped, rng)
  targets = ref.weights_by_token(full)
  for token, variable in ref.weights_by_token(grouped).items():
    value = variable.numpy()
    if variable.shape.rank != targets[token].shape.rank:
      value = ref.block_diagonal(value)
    targets[token].assign(value.astype(np.float32))
  for got, want in zip(_call(grouped, x, mem, mask), _call(full, x, mem, mask)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_kind", ["none", "random_and_causal"])
def test_one_group_per_head_is_multi_head_with_per_head_scalars(mask_kind):
  """G = h: each block of P_l and P_w is one scalar per head.

  Then L_i = a_i J_i and U_i = c_i W_i, which is multi-head attention whose
  query kernel is scaled by a_i and value kernel by c_i, head by head. With
  powers of two every scaling is exact in floating point, so the two layers
  agree bit for bit.
  """
  h, d_k, d_v = 4, 3, 5
  rng = np.random.default_rng(3)
  x, mem = _inputs(rng, self_attention=True)
  mask, causal, _ = ref.make_masks(rng, mask_kind, BATCH, N, N)
  logit_scales = np.array([0.5, 2.0, -1.0, 4.0], np.float32)
  weight_scales = np.array([2.0, 0.25, 1.0, -0.5], np.float32)

  # TF ops on both sides, for bit-for-bit equality (the kernel's softmax
  # rounds differently; tests/layers/fused_kernel_test.py holds the kernel
  # to the TF ops for groups).
  grouped = TalkingHeadsAttention(h, d_k, value_dim=d_v, num_head_groups=h,
                                  fused_kernel=False)
  mha = MultiHeadAttention(h, d_k, value_dim=d_v)
  _call(grouped, x, mem)
  _call(mha, x, mem)
  ref.randomize_weights(mha, rng)
  weights = ref.weights_by_token(grouped)
  for token, variable in ref.weights_by_token(mha).items():
    weights[token].assign(variable.numpy())
  weights["pre_softmax_projection"].assign(logit_scales.reshape(h, 1, 1))
  weights["post_softmax_projection"].assign(weight_scales.reshape(h, 1, 1))
  mha_weights = ref.weights_by_token(mha)
  mha_weights["query"].assign(
      mha_weights["query"].numpy() * logit_scales[:, None])
  mha_weights["value"].assign(
      mha_weights["value"].numpy() * weight_scales[:, None])

  got, got_scores = _call(grouped, x, mem, mask, causal)
  want, want_scores = _call(mha, x, mem, mask, causal)
  np.testing.assert_array_equal(got, want)
  # The grouped layer returns U = c_i W_i, multi-head attention W.
  np.testing.assert_array_equal(got_scores,
                                want_scores * weight_scales[:, None, None])


def test_blocks_start_with_the_fan_in_of_one_group():
  # Each mixed head sums over the h_k/G (or h/G) heads of its group only.
  layer = TalkingHeadsAttention(64, 4, num_head_groups=4,
                                dynamic_projections=["x2l"])
  layer.build_from_shapes([None, None, 32], [None, None, 32])
  weights = {ref.token_of(v): v.numpy() for v in layer.weights}
  np.testing.assert_allclose(weights["pre_softmax_projection"].std(),
                             16 ** -0.5, rtol=0.1)
  np.testing.assert_allclose(weights["post_softmax_projection"].std(),
                             16 ** -0.5, rtol=0.1)
  np.testing.assert_allclose(weights["x2l"].std(), 0.1 / np.sqrt(32 * 16),
                             rtol=0.1)


@pytest.mark.parametrize("kwargs", [
    dict(num_heads=12, key_dim=64, num_head_groups=3),
    dict(num_heads=12, key_dim=64, num_head_groups=12),
    dict(num_heads=8, key_dim=16, num_key_heads=4, num_value_heads=12,
         num_head_groups=4, use_bias=True),
    dict(num_heads=8, key_dim=16, num_head_groups=2,
         dynamic_projections=("x2l", "m2w")),
    dict(num_heads=6, key_dim=16, num_head_groups=2,
         dynamic_projections=DYNAMIC_PROJECTIONS),
    dict(num_heads=8, key_dim=16, num_value_heads=4, num_head_groups=4,
         project_logits=False, dynamic_projections=("x2w",)),
], ids=lambda kwargs: "-".join(f"{k}={v}" for k, v in kwargs.items()
                               if k not in ("num_heads", "key_dim")))
def test_count_params_equals_complexity(kwargs):
  d_model = 64
  layer = TalkingHeadsAttention(**kwargs)
  layer.build_from_shapes([None, None, d_model], [None, None, d_model])
  shape = complexity.AttentionShape("talking_heads", d_model=d_model,
                                    **kwargs)
  assert layer.count_params() == complexity.parameters(shape)


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_head_groups=0), "argument `num_head_groups`, expected a positive "
     "integer. Received: num_head_groups=0"),
    (dict(num_head_groups=-2), "argument `num_head_groups`, expected a positive integer"),
    (dict(num_head_groups=True), "Received: num_head_groups=True"),
    (dict(num_head_groups=2.0), "Received: num_head_groups=2.0"),
    (dict(num_head_groups=3), r"num_head_groups=3 must divide num_key_heads, "
     r"num_heads and num_value_heads, got num_key_heads=4, num_heads=8, "
     r"num_value_heads=12 \(num_key_heads, num_heads not divisible by 3\)"),
    (dict(num_head_groups=8), r"got num_key_heads=4, num_heads=8, "
     r"num_value_heads=12 \(num_key_heads, num_value_heads not divisible"),
])
def test_bad_group_counts_name_the_values(kwargs, message):
  with pytest.raises(ValueError, match=message):
    TalkingHeadsAttention(num_heads=H, key_dim=D_K, num_key_heads=H_K,
                          num_value_heads=H_V, **kwargs)


def test_config_round_trip_keeps_the_groups_and_the_weights():
  layer = _grouped(2, dynamic_projections=["m2l"])
  x = tf.random.normal([BATCH, N, D_X])
  layer(x, x)
  config = layer.get_config()
  assert config["num_head_groups"] == 2
  clone = TalkingHeadsAttention.from_config(config)
  assert clone.get_config() == config
  clone.set_weights(layer.get_weights())
  np.testing.assert_array_equal(clone(x, x), layer(x, x))
  # Configs written before num_head_groups existed load as G=1.
  del config["num_head_groups"], config["build_shapes"]
  assert TalkingHeadsAttention.from_config(config).num_head_groups == 1
