"""thattn's layers in code written for tf_keras's MultiHeadAttention.

Each test is one thing a user porting tf_keras (or Model Garden) code meets:
the positional call order, numeric masks, compute_output_shape, ragged
inputs, tf_keras's constructor names, weights carried over exactly in both
directions (`from_keras`, `to_keras`), configs and files written by the
previous release, and Keras 3 tensors. tf_keras's own layer is the anchor.
"""

import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import layers

RNG = np.random.default_rng(0)
QUERY = tf.constant(RNG.normal(size=(2, 5, 12)), tf.float32)
MEMORY = tf.constant(RNG.normal(size=(2, 7, 10)), tf.float32)
KEY = tf.constant(RNG.normal(size=(2, 7, 6)), tf.float32)
MASK = RNG.random((2, 5, 7)) > 0.3


def _relative_error(got, want):
  got, want = np.asarray(got), np.asarray(want)
  return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


def _random_keras_layer(layer_class=tf_keras.layers.MultiHeadAttention,
                        **kwargs):
  """A built tf_keras-style layer with random kernels and biases."""
  kwargs = {"num_heads": 3, "key_dim": 4, "value_dim": 5, "use_bias": True,
            "bias_initializer": "random_normal", **kwargs}
  layer = layer_class(**kwargs)
  layer(QUERY, MEMORY, key=KEY)
  return layer


# ---- the call ----------------------------------------------------------------
def test_positional_call_follows_tf_keras_order():
  layer = layers.TalkingHeadsAttention(num_heads=3, key_dim=4, dropout=0.5)
  inference = layer(QUERY, MEMORY)
  # tf_keras: (query, value, key, attention_mask, return_attention_scores,
  # training, use_causal_mask): the sixth positional argument is training.
  trained = layer(QUERY, MEMORY, None, None, None, True)
  assert isinstance(trained, tf.Tensor)  # a tensor, not (output, scores)
  assert not np.allclose(trained, inference)  # dropout ran
  assert np.array_equal(layer(QUERY, MEMORY, None, None, None, False),
                        inference)
  output, scores = layer(QUERY, MEMORY, return_attention_scores=True)
  assert np.array_equal(output, inference)
  assert scores.shape == (2, 3, 5, 7)
  _, positional_scores = layer(QUERY, MEMORY, None, None, True)
  assert np.array_equal(positional_scores, scores)
  self_attention = layers.TalkingHeadsAttention(num_heads=3, key_dim=4)
  causal = self_attention(QUERY, QUERY, None, None, False, False, True)
  assert np.array_equal(causal,
                        self_attention(QUERY, QUERY, use_causal_mask=True))
  assert not np.array_equal(causal, self_attention(QUERY, QUERY))


def test_tf_keras_positional_call_on_both_layers_alike():
  keras_layer = _random_keras_layer(dropout=0.5)
  ours = layers.from_keras(keras_layer)
  for layer in (keras_layer, ours):
    assert isinstance(layer(QUERY, MEMORY, KEY, MASK, None, True), tf.Tensor)
    assert len(layer(QUERY, MEMORY, KEY, MASK, True, False)) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_numeric_masks_equal_the_boolean_mask(dtype):
  layer = layers.TalkingHeadsAttention(num_heads=2, key_dim=4,
                                       num_value_heads=3)
  boolean = layer(QUERY, MEMORY, attention_mask=MASK)
  numeric = layer(QUERY, MEMORY, attention_mask=MASK.astype(dtype))
  assert np.array_equal(numeric, boolean)


def test_float_mask_input_of_a_functional_model():
  """A tf_keras.Input mask is float32, as in tf_keras's own examples."""
  query = tf_keras.Input((5, 12))
  memory = tf_keras.Input((7, 10))
  mask = tf_keras.Input((5, 7))
  layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
  model = tf_keras.Model([query, memory, mask],
                         layer(query, memory, attention_mask=mask))
  got = model([QUERY, MEMORY, MASK.astype(np.float32)])
  assert np.array_equal(got, layer(QUERY, MEMORY, attention_mask=MASK))


