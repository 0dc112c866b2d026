"""thattn.keras3 sharded through keras.distribution on JAX CPU devices.

Run by `backends_test.py` with KERAS_BACKEND=jax and
XLA_FLAGS=--xla_force_host_platform_device_count=8 (THATTN_MESH_DEVICES
says how many of them the mesh uses: 4 or 8).
"""

import os

import jax
import keras
from keras import ops
import numpy as np
import pytest

from thattn import keras3

DEVICES = int(os.environ.get("THATTN_MESH_DEVICES", "4"))
X = np.random.default_rng(0).normal(size=(4, 6, 16)).astype("float32")
MODEL_AXIS = DEVICES // 2  # a (batch=2, model=DEVICES/2) mesh


def _mesh():
  return keras.distribution.DeviceMesh(
      (2, MODEL_AXIS), ["batch", "model"], jax.devices()[:DEVICES])


def _sharded(make_layer, rules=None, num_head_groups=1, headwise_gate=False):
  """(sharded layer, unsharded layer with the same weights)."""
  plain = make_layer()
  plain(X, X)
  distribution = keras.distribution.ModelParallel(
      layout_map=keras3.layout_map(_mesh(), rules,
                                   num_head_groups=num_head_groups,
                                   headwise_gate=headwise_gate),
      batch_dim_name="batch")
  with distribution.scope():
    sharded = make_layer()
    sharded(X, X)
    sharded.set_weights(plain.get_weights())
  return sharded, plain


def _split_dims(variable):
  """The dimensions the variable's array is split along, by its sharding."""
  array = variable.value
  shard = array.sharding.shard_shape(array.shape)
  return tuple(i for i, (full, part) in enumerate(zip(array.shape, shard))
               if part != full)


def test_heads_are_split_and_outputs_equal():
  assert len(jax.devices()) >= DEVICES
  heads = 2 * MODEL_AXIS
  sharded, plain = _sharded(lambda: keras3.TalkingHeadsAttention(
      3, 4, num_key_heads=heads, num_value_heads=heads))
  np.testing.assert_allclose(ops.convert_to_numpy(sharded(X, X)),
                             ops.convert_to_numpy(plain(X, X)),
                             rtol=1e-5, atol=1e-5)
  split = {variable.path.split("/", 1)[1]: _split_dims(variable)
           for variable in sharded.weights}
  # [d_model, heads, d] kernels along heads, P_o [h_v, d_v, d] along h_v,
  # P_l [h_k, h] along h_k and P_w [h, h_v] along h_v; h stays whole.
  assert split == {"query/kernel": (1,), "key/kernel": (1,),
                   "value/kernel": (1,), "output/kernel": (0,),
                   "pre_softmax_projection": (0,),
                   "post_softmax_projection": (1,)}


def test_grouped_heads_shard_by_whole_groups():
  groups = MODEL_AXIS
  rules = ("batch:batch;head_groups:model;key_heads:model;"
           "value_heads:model")
  sharded, plain = _sharded(lambda: keras3.TalkingHeadsAttention(
      2 * groups, 4, num_key_heads=2 * groups, num_value_heads=2 * groups,
      num_head_groups=groups, dynamic_projections=["m2w"]), rules, groups)
  np.testing.assert_allclose(ops.convert_to_numpy(sharded(X, X)),
                             ops.convert_to_numpy(plain(X, X)),
                             rtol=1e-5, atol=1e-5)
  split = {variable.path.split("/", 1)[1]: _split_dims(variable)
           for variable in sharded.weights}
  # Blocks [G, ...] along the groups: one or more whole groups per device.
  assert split["pre_softmax_projection"] == (0,)
  assert split["post_softmax_projection"] == (0,)
  assert split["m2w/kernel"] == (1,)
  assert split["query/kernel"] == (1,)


@pytest.mark.parametrize("headwise", [False, True], ids=["element", "head"])
def test_the_gate_is_split_along_its_heads(headwise):
  sharded, plain = _sharded(lambda: keras3.MultiHeadAttention(
      2 * MODEL_AXIS, 4, use_gate=True, headwise_gate=headwise),
                            headwise_gate=headwise)
  np.testing.assert_allclose(ops.convert_to_numpy(sharded(X, X)),
                             ops.convert_to_numpy(plain(X, X)),
                             rtol=1e-5, atol=1e-5)
  gate = sharded.gate_dense.kernel  # [d_model, h_v(, d_v)]
  assert len(gate.shape) == (2 if headwise else 3)
  assert _split_dims(gate) == (1,)


def test_dcmha_shards_its_projections_and_its_kernels_by_rule():
  """Under the default rules P_q, P_k, P_v and P_o split along their
  heads and DCMHA's dynamic kernels stay whole; with "heads:model" alone
  (the compose mixes heads, so not both) Q_kw and D_d split along their
  heads axis instead. The outputs equal the unsharded layer's."""
  heads = 2 * MODEL_AXIS
  make = lambda: keras3.DynamicallyComposableAttention(heads, 4)
  for rules, query_split, factors_split in (
      (None, (1,), ()), ("batch:batch;heads:model", (), (3,))):
    sharded, plain = _sharded(make, rules)
    np.testing.assert_allclose(
        ops.convert_to_numpy(sharded(X, X, use_causal_mask=True)),
        ops.convert_to_numpy(plain(X, X, use_causal_mask=True)),
        rtol=1e-5, atol=1e-5)
    split = {variable.path.split("/", 1)[1]: _split_dims(variable)
             for variable in sharded.weights}
    assert split["query/kernel"] == query_split
    assert split["dynamic_factors"] == factors_split
    assert split["dynamic_gates"] == tuple(2 for _ in factors_split)
    assert split["dynamic_hidden"] == ()


def test_jit_compiles_the_sharded_layer():
  sharded, plain = _sharded(lambda: keras3.MultiHeadAttention(
      2 * MODEL_AXIS, 4))
  compiled = jax.jit(lambda x: sharded(x, x, use_causal_mask=True))
  np.testing.assert_allclose(
      np.asarray(compiled(X)),
      ops.convert_to_numpy(plain(X, X, use_causal_mask=True)),
      rtol=1e-5, atol=1e-5)


def test_heads_that_do_not_divide_the_mesh_axis_are_named():
  with pytest.raises(ValueError, match=r"talking_heads_attention.*could "
                     r"not be laid out on the device mesh"):
    _sharded(lambda: keras3.TalkingHeadsAttention(
        3, 4, num_key_heads=2 * MODEL_AXIS + 1,
        name="talking_heads_attention"))


def test_rules_naming_a_missing_mesh_axis_are_refused():
  with pytest.raises(ValueError, match="names mesh axis 'heads'"):
    keras3.layout_map(_mesh(), "key_heads:heads")
