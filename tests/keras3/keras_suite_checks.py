"""Keras 3.15's own MultiHeadAttention tests, run on thattn's layer.

Keras ships the test suite of `keras.layers.MultiHeadAttention`
(keras/src/layers/attention/multi_head_attention_test.py). Here the same
test class runs with `layers.MultiHeadAttention` replaced by thattn.keras3's
MultiHeadAttention with Keras's one differing default (`use_bias=True`;
thattn's default is the paper's, no biases). Run by `backends_test.py` in
a process per backend, like backend_checks.py.

The tests that cannot apply are listed in NOT_APPLICABLE with the reason;
every other test of Keras's class runs unchanged.
"""

import types

import keras
from keras.src import layers as keras_layers
from keras.src.layers.attention import multi_head_attention_test as keras_suite
import pytest

from thattn import keras3

_RANK_3 = ("thattn's layers take [batch, length, width] inputs attended "
           "over the length (attention_axes None or (1,)); Keras's test "
           "uses inputs of rank 4 or 5")


@keras.saving.register_keras_serializable(package="thattn_tests")
class KerasDefaultsMultiHeadAttention(keras3.MultiHeadAttention):
  """thattn's multi-head attention with Keras's bias default."""

  def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0,
               use_bias=True, **kwargs):
    super().__init__(num_heads, key_dim, value_dim, dropout, use_bias,
                     **kwargs)


class _LayersWithThattn(types.ModuleType):
  """keras.src.layers, but MultiHeadAttention is thattn's."""

  MultiHeadAttention = KerasDefaultsMultiHeadAttention

  def __getattr__(self, name):
    return getattr(keras_layers, name)


keras_suite.layers = _LayersWithThattn("layers")

NOT_APPLICABLE = {
    "test_high_dim_attention": _RANK_3,
    "test_attention_axes_negative_indexing": _RANK_3,
    "test_causal_only_masks_non_4d_inputs": _RANK_3,
    "test_compute_output_shape_high_dim_same_proj": _RANK_3,
    "test_compute_output_shape_high_dim_different_proj": _RANK_3,
    "test_compute_output_shape_different_qv_last_dims": _RANK_3,
    "test_compute_output_shape_without_key_different_proj": (
        "output_shape=(3, 4): thattn's layers output [batch, length, d_Y]"),
    "test_compute_output_shape_with_key_different_proj": (
        "output_shape=(1, 5): thattn's layers output [batch, length, d_Y]"),
    "test_multi_head_attention_output_shape_as_tuple": (
        "output_shape=(8, 8): thattn's layers output [batch, length, d_Y]"),
    "test_correctness": (
        "sets Keras's weights and expects the 1/sqrt(d_k) applied at run "
        "time; thattn folds it into P_q's initializer, as the paper does "
        "(the same outputs for converted weights: test_from_keras_* in "
        "conventions_checks.py)"),
}


class TestKerasMultiHeadAttentionSuite(keras_suite.MultiHeadAttentionTest):
  """Keras's MultiHeadAttentionTest on thattn's layer."""


def _not_applicable(reason):
  @pytest.mark.skip(reason=reason)
  def test(self):
    del self
  return test


for _name, _reason in NOT_APPLICABLE.items():
  assert any(name.startswith(_name) for name in
             dir(keras_suite.MultiHeadAttentionTest)), _name
  for _test in [name for name in dir(keras_suite.MultiHeadAttentionTest)
                if name == _name or name.startswith(_name + "_")]:
    setattr(TestKerasMultiHeadAttentionSuite, _test, _not_applicable(_reason))