@pytest.mark.parametrize("make_layer", [
    lambda **kw: layers.MultiHeadAttention(2, 4, **kw),
    lambda **kw: layers.TalkingHeadsAttention(3, 4, num_key_heads=2,
                                              num_value_heads=5, **kw),
    lambda **kw: layers.GeneralBilinearAttention(2, **kw),
], ids=["multi_head", "talking_heads", "general_bilinear"])
@pytest.mark.parametrize("output_shape", [None, 9, (9,)])
@pytest.mark.parametrize("memory", ["self", "cross"])
def test_compute_output_shape_equals_the_call(make_layer, output_shape,
                                              memory):
  layer = make_layer(output_shape=output_shape)
  value = QUERY if memory == "self" else MEMORY
  output, scores = layer(QUERY, value, return_attention_scores=True)
  assert layer.compute_output_shape(QUERY.shape, value.shape) == output.shape
  assert layer.compute_output_shape(
      (None, 5, 12), (None, value.shape[1], value.shape[2]),
      return_attention_scores=True) == (
          tf.TensorShape([None] + output.shape[1:]),
          tf.TensorShape([None] + scores.shape[1:]))


# ---- ragged inputs ---------------------------------------------------------
def test_ragged_inputs_equal_the_densified_and_masked_call():
  layer = layers.TalkingHeadsAttention(num_heads=3, key_dim=4,
                                       num_key_heads=2,
                                       dynamic_projections=["m2l", "x2w"])
  query_lengths, memory_lengths = [5, 3], [4, 7]
  query = tf.RaggedTensor.from_tensor(QUERY, lengths=query_lengths)
  memory = tf.RaggedTensor.from_tensor(MEMORY, lengths=memory_lengths)
  got = layer(query, memory)
  assert isinstance(got, tf.RaggedTensor)
  assert got.row_lengths().numpy().tolist() == query_lengths
  dense_query = query.to_tensor()  # zeros where the query is padding
  dense_memory = memory.to_tensor()
  memory_valid = np.arange(7)[None, :] < np.array(memory_lengths)[:, None]
  want = layer(dense_query, dense_memory,
               attention_mask=np.broadcast_to(memory_valid[:, None, :],
                                              (2, 5, 7)))
  for row, length in enumerate(query_lengths):
    np.testing.assert_array_equal(got[row].numpy(), want[row, :length])


def test_ragged_key_and_value_densify_to_one_length():
  layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
  value = tf.RaggedTensor.from_tensor(MEMORY, lengths=[6, 3])
  key = tf.RaggedTensor.from_tensor(KEY, lengths=[6, 3])
  got = layer(QUERY, value, key=key)
  valid = np.arange(6)[None, :] < np.array([6, 3])[:, None]
  want = layer(QUERY, MEMORY[:, :6], key=KEY[:, :6],
               attention_mask=np.broadcast_to(valid[:, None, :], (2, 5, 6)))
  np.testing.assert_array_equal(got, want)


def test_ragged_inputs_that_are_not_batch_length_width_are_refused():
  layer = layers.MultiHeadAttention(num_heads=2, key_dim=4)
  nested = tf.RaggedTensor.from_nested_row_lengths(
      tf.zeros([6, 12]), [[2, 1], [1, 2, 3]])
  with pytest.raises(ValueError, match=r"ragged query must have shape "
                     r"\[batch, \(length\), width\].*ragged_rank 2.*"
                     r"to_tensor"):
    layer(nested, MEMORY)


# ---- constructor names -----------------------------------------------------
def test_tf_keras_constructor_arguments_are_accepted_and_round_trip():
  arguments = dict(num_heads=2, key_dim=4, value_dim=3, dropout=0.1,
                   use_bias=True, output_shape=(9,), attention_axes=None,
                   kernel_initializer="he_normal", bias_initializer="ones",
                   kernel_regularizer="l2", bias_regularizer="l1",
                   activity_regularizer="l2", kernel_constraint="non_neg",
                   bias_constraint="unit_norm")
  ours = layers.MultiHeadAttention(**arguments)
  theirs = tf_keras.layers.MultiHeadAttention(**arguments)
  assert ours(QUERY, MEMORY).shape == theirs(QUERY, MEMORY).shape
  # Every tf_keras config key but the ones of its N-d inputs and its
  # softmax option is one of ours, with the same value (names aside).
  shared = set(theirs.get_config()) - {
      "name", "attention_axes", "query_shape", "key_shape", "value_shape",
      "softmax_robust_masking"}
  our_config = ours.get_config()
  for name in shared:
    want = theirs.get_config()[name]
    want = 9 if name == "output_shape" else want
    assert our_config[name] == want, name
  # Regularizers act as tf_keras's do: a kernel and a bias loss for each
  # of P_q, P_k, P_v, P_o, and one activity loss on the output.
  assert len(ours.losses) == len(theirs.losses) == 9
  clone = layers.MultiHeadAttention.from_config(our_config)
  assert clone.get_config() == our_config


