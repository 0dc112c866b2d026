"""The fused talking-heads op with dynamic projections (the paper's App. A).

Forward: a float64 NumPy transcription of Appendix A's
TalkingHeadsAttentionWithDynamicProjections from J to U (per example,
J[n, m, h_k] as the paper writes it). Gradients of J, P_l, P_w, B and of
every dynamic projection R: TensorFlow's autodiff through the unfused ops
the layer runs without the kernel (`attention_ops`' einsums).
"""

import itertools

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
}
NAMES = fused.DYNAMIC_PROJECTIONS
# Each projection alone, and all four.
SUBSETS = [(name,) for name in NAMES] + [NAMES]
_MIXES = {
    "x2l": attention_ops.QUERY_DYNAMIC_LOGITS_MIX,
    "m2l": attention_ops.MEMORY_DYNAMIC_LOGITS_MIX,
    "x2w": attention_ops.QUERY_DYNAMIC_WEIGHTS_MIX,
    "m2w": attention_ops.MEMORY_DYNAMIC_WEIGHTS_MIX,
}


def _appendix_a(dots, pre, post, mask, bias, dynamic):
  """U[b, h_v, n, m], float64, as Appendix A writes it per example."""
  outputs = []
  for example in range(dots.shape[0]):
    j = dots[example].transpose(1, 2, 0).astype(np.float64)  # J[n, m, h_k]
    r = {name: value[example].astype(np.float64)
         for name, value in dynamic.items()}
    logits = np.einsum("nmk,kh->nmh", j, pre)
    if "x2l" in r:
      logits += np.einsum("nmk,nkh->nmh", j, r["x2l"])
    if "m2l" in r:
      logits += np.einsum("nmk,mkh->nmh", j, r["m2l"])
    if bias is not None:
      logits += bias[min(example, len(bias) - 1)].transpose(1, 2, 0)
    if mask is not None:
      logits = np.where(mask[example][..., None], logits,
                        attention_spec.MASKED_LOGIT)
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(axis=1, keepdims=True)  # softmax over m
    mixed = np.einsum("nmh,hv->nmv", weights, post)
    if "x2w" in r:
      mixed += np.einsum("nmh,nhv->nmv", weights, r["x2w"])
    if "m2w" in r:
      mixed += np.einsum("nmh,mhv->nmv", weights, r["m2w"])
    outputs.append(mixed.transpose(2, 0, 1))
  return np.stack(outputs)


def _unfused(dots, pre, post, mask, bias, dynamic):
  """The layer's TF-ops path: static mixes plus the dynamic einsums."""
  logits = attention_ops.mix_heads(dots, pre)
  for name in ("x2l", "m2l"):
    if name in dynamic:
      logits += tf.einsum(_MIXES[name], dots, dynamic[name])
  weights = attention_ops.masked_softmax(logits, mask, bias)
  mixed = attention_ops.mix_heads(weights, post)
  for name in ("x2w", "m2w"):
    if name in dynamic:
      mixed += tf.einsum(_MIXES[name], weights, dynamic[name])
  return mixed


def _inputs(shape, names, masked, seed=0, with_bias=False):
  batch, key_heads, heads, value_heads, length, memory = shape
  rng = np.random.default_rng(seed)
  normal = lambda *size: rng.normal(size=size).astype(np.float32)
  dots = normal(batch, key_heads, length, memory)
  pre, post = normal(key_heads, heads), normal(heads, value_heads)
  sizes = {"x2l": (length, key_heads, heads), "m2l": (memory, key_heads, heads),
           "x2w": (length, heads, value_heads),
           "m2w": (memory, heads, value_heads)}
  dynamic = {name: normal(batch, *sizes[name]) for name in names}
  mask = None
  if masked:
    mask = rng.uniform(size=(batch, length, memory)) > 0.4
    mask[:, 0, :] = False  # a fully masked query row: uniform, no NaN
  bias = normal(1, heads, length, memory) if with_bias else None
  return dots, pre, post, mask, bias, dynamic


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("names", SUBSETS, ids=["+".join(s) for s in SUBSETS])
@pytest.mark.parametrize("masked, rows_per_block",
                         [(False, 0), (True, 0), (True, 4)],
                         ids=["no_mask", "mask", "mask_blocks_of_4"])
