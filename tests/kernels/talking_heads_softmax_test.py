"""The fused talking-heads softmax op against NumPy and TensorFlow ops.

Forward: a float64 NumPy transcription of mix -> masked softmax -> mix.
Gradients: TensorFlow's autodiff through the same computation written with
TensorFlow ops, the path the layers take without the kernel. The kernel is
expected to build here (CI has g++); a failure to build fails these tests.
"""

import numpy as np
import pytest
import tensorflow as tf

from thattn.core import attention_spec
from thattn.kernels import talking_heads_softmax as fused
from thattn.layers import attention_ops

# (batch, h_k, h, h_v, n, m)
SHAPES = {
    "square": (2, 4, 4, 4, 7, 9),
    "non_square": (2, 3, 5, 2, 6, 11),
    "one_query_one_memory": (1, 2, 3, 2, 1, 1),
    "wide_heads": (1, 6, 24, 6, 5, 8),
}


def _numpy_reference(dots, pre, post, mask, bias=None):
  """U[b, h_v, n, m] in float64; mask [b, n, m] or None; bias as B."""
  logits = np.einsum("bknm,kh->bhnm", dots.astype(np.float64), pre)
  if bias is not None:
    logits = logits + bias
  if mask is not None:
    logits = np.where(mask[:, None], logits, attention_spec.MASKED_LOGIT)
  logits -= logits.max(axis=-1, keepdims=True)
  weights = np.exp(logits)
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum("bhnm,hv->bvnm", weights, post)


def _tensorflow_ops(dots, pre, post, mask, bias=None):
  logits = attention_ops.mix_heads(dots, pre)
  weights = attention_ops.masked_softmax(logits, mask, bias)
  return attention_ops.mix_heads(weights, post)


def _gradients_with_bias(function, dots, pre, post, mask, bias, upstream):
  """[dJ, dP_l, dP_w, dB] of sum(function(J, P_l, P_w, mask, B) * upstream),
  the product taken in float32 whatever J's dtype."""
  with tf.GradientTape() as tape:
    tape.watch([dots, pre, post, bias])
    mixed = function(dots, pre, post, mask, bias)
    loss = tf.reduce_sum(tf.cast(mixed, tf.float32) *
                         tf.cast(upstream, tf.float32))
  return tape.gradient(loss, [dots, pre, post, bias])


def _assert_gradients_equal_tensorflow_ops(*inputs):
  """The kernel's dJ, dP_l, dP_w, dB equal autodiff of the TF ops (float32);
  `inputs` as `_gradients_with_bias` takes them after the function."""
  actual = _gradients_with_bias(fused.talking_heads_softmax, *inputs)
  expected = _gradients_with_bias(_tensorflow_ops, *inputs)
  for name, a, e in zip(("dJ", "dP_l", "dP_w", "dB"), actual, expected):
    assert a.shape == e.shape, name
    np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-4, atol=2e-5,
                               err_msg=name)


# The op's four dynamic-projection inputs, absent.
_NO_DYNAMIC_PROJECTIONS = [tf.zeros([0])] * 4


def _inputs(shape, masked, seed=0):
  batch, key_heads, heads, value_heads, length, memory = shape
  rng = np.random.default_rng(seed)
  dots = rng.normal(size=(batch, key_heads, length, memory)).astype(np.float32)
  pre = rng.normal(size=(key_heads, heads)).astype(np.float32)
  post = rng.normal(size=(heads, value_heads)).astype(np.float32)
  mask = None
  if masked:
    mask = rng.uniform(size=(batch, length, memory)) > 0.4
    mask[:, 0, :] = False  # a fully masked query row: uniform, no NaN
  return dots, pre, post, mask


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("rows_per_block", [0, 1, 4])
def test_forward_equals_numpy(shape, masked, rows_per_block):
  dots, pre, post, mask = _inputs(shape, masked)
  mixed = fused.talking_heads_softmax(
      dots, pre, post, None if mask is None else mask[:, None],
      rows_per_block=rows_per_block)
  expected = _numpy_reference(dots, pre, post, mask)
  np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("rows_per_block", [0, 3])