def test_talking_heads_regularizers_cover_the_head_projections():
  layer = layers.TalkingHeadsAttention(num_heads=2, key_dim=4,
                                       dynamic_projections=["x2l"],
                                       kernel_regularizer="l2")
  layer(QUERY, MEMORY)
  # P_q, P_k, P_v, P_o, P_l, P_w and P_Xl.
  assert len(layer.losses) == 7


def test_older_argument_names_are_aliases():
  layer = layers.TalkingHeadsAttention(2, 4, dropout_rate=0.2, output_dim=6)
  config = layer.get_config()
  assert (config["dropout"], config["output_shape"]) == (0.2, 6)
  assert "dropout_rate" not in config and "output_dim" not in config
  assert (layer.dropout_rate, layer.output_dim) == (0.2, 6)
  with pytest.raises(ValueError, match=r"dropout=0.1 and its alias "
                     r"dropout_rate=0.2 disagree; pass only dropout"):
    layers.MultiHeadAttention(2, 4, dropout=0.1, dropout_rate=0.2)
  with pytest.raises(ValueError, match=r"Invalid `output_shape`: \(3, 4\)\. "
                     r".*must be an int d_Y or a 1-tuple \(d_Y,\)"):
    layers.MultiHeadAttention(2, 4, output_shape=(3, 4))
  with pytest.raises(ValueError, match=r"attention_axes=\(1, 2\) is not "
                     r"supported"):
    layers.MultiHeadAttention(2, 4, attention_axes=(1, 2))


# ---- weights from and to tf_keras and Model Garden --------------------------
def _assert_equal_layers(ours, theirs, *, key=KEY, mask=MASK):
  for kwargs in ({}, {"attention_mask": mask}):
    got, got_scores = ours(QUERY, MEMORY, key=key,
                           return_attention_scores=True, **kwargs)
    want, want_scores = theirs(QUERY, MEMORY, key=key,
                               return_attention_scores=True, **kwargs)
    assert _relative_error(got, want) <= 1e-5
    assert _relative_error(got_scores, want_scores) <= 1e-5


def test_from_keras_multi_head_equals_tf_keras():
  keras_layer = _random_keras_layer(output_shape=8)
  ours = layers.from_keras(keras_layer)
  assert isinstance(ours, layers.MultiHeadAttention)
  assert (ours.use_bias, ours.key_dim, ours.value_dim) == (True, 4, 5)
  _assert_equal_layers(ours, keras_layer)
  causal_ours = ours(QUERY, MEMORY, key=KEY, use_causal_mask=True)
  causal_theirs = keras_layer(QUERY, MEMORY, key=KEY, use_causal_mask=True)
  assert _relative_error(causal_ours, causal_theirs) <= 1e-5


def test_to_keras_multi_head_equals_thattn():
  ours = layers.MultiHeadAttention(3, 4, value_dim=5, use_bias=True,
                                   bias_initializer="random_normal")
  ours(QUERY, MEMORY, key=KEY)
  keras_layer = layers.to_keras(ours)
  assert type(keras_layer) is tf_keras.layers.MultiHeadAttention
  _assert_equal_layers(ours, keras_layer)


def test_talking_heads_without_projections_go_to_tf_keras():
  ours = layers.TalkingHeadsAttention(3, 4, project_logits=False,
                                      project_weights=False)
  ours(QUERY, MEMORY, key=KEY)
  _assert_equal_layers(ours, layers.to_keras(ours))


@pytest.fixture(name="model_garden")
def _model_garden():
  return pytest.importorskip(
      "official.nlp.modeling.layers",
      reason="Model Garden is not installed; see benchmarks/README.md")