def test_forward_equals_appendix_a(shape, names, masked, rows_per_block):
  dots, pre, post, mask, bias, dynamic = _inputs(shape, names, masked,
                                                 with_bias=True)
  mixed = fused.talking_heads_softmax(
      dots, pre, post, None if mask is None else mask[:, None], bias,
      dynamic=dynamic, rows_per_block=rows_per_block)
  expected = _appendix_a(dots, pre, post, mask, bias, dynamic)
  np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("names", SUBSETS, ids=["+".join(s) for s in SUBSETS])
@pytest.mark.parametrize("masked, rows_per_block",
                         [(False, 0), (True, 3)],
                         ids=["no_mask", "mask_blocks_of_3"])
def test_gradients_equal_autodiff_of_the_unfused_ops(shape, names, masked,
                                                     rows_per_block):
  dots, pre, post, mask, bias, dynamic = _inputs(shape, names, masked,
                                                 seed=1, with_bias=True)
  dots, pre, post, bias = map(tf.constant, (dots, pre, post, bias))
  dynamic = {name: tf.constant(value) for name, value in dynamic.items()}
  mask = None if mask is None else tf.constant(mask[:, None])
  upstream = tf.random.stateless_normal(
      [shape[0], shape[3], shape[4], shape[5]], seed=[2, 3])
  sources = [dots, pre, post, bias] + [dynamic[name] for name in names]

  def gradients(function, **kwargs):
    with tf.GradientTape() as tape:
      tape.watch(sources)
      mixed = function(dots, pre, post, mask, bias, dynamic=dynamic, **kwargs)
      loss = tf.reduce_sum(mixed * upstream)
    return tape.gradient(loss, sources)

  actual = gradients(fused.talking_heads_softmax,
                     rows_per_block=rows_per_block)
  expected = gradients(lambda *args, dynamic: _unfused(*args, dynamic))
  labels = ["dJ", "dP_l", "dP_w", "dB"] + [f"d{name}" for name in names]
  for label, a, e in zip(labels, actual, expected):
    assert a.shape == e.shape, label
    np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-4, atol=3e-5,
                               err_msg=label)


def test_a_dynamic_projection_of_the_wrong_shape_is_rejected():
  dots, pre, post, _, _, dynamic = _inputs(SHAPES["square"], ("m2l",), False)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"m2l \[b, h_k, h, m\] must be \[2,4,4,9\]"):
    fused.talking_heads_softmax(dots, pre, post,
                                dynamic={"m2l": dynamic["m2l"][:, :8]})
  with pytest.raises(ValueError, match=r"Unknown dynamic projections \['x2x'\]"):
    fused.talking_heads_softmax(dots, pre, post, dynamic={"x2x": dots})


def test_every_subset_inside_tf_function_with_unknown_shapes():
  shape = SHAPES["non_square"]
  for count in (2, 3):
    for names in itertools.combinations(NAMES, count):
      dots, pre, post, mask, _, dynamic = _inputs(shape, names, True, seed=4)
      signature = [tf.TensorSpec([None] * 4, tf.float32)] * (1 + len(names))

      @tf.function(input_signature=signature)
      def run(dots, *projections, names=names):
        return fused.talking_heads_softmax(
            dots, pre, post, mask[:, None],
            dynamic=dict(zip(names, projections)))

      mixed = run(dots, *[dynamic[name] for name in names])
      np.testing.assert_allclose(
          mixed.numpy(), _appendix_a(dots, pre, post, mask, None, dynamic),
          rtol=1e-5, atol=1e-5, err_msg="+".join(names))