def test_gradients_equal_tensorflow_ops(shape, masked, rows_per_block):
  dots, pre, post, mask = _inputs(shape, masked, seed=1)
  dots, pre, post = map(tf.constant, (dots, pre, post))
  if mask is not None:
    mask = tf.constant(mask[:, None])
  upstream = tf.random.stateless_normal(
      [shape[0], shape[3], shape[4], shape[5]], seed=[2, 3])

  def gradients(function, **kwargs):
    with tf.GradientTape() as tape:
      tape.watch([dots, pre, post])
      loss = tf.reduce_sum(function(dots, pre, post, mask, **kwargs) *
                           upstream)
    return tape.gradient(loss, [dots, pre, post])

  actual = gradients(fused.talking_heads_softmax,
                     rows_per_block=rows_per_block)
  expected = gradients(_tensorflow_ops)
  for name, a, e in zip(("dJ", "dP_l", "dP_w"), actual, expected):
    np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-4, atol=2e-5,
                               err_msg=name)


def test_masked_positions_get_no_gradient_and_rows_are_distributions():
  dots, pre, post, mask = _inputs(SHAPES["square"], masked=True, seed=4)
  dots = tf.constant(dots)
  identity = np.eye(4, dtype=np.float32)
  with tf.GradientTape() as tape:
    tape.watch(dots)
    weights = fused.talking_heads_softmax(dots, identity, identity,
                                          mask[:, None])
    loss = tf.reduce_sum(weights * tf.random.normal(weights.shape))
  np.testing.assert_allclose(tf.reduce_sum(weights, -1).numpy(), 1.0,
                             rtol=1e-6)
  partly_masked = mask.any(axis=-1, keepdims=True) & ~mask
  assert np.all(weights.numpy()[np.broadcast_to(
      partly_masked[:, None], weights.shape)] == 0.0)
  gradient = tape.gradient(loss, dots).numpy()
  assert np.all(gradient[np.broadcast_to(~mask[:, None], gradient.shape)]
                == 0.0)


# B shapes: T5's shared [1, h, n, m], per example, one row broadcast over
# the queries, and rank 3 (broadcast over the batch).
BIAS_SHAPES = [(1, 5, 6, 11), (2, 5, 6, 11), (1, 5, 1, 11), (5, 6, 11)]


@pytest.mark.parametrize("bias_shape", BIAS_SHAPES, ids=str)
def test_bias_forward_and_gradients(bias_shape):
  dots, pre, post, mask = _inputs(SHAPES["non_square"], masked=True, seed=9)
  bias = np.random.default_rng(10).normal(size=bias_shape).astype(np.float32)
  np.testing.assert_allclose(
      fused.talking_heads_softmax(dots, pre, post, mask[:, None],
                                  bias).numpy(),
      _numpy_reference(dots, pre, post, mask, bias), rtol=1e-5, atol=1e-5)
  inputs = (*map(tf.constant, (dots, pre, post, mask[:, None], bias)),
            tf.random.stateless_normal([2, 2, 6, 11], seed=[11, 12]))
  _assert_gradients_equal_tensorflow_ops(*inputs)


def test_bias_of_the_wrong_shape_is_rejected():
  ops = fused.build.load(fused.KERNEL)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"bias must be \[1 or b, h, n, m\] with b = 2, "
                     r"h = 4, n = 7, m = 9"):
    ops.thattn_talking_heads_softmax(
        tf.zeros([2, 4, 7, 9]), tf.eye(4), tf.eye(4), tf.zeros([0], tf.bool),
        tf.zeros([3, 4, 7, 9]), *_NO_DYNAMIC_PROJECTIONS)


@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 9), (1, 1, 7, 9), (7, 9)])
def test_broadcast_masks(mask_shape):
  dots, pre, post, _ = _inputs(SHAPES["square"], masked=False, seed=5)
  mask = np.random.default_rng(6).uniform(size=mask_shape) > 0.3
  full = np.broadcast_to(mask, (2, 1, 7, 9))
  np.testing.assert_allclose(
      fused.talking_heads_softmax(dots, pre, post, mask).numpy(),
      _numpy_reference(dots, pre, post, full[:, 0]), rtol=1e-5, atol=1e-5)


def test_none_projection_means_identity():
  dots, pre, post, mask = _inputs((2, 3, 3, 3, 5, 6), masked=True, seed=7)
  identity = np.eye(3)
  np.testing.assert_allclose(
      fused.talking_heads_softmax(dots, None, post, mask[:, None]).numpy(),
      _numpy_reference(dots, identity, post, mask), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
      fused.talking_heads_softmax(dots, pre, None, mask[:, None]).numpy(),
      _numpy_reference(dots, pre, identity, mask), rtol=1e-5, atol=1e-5)