def test_from_keras_model_garden_talking_heads(model_garden):
  source = _random_keras_layer(model_garden.TalkingHeadsAttention,
                               dropout=0.1)
  ours = layers.from_keras(source)
  assert isinstance(ours, layers.TalkingHeadsAttention)
  _assert_equal_layers(ours, source)


@pytest.mark.parametrize("arguments", [
    {},
    {"num_head_groups": 3},
    {"project_weights": False},
], ids=["dense", "grouped", "logits_only"])
def test_to_keras_talking_heads_equals_model_garden(model_garden, arguments):
  ours = layers.TalkingHeadsAttention(6, 4, value_dim=3, **arguments)
  ours(QUERY, MEMORY, key=KEY)
  theirs = layers.to_keras(ours)
  assert isinstance(theirs, model_garden.TalkingHeadsAttention)
  _assert_equal_layers(ours, theirs)
  # And back: the same weights, the same outputs.
  _assert_equal_layers(layers.from_keras(theirs), theirs)


def test_layers_that_cannot_convert_are_refused():
  source = tf_keras.layers.MultiHeadAttention(2, 4, attention_axes=(1, 2))
  source(tf.zeros([1, 3, 4, 8]), tf.zeros([1, 3, 4, 8]))
  with pytest.raises(ValueError, match=r"attention_axes=\(1, 2\) is not "
                     r"supported"):
    layers.from_keras(source)
  with pytest.raises(ValueError, match="build the layer"):
    layers.from_keras(tf_keras.layers.MultiHeadAttention(2, 4))
  with pytest.raises(ValueError, match="got Dense"):
    layers.from_keras(tf_keras.layers.Dense(3))
  bilinear = layers.GeneralBilinearAttention(2)
  bilinear(QUERY, MEMORY)
  with pytest.raises(ValueError, match="no general bilinear attention"):
    layers.to_keras(bilinear)
  uneven = layers.TalkingHeadsAttention(3, 4, num_key_heads=2)
  uneven(QUERY, MEMORY)
  with pytest.raises(ValueError, match=r"one number of heads.*"
                     r"num_key_heads=2, num_heads=3"):
    layers.to_keras(uneven)


# ---- Keras 3 tensors --------------------------------------------------------
def test_keras3_input_gets_a_clear_error():
  keras3 = pytest.importorskip("keras")
  if not hasattr(keras3, "KerasTensor"):
    pytest.skip("`keras` here is not Keras 3")
  layer = layers.TalkingHeadsAttention(num_heads=4, key_dim=16)
  x = keras3.Input((16, 64))
  with pytest.raises(ValueError, match=r"Keras 3 tensor.*tf_keras \(Keras "
                     r"2\) layers.*tf_keras.Input.*TF_USE_LEGACY_KERAS=1.*"
                     r"thattn.keras3"):
    layer(x, x)


def test_the_docs_example_runs():
  """docs/coming_from_keras.md's code block, as written."""
  docs = pathlib.Path(__file__).parents[2] / "docs" / "coming_from_keras.md"
  blocks = re.findall(r"```python\n(.*?)```", docs.read_text(), re.S)
  assert blocks
  for block in blocks:
    exec(compile(block, str(docs), "exec"), {})  # pylint: disable=exec-used


def test_compute_output_shape_raises_keras_errors():
  """tf_keras's checks of compute_output_shape (but for its query width ==
  value width, which thattn's cross-attention does not need)."""
  layer = layers.TalkingHeadsAttention(2, 4)
  assert layer.compute_output_shape((2, 5, 8), (2, 7, 3)).as_list() == [
      2, 5, 8]
  with pytest.raises(ValueError, match=r"All dimensions of `value` and `key`, "
                     r"except the last one, must be equal. Received: "
                     r"value_shape=\(2, 7, 3\) and key_shape=\(2, 6, 3\)"):
    layer.compute_output_shape((2, 5, 8), (2, 7, 3), (2, 6, 3))
  layer(tf.ones((2, 5, 8)), tf.ones((2, 7, 3)))
  with pytest.raises(ValueError, match=r"The last dimension of `value_shape` "
                     r"must be equal to the width the layer was built for, "
                     r"3"):
    layer.compute_output_shape((2, 5, 8), (2, 7, 4))
