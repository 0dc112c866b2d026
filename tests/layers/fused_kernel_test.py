"""TalkingHeadsAttention with and without the fused kernel: same results.

The layer uses `thattn.kernels.talking_heads_softmax` by default where it can
(fused_kernel=None). These tests check that it really does here (also
with a position bias and in the chunked core), that it gives the
TensorFlow-ops path's outputs and gradients (with dynamic projections and
with head groups too), and that it steps aside (or, with fused_kernel=True,
says why it cannot run) under XLA, mixed precision, grouped dynamic
projections and SavedModel tracing. The kernel itself is tested in
tests/kernels.
"""

import os
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tests import forkserver
from thattn import layers
from thattn.layers import chunked

FUSED_OP = "ThattnTalkingHeadsSoftmax"
FUSED_GRADIENT_OP = "ThattnTalkingHeadsSoftmaxGrad"
BATCH, LENGTH, WIDTH = 2, 7, 12

VARIANTS = {
    "square": lambda **kw: layers.TalkingHeadsAttention(4, 3, **kw),
    "non_square": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=6, **kw),
    "logits_only": lambda **kw: layers.TalkingHeadsAttention(
        3, 4, project_weights=False, **kw),
    "weights_only": lambda **kw: layers.TalkingHeadsAttention(
        3, 4, project_logits=False, num_value_heads=2, **kw),
}


def _op_types(function, *args):
  """Types of the ops in `function`'s graph, including nested functions."""
  graph = tf.function(function).get_concrete_function(*args).graph
  types = {op.type for op in graph.get_operations()}
  for nested in graph._functions.values():  # pylint: disable=protected-access
    types |= {node.op for node in nested.cached_definition.node_def}
  return types


def _outputs_and_gradients(layer, query, **kwargs):
  with tf.GradientTape() as tape:
    tape.watch(query)
    output = layer(query, query, **kwargs)
    loss = tf.reduce_sum(output * tf.sin(output))
  return [output] + tape.gradient(loss, [query] + layer.trainable_variables)


def _assert_close(actual, expected):
  """Equal to float32 rounding at the scale of the expected values."""
  expected = expected.numpy()
  scale = max(1.0, float(np.max(np.abs(expected))))
  np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5,
                             atol=1e-6 * scale)


def _twin_layers(make_layer, **default_kwargs):
  """(fused by default, fused_kernel=False), built, with equal weights."""
  tf_keras.utils.set_random_seed(0)
  default = make_layer(**default_kwargs)
  plain = make_layer(fused_kernel=False)
  query = tf.zeros([1, LENGTH, WIDTH])
  default(query, query)
  plain(query, query)
  plain.set_weights(default.get_weights())
  return default, plain


@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("masking", ["none", "padding", "causal"])
def test_fused_equals_tensorflow_ops(make_layer, masking):
  default, plain = _twin_layers(make_layer)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[1, 2])
  kwargs = {}
  if masking == "padding":
    kwargs["attention_mask"] = tf.sequence_mask([LENGTH, 3], LENGTH)[:, None]
  if masking == "causal":
    kwargs["use_causal_mask"] = True
  fused_results = tf.function(_outputs_and_gradients)(default, query,
                                                      **kwargs)
  assert FUSED_GRADIENT_OP in _op_types(
      lambda q: _outputs_and_gradients(default, q, **kwargs), query)
  assert FUSED_OP not in _op_types(lambda q: plain(q, q, **kwargs), query)
  plain_results = _outputs_and_gradients(plain, query, **kwargs)
  assert len(fused_results) == len(plain_results)
  for fused_value, plain_value in zip(fused_results, plain_results):
    _assert_close(fused_value, plain_value)