def test_inside_tf_function_with_unknown_shapes():
  dots, pre, post, mask = _inputs(SHAPES["non_square"], masked=True, seed=8)
  function = tf.function(
      fused.talking_heads_softmax,
      input_signature=[tf.TensorSpec([None, 3, None, None]),
                       tf.TensorSpec([3, 5]), tf.TensorSpec([5, 2]),
                       tf.TensorSpec([None, 1, None, None], tf.bool)])
  np.testing.assert_allclose(
      function(dots, pre, post, mask[:, None]).numpy(),
      _numpy_reference(dots, pre, post, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre_shape, post_shape, message", [
    ((3, 4), (4, 4), r"pre must be \[h_k, h\] or \[G, h_k/G, h/G\] with "
     r"h_k = 4"),
    ((4, 4), (3, 4), r"post must be \[h, h_v\] or \[G, h/G, h_v/G\] with "
     r"h = 4"),
])
def test_mismatched_projections_are_rejected(pre_shape, post_shape, message):
  dots = tf.zeros([2, 4, 7, 9])
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                     match=message):
    fused.talking_heads_softmax(dots, tf.zeros(pre_shape),
                                tf.zeros(post_shape))


def test_mask_of_the_wrong_shape_is_rejected():
  ops = fused.build.load(fused.KERNEL)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"mask must be \[b, n, m\] = \[2, 7, 9\]"):
    ops.thattn_talking_heads_softmax(tf.zeros([2, 4, 7, 9]), tf.eye(4),
                                     tf.eye(4), tf.ones([2, 7, 8], tf.bool),
                                     tf.zeros([0]), *_NO_DYNAMIC_PROJECTIONS)


def test_unsupported_reasons():
  dots = tf.zeros([1, 2, 3, 3])
  assert fused.unsupported_reason(dots) is None
  for dtype in (tf.bfloat16, tf.float16):  # mixed precision
    assert fused.unsupported_reason(tf.zeros([1, 2, 3, 3], dtype)) is None
  assert fused.unsupported_reason(tf.zeros([1, 2, 3, 3], tf.float64)) == (
      "the scores are float64; the kernel takes float32, bfloat16, float16")

  traced_reasons = []

  @tf.function(jit_compile=True)
  def under_xla(dots):
    traced_reasons.append(fused.unsupported_reason(dots))
    return dots + 1

  under_xla(dots)
  assert "XLA" in traced_reasons[0]


def _block_diagonal(blocks):
  """The dense [G*i, G*o] matrix of [G, i, o] blocks."""
  groups, rows, cols = blocks.shape
  dense = np.zeros((groups * rows, groups * cols), blocks.dtype)
  for group in range(groups):
    dense[group * rows:(group + 1) * rows,
          group * cols:(group + 1) * cols] = blocks[group]
  return dense


# (batch, h_k, h, h_v, n, m, G)
GROUPED_SHAPES = {
    "G=2": (2, 4, 4, 4, 7, 9, 2),
    "G=3_non_square": (2, 3, 6, 9, 5, 6, 3),
    "G=4_one_head_each": (1, 4, 4, 4, 3, 5, 4),
}


@pytest.mark.parametrize("shape", GROUPED_SHAPES.values(),
                         ids=GROUPED_SHAPES.keys())