@pytest.mark.parametrize("make_layer", VARIANTS.values(), ids=VARIANTS.keys())
@pytest.mark.parametrize("masking", ["padding", "causal"])
def test_chunked_fused_equals_plain_tensorflow_ops(make_layer, masking):
  """The chunked core with the kernel per chunk (chunks of 3 over 7 rows)."""
  chunked, plain = _twin_layers(make_layer, query_chunk_size=3)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[13, 14])
  kwargs = ({"use_causal_mask": True} if masking == "causal" else
            {"attention_mask": tf.sequence_mask([LENGTH, 3], LENGTH)[:, None]})
  assert FUSED_GRADIENT_OP in _op_types(
      lambda q: _outputs_and_gradients(chunked, q, **kwargs), query)
  for chunked_value, plain_value in zip(
      tf.function(_outputs_and_gradients)(chunked, query, **kwargs),
      _outputs_and_gradients(plain, query, **kwargs)):
    _assert_close(chunked_value, plain_value)


@pytest.mark.parametrize("chunk_size", [None, 3], ids=["plain", "chunked"])
def test_fused_with_position_bias_equals_tensorflow_ops(chunk_size):
  """T5's case: a shared [1, h, n, m] bias that itself gets a gradient."""
  default, plain = _twin_layers(VARIANTS["non_square"],
                                query_chunk_size=chunk_size)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[15, 16])
  bias = tf.random.stateless_normal([1, 4, LENGTH, LENGTH], seed=[17, 18])

  def outputs_and_gradients(layer):
    with tf.GradientTape() as tape:
      tape.watch([query, bias])
      output = layer(query, query, position_bias=bias, use_causal_mask=True)
      loss = tf.reduce_sum(output * tf.sin(output))
    return [output] + tape.gradient(
        loss, [query, bias] + layer.trainable_variables)

  assert FUSED_OP in _op_types(lambda: outputs_and_gradients(default))
  for fused_value, plain_value in zip(outputs_and_gradients(default),
                                      outputs_and_gradients(plain)):
    _assert_close(fused_value, plain_value)


def test_fused_attention_scores_equal_tensorflow_ops():
  default, plain = _twin_layers(VARIANTS["non_square"])
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[3, 4])
  _, fused_scores = default(query, query, return_attention_scores=True)
  _, plain_scores = plain(query, query, return_attention_scores=True)
  _assert_close(fused_scores, plain_scores)


# Dynamic projections (Appendix A): each alone, and all four on unequal
# head counts.
DYNAMIC = {
    **{name: (lambda name: lambda **kw: layers.TalkingHeadsAttention(
        4, 3, dynamic_projections=[name], **kw))(name)
       for name in ("x2l", "m2l", "x2w", "m2w")},
    "all_four_non_square": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=6,
        dynamic_projections=["x2l", "m2l", "x2w", "m2w"], **kw),
}


@pytest.mark.parametrize("make_layer", DYNAMIC.values(), ids=DYNAMIC.keys())
@pytest.mark.parametrize("masking", ["padding", "causal"])
@pytest.mark.parametrize("chunk_size", [None, 3], ids=["plain", "chunked"])
def test_dynamic_projections_fused_equal_tensorflow_ops(make_layer, masking,
                                                        chunk_size):
  """Plain, and in the chunked core (chunks of 3 over 7 query rows: R_X
  sliced per chunk, R_M whole, a padded last chunk)."""
  default, plain = _twin_layers(make_layer, query_chunk_size=chunk_size)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[19, 20])
  kwargs = ({"use_causal_mask": True} if masking == "causal" else
            {"attention_mask": tf.sequence_mask([LENGTH, 3], LENGTH)[:, None]})
  types = _op_types(lambda q: _outputs_and_gradients(default, q, **kwargs),
                    query)
  assert FUSED_GRADIENT_OP in types
  assert ("StatelessWhile" in types) == (chunk_size is not None)  # chunks
  fused_results = tf.function(_outputs_and_gradients)(default, query,
                                                      **kwargs)
  plain_results = _outputs_and_gradients(plain, query, **kwargs)
  assert len(fused_results) == len(plain_results)
  for fused_value, plain_value in zip(fused_results, plain_results):
    _assert_close(fused_value, plain_value)