@pytest.mark.parametrize("rows_per_block", [0, 2])
def test_grouped_forward_equals_the_block_diagonal_form(shape,
                                                        rows_per_block):
  *sizes, groups = shape
  dots, _, _, mask = _inputs(tuple(sizes), masked=True, seed=7)
  batch, key_heads, heads, value_heads, _, _ = sizes
  rng = np.random.default_rng(8)
  pre = rng.normal(size=(groups, key_heads // groups, heads // groups))
  post = rng.normal(size=(groups, heads // groups, value_heads // groups))
  pre, post = pre.astype(np.float32), post.astype(np.float32)
  mixed = fused.talking_heads_softmax(dots, pre, post, mask[:, None],
                                      rows_per_block=rows_per_block)
  expected = _numpy_reference(dots, _block_diagonal(pre),
                              _block_diagonal(post), mask)
  np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", GROUPED_SHAPES.values(),
                         ids=GROUPED_SHAPES.keys())
def test_grouped_gradients_equal_tensorflow_ops(shape):
  *sizes, groups = shape
  dots, _, _, mask = _inputs(tuple(sizes), masked=True, seed=9)
  batch, key_heads, heads, value_heads, length, memory = sizes
  pre = tf.random.stateless_normal(
      [groups, key_heads // groups, heads // groups], seed=[10, 11])
  post = tf.random.stateless_normal(
      [groups, heads // groups, value_heads // groups], seed=[12, 13])
  dots, mask = tf.constant(dots), tf.constant(mask[:, None])
  bias = tf.random.stateless_normal([1, heads, length, memory], seed=[1, 4])
  upstream = tf.random.stateless_normal(
      [batch, value_heads, length, memory], seed=[14, 15])

  inputs = (dots, pre, post, mask, bias, upstream)
  _assert_gradients_equal_tensorflow_ops(*inputs)


def test_grouped_projections_that_do_not_fit_are_rejected():
  ops = fused.build.load(fused.KERNEL)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"pre must be \[h_k, h\] or \[G, h_k/G, h/G\] "
                     r"with h_k = 4"):
    ops.thattn_talking_heads_softmax(
        tf.zeros([2, 4, 7, 9]), tf.zeros([3, 1, 2]), tf.eye(6),
        tf.zeros([0], tf.bool), tf.zeros([0]), *_NO_DYNAMIC_PROJECTIONS)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="dynamic projections need dense pre and post"):
    ops.thattn_talking_heads_softmax(
        tf.zeros([2, 4, 7, 9]), tf.zeros([2, 2, 2]), tf.eye(4),
        tf.zeros([0], tf.bool), tf.zeros([0]), tf.zeros([2, 7, 4, 4]),
        *_NO_DYNAMIC_PROJECTIONS[1:])


# Mixed precision: J and dU in bfloat16 or float16, everything inside in
# float32, U and dJ rounded to J's dtype. The references take the same
# rounded J (and dU) in float64 / float32, so the only differences are the
# final rounding to the narrow dtype.
NARROW = {"bfloat16": (tf.bfloat16, 2.0**-8), "float16": (tf.float16, 2.0**-11)}


@pytest.mark.parametrize("dtype, epsilon", NARROW.values(), ids=NARROW.keys())
@pytest.mark.parametrize("shape", [SHAPES["non_square"], SHAPES["wide_heads"]],
                         ids=["non_square", "wide_heads"])
@pytest.mark.parametrize("rows_per_block", [0, 3])
def test_narrow_forward_equals_numpy(dtype, epsilon, shape, rows_per_block):
  dots, pre, post, mask = _inputs(shape, masked=True, seed=16)
  narrow = tf.cast(dots, dtype)
  mixed = fused.talking_heads_softmax(narrow, pre, post, mask[:, None],
                                      rows_per_block=rows_per_block)
  assert mixed.dtype == dtype
  expected = _numpy_reference(tf.cast(narrow, tf.float32).numpy(), pre,
                              post, mask)
  # U is rounded once, to half a unit in its last place.
  np.testing.assert_allclose(tf.cast(mixed, tf.float64).numpy(), expected,
                             rtol=epsilon, atol=1e-6)


@pytest.mark.parametrize("dtype, epsilon", NARROW.values(), ids=NARROW.keys())
def test_narrow_gradients_equal_float32_tensorflow_ops(dtype, epsilon):
  dots, pre, post, mask = _inputs(SHAPES["non_square"], masked=True, seed=17)
  narrow = tf.cast(dots, dtype)
  pre, post = tf.constant(pre), tf.constant(post)
  mask = tf.constant(mask[:, None])
  bias = tf.random.stateless_normal([1, 5, 6, 11], seed=[18, 19])
  upstream = tf.cast(tf.random.stateless_normal([2, 2, 6, 11], seed=[20, 21]),
                     dtype)

  actual = _gradients_with_bias(fused.talking_heads_softmax, narrow, pre,
                                post, mask, bias, upstream)
  expected = _gradients_with_bias(_tensorflow_ops,
                                  tf.cast(narrow, tf.float32), pre, post,
                                  mask, bias, upstream)
  assert actual[0].dtype == dtype and actual[1].dtype == tf.float32
  for name, a, e in zip(("dJ", "dP_l", "dP_w", "dB"), actual, expected):
    e = e.numpy()
    # dJ is rounded to the narrow dtype; the rest stay float32.
    tolerance = epsilon if name == "dJ" else 1e-5
    np.testing.assert_allclose(tf.cast(a, tf.float32).numpy(), e,
                               rtol=tolerance,
                               atol=tolerance * np.max(np.abs(e)),
                               err_msg=name)