@pytest.mark.parametrize("chunk_size", [None, 3], ids=["plain", "chunked"])
def test_dynamic_projections_fused_over_a_memory_of_another_length(
    chunk_size):
  """Cross attention: R_Ml and R_Mw run along the memory's 5 positions."""
  default, plain = _twin_layers(DYNAMIC["all_four_non_square"],
                                query_chunk_size=chunk_size)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[21, 22])
  memory = tf.random.stateless_normal([BATCH, 5, WIDTH], seed=[23, 24])

  def outputs_and_gradients(layer):
    with tf.GradientTape() as tape:
      tape.watch([query, memory])
      output = layer(query, memory)
      loss = tf.reduce_sum(output * tf.sin(output))
    return [output] + tape.gradient(
        loss, [query, memory] + layer.trainable_variables)

  assert FUSED_OP in _op_types(lambda: outputs_and_gradients(default))
  for fused_value, plain_value in zip(outputs_and_gradients(default),
                                      outputs_and_gradients(plain)):
    _assert_close(fused_value, plain_value)


# Grouped talking heads: the kernel mixes each group's heads on its own.
GROUPED = {
    "G=2": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, num_head_groups=2, **kw),
    "G=2_non_square": lambda **kw: layers.TalkingHeadsAttention(
        4, 3, value_dim=5, num_key_heads=2, num_value_heads=6,
        num_head_groups=2, **kw),
    "G=3_logits_only": lambda **kw: layers.TalkingHeadsAttention(
        6, 2, project_weights=False, num_head_groups=3, **kw),
}


@pytest.mark.parametrize("make_layer", GROUPED.values(), ids=GROUPED.keys())
@pytest.mark.parametrize("chunk_size", [None, 3], ids=["plain", "chunked"])
def test_grouped_fused_equals_tensorflow_ops(make_layer, chunk_size):
  default, plain = _twin_layers(make_layer, query_chunk_size=chunk_size)
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[25, 26])
  kwargs = {"use_causal_mask": True}
  assert FUSED_GRADIENT_OP in _op_types(
      lambda q: _outputs_and_gradients(default, q, **kwargs), query)
  for fused_value, plain_value in zip(
      tf.function(_outputs_and_gradients)(default, query, **kwargs),
      _outputs_and_gradients(plain, query, **kwargs)):
    _assert_close(fused_value, plain_value)


FALLBACKS = {
    "grouped_dynamic_projections": (
        lambda **kw: layers.TalkingHeadsAttention(
            4, 3, num_head_groups=2, dynamic_projections=["m2w"], **kw),
        {}, "no grouped dynamic projections"),
}


@pytest.mark.parametrize("case", FALLBACKS.values(), ids=FALLBACKS.keys())
def test_falls_back_where_the_kernel_cannot_run(case):
  make_layer, kwargs, reason = case
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[5, 6])
  default, plain = _twin_layers(make_layer)
  assert FUSED_OP not in _op_types(lambda q: default(q, q, **kwargs), query)
  np.testing.assert_allclose(default(query, query, **kwargs).numpy(),
                             plain(query, query, **kwargs).numpy())
  required = make_layer(fused_kernel=True)
  with pytest.raises(ValueError, match=f"fused_kernel=True, but .*{reason}"):
    required(query, query, **kwargs)


@pytest.mark.parametrize("policy, epsilon", [("mixed_bfloat16", 2.0**-8),
                                             ("mixed_float16", 2.0**-11)])
@pytest.mark.parametrize("chunk_size", [None, 3], ids=["plain", "chunked"])
@pytest.mark.parametrize("make_layer", [VARIANTS["non_square"],
                                        DYNAMIC["all_four_non_square"]],
                         ids=["non_square", "dynamic"])
def test_mixed_precision_fused_equals_tensorflow_ops(policy, epsilon,
                                                     chunk_size, make_layer):
  """J and U in the policy's dtype through the kernel, which computes in
  float32; the TF-ops path mixes in the narrow dtype and takes the softmax
  in float32, so the two differ by a few of the narrow dtype's roundings
  (at most 6.5 units of its epsilon here, relative to the largest value).
  """
  tf_keras.mixed_precision.set_global_policy(policy)
  try:
    default, plain = _twin_layers(make_layer, query_chunk_size=chunk_size)
  finally:
    tf_keras.mixed_precision.set_global_policy("float32")
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[7, 8])
  kwargs = {"use_causal_mask": True}
  assert FUSED_GRADIENT_OP in _op_types(
      lambda q: _outputs_and_gradients(default, q, **kwargs), query)
  fused_results = tf.function(_outputs_and_gradients)(default, query,
                                                      **kwargs)
  plain_results = _outputs_and_gradients(plain, query, **kwargs)
  assert fused_results[0].dtype == plain_results[0].dtype != tf.float32
  for fused_value, plain_value in zip(fused_results, plain_results):
    expected = tf.cast(plain_value, tf.float32).numpy()
    np.testing.assert_allclose(
        tf.cast(fused_value, tf.float32).numpy(), expected, rtol=0,
        atol=16 * epsilon * max(1.0, float(np.max(np.abs(expected)))))


def test_falls_back_under_xla_with_equal_results():
  default, plain = _twin_layers(VARIANTS["square"])
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[9, 10])
  compiled = tf.function(lambda q: _outputs_and_gradients(default, q),
                         jit_compile=True)
  for xla_value, plain_value in zip(compiled(query),
                                    _outputs_and_gradients(plain, query)):
    _assert_close(xla_value, plain_value)
  required = layers.TalkingHeadsAttention(4, 3, fused_kernel=True)
  with pytest.raises(ValueError, match="XLA"):
    tf.function(lambda q: required(q, q), jit_compile=True)(query)


def test_saved_model_holds_no_fused_op_and_reloads(tmp_path):
  inputs = tf_keras.Input([LENGTH, WIDTH])
  model = tf_keras.Model(
      inputs, layers.TalkingHeadsAttention(4, 3)(inputs, inputs))
  query = tf.random.stateless_normal([BATCH, LENGTH, WIDTH], seed=[11, 12])
  expected = model(query)  # traced with the fused op before saving
  model.save(str(tmp_path / "model"), save_format="tf")
  saved = (tmp_path / "model" / "saved_model.pb").read_bytes()
  assert b"talking_heads_attention" in saved  # the layer is in there
  assert FUSED_OP.encode() not in saved
  reloaded = tf.saved_model.load(str(tmp_path / "model"))
  np.testing.assert_allclose(reloaded(query).numpy(), expected.numpy(),
                             rtol=1e-5, atol=1e-6)


def test_config_round_trip_and_bad_values():
  layer = layers.TalkingHeadsAttention(4, 3, fused_kernel=False)
  assert layer.get_config()["fused_kernel"] is False
  copy = layers.TalkingHeadsAttention.from_config(layer.get_config())
  assert copy.fused_kernel is False
  with pytest.raises(ValueError, match="fused_kernel must be None, True or "
                     "False, got 'yes'"):
    layers.TalkingHeadsAttention(4, 3, fused_kernel="yes")


def test_switched_off_by_environment(tmp_path):
  """THATTN_FUSED_KERNELS=0: TensorFlow ops, and True says why it cannot."""
  script = textwrap.dedent("""
      import tensorflow as tf
      from thattn import layers
      query = tf.ones([1, 3, 8])
      layer = layers.TalkingHeadsAttention(2, 4)
      graph = tf.function(lambda q: layer(q, q)).get_concrete_function(
          query).graph
      assert "ThattnTalkingHeadsSoftmax" not in {
          op.type for op in graph.get_operations()}
      try:
        layers.TalkingHeadsAttention(2, 4, fused_kernel=True)(query, query)
      except ValueError as error:
        print("REFUSED:", error)
      """)
  env = dict(os.environ, THATTN_FUSED_KERNELS="0",
             THATTN_CACHE_DIR=str(tmp_path))
  result = forkserver.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "REFUSED:" in result.stdout
  assert "THATTN_FUSED_KERNELS=0 turns the kernels off" in result.stdout
  assert not (tmp_path / "kernels").exists()


def test_chunked_core_takes_dynamic_projections_only_with_the_kernel():
  query = tf.zeros([1, 4, 2, 3])
  with pytest.raises(ValueError, match=r"dynamic projections \['x2l'\] only "
                     r"through the fused kernel \(fused=True\); got "
                     r"fused=False"):
    chunked.attention_core(query, query, query, pre_softmax=tf.eye(2),
                           dynamic={"x2l": tf.zeros([1, 4, 2, 2])},
                           fused=False)
