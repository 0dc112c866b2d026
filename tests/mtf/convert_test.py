"""thattn.mtf.convert: round trips, folded scaling, and refused inputs."""

import numpy as np
import pytest

from thattn.mtf import layer_weights
from thattn.mtf import layers as mtf_layers
from thattn.mtf import layout
from thattn.mtf import runner

try:
  from . import variants as v
except ImportError:  # Bazel runs the test as a top-level module
  import variants as v  # pylint: disable=g-import-not-at-top

tl = mtf_layers.transformer_layers


@pytest.mark.parametrize("enc_dec", [False, True], ids=["self", "enc_dec"])
@pytest.mark.parametrize("variant", list(v.VARIANTS))
def test_keras_to_mtf_to_keras_is_bit_exact(variant, enc_dec):
  layer = v.VARIANTS[variant](enc_dec)
  keras = layer_weights.keras_layer(layer=layer, d_model=v.WIDTH)
  keras.build_from_shapes([None, None, v.WIDTH], [None, None, v.WIDTH])
  layers = [keras]
  bias = layer_weights.keras_relative_bias(layer=layer, d_model=v.WIDTH,
                                     bidirectional=True)
  if bias is not None:
    bias(3, 3)
    layers.append(bias)
  original = layer_weights.keras_weights(layers=layers)
  variables = layer_weights.keras_to_mtf(layer=layer, weights=original,
                                   d_model=v.WIDTH)
  assert {k: x.shape for k, x in variables.items()} == (
      layer_weights.mtf_variable_shapes(layer=layer, d_model=v.WIDTH))
  # Through real mtf variables: loaded into the masters, read back.
  data = v.inputs()
  result = runner.run_layer(layer, query=data["query"], variables=variables,
                            memory=data["memory"] if enc_dec else None)
  back = layer_weights.mtf_to_keras(layer=layer, variables=result.variables,
                              d_model=v.WIDTH)
  assert set(back) == set(original)
  for token, value in original.items():
    assert back[token].dtype == value.dtype
    assert np.array_equal(back[token], value), token


def test_run_time_query_scaling_is_folded_into_the_query_kernel():
  # fold_scaling_into_initializer=False: mtf multiplies Q by d_kv**-0.5 at
  # run time; thattn never scales, so the converter folds it into P_q.
  layer = tl.SelfAttention(num_heads=2, key_value_size=4,
                           fold_scaling_into_initializer=False)
  data = v.inputs()
  result = runner.run_layer(layer, query=data["query"], causal=True)
  keras = v.keras_twin(layer, enc_dec=False, causal=True,
                       mtf_variables=result.variables)
  np.testing.assert_allclose(
      keras[0].weights[0].numpy(),
      result.variables["q"].reshape(v.WIDTH, 2, 4) * 0.5, rtol=1e-7)
  output = keras[0](data["query"], data["query"], use_causal_mask=True)
  assert v.relative_error(output.numpy(), result.output) < v.TOLERANCE


def _th(**kwargs):
  return tl.TalkingHeadsSelfAttention(
      **{"key_heads_dims": [("key_heads", 3)],
         "softmax_heads_dims": [("heads", 4)],
         "value_heads_dims": [("value_heads", 5)], "key_size": 4,
         "value_size": 4, **kwargs})


def _th_variables():
  return layer_weights.keras_to_mtf(layer=_th(), d_model=v.WIDTH, weights={
      token: np.zeros(shape, np.float32) for token, shape in {
          "query/kernel": (8, 3, 4), "key/kernel": (8, 3, 4),
          "value/kernel": (8, 5, 4), "output/kernel": (5, 4, 8),
          "pre_softmax_projection": (3, 4),
          "post_softmax_projection": (4, 5)}.items()})


def test_a_variable_of_the_wrong_shape_is_named_with_both_shapes():
  variables = _th_variables()
  variables["logits/kernel"] = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match=(
      r"mtf variable 'logits/kernel' has shape \(4, 3\), expected \(3, 4\) "
      r"\[key_heads, heads\]")):
    layer_weights.mtf_to_keras(layer=_th(), variables=variables, d_model=v.WIDTH)


def test_a_missing_variable_is_named_with_the_expected_ones():
  variables = _th_variables()
  del variables["weights/kernel"]
  with pytest.raises(ValueError, match=(
      r"mtf variable 'weights/kernel' is missing; expected q/kernel, "
      r"k/kernel, v/kernel, y/kernel, logits/kernel, weights/kernel")):
    layer_weights.mtf_to_keras(layer=_th(), variables=variables, d_model=v.WIDTH)


def test_a_keras_weight_of_the_wrong_shape_is_refused():
  weights = layer_weights.mtf_to_keras(layer=_th(), variables=_th_variables(),
                                 d_model=v.WIDTH)
  weights["query/kernel"] = np.zeros((8, 4, 4), np.float32)
  with pytest.raises(ValueError, match=(
      r"thattn weight 'query/kernel' has shape \(8, 4, 4\), expected "
      r"\(8, 3, 4\) \[d_model, key_heads, d_k\]")):
    layer_weights.keras_to_mtf(layer=_th(), weights=weights, d_model=v.WIDTH)


def test_heads_the_mesh_axis_does_not_divide_fail_before_lowering():
  data = v.inputs()
  with pytest.raises(ValueError, match=(
      r"tensor 'q/kernel' \[8, 3, 4\] \(d_model, key_heads, d_k\).*"
      r"key_heads=3 is not divisible by model=2")):
    runner.run_layer(_th(), query=data["query"], mesh="model:2",
                     rules="key_heads:model")


def test_an_unknown_logical_axis_in_the_rules_is_refused():
  with pytest.raises(ValueError, match=(
      r"unknown logical axis 'key_head' in 'key_head:model'\. Did you mean "
      r"'key_heads'\?")):
    layout.mtf_layout("batch:batch;key_head:model")


def test_a_rule_for_a_mesh_axis_the_mesh_lacks_is_refused():
  with pytest.raises(ValueError, match=(
      r"layout rule 'heads:model' names mesh axis 'model', which mesh "
      r"batch:2 does not have")):
    layout.placement_mesh_impl(mesh="batch:2", rules="heads:model",
                               devices=["", ""])


def test_unequal_heads_with_the_projection_off_are_refused():
  with pytest.raises(ValueError, match=(
      r"project_logits=False needs num_key_heads == num_heads, got "
      r"num_key_heads=2, num_heads=4")):
    mtf_layers.GroupedTalkingHeadsSelfAttention(
        num_heads=4, key_dim=4, num_key_heads=2, project_logits=False)


def test_dynamic_projections_mtf_would_ignore_are_refused():
  layer = _th(softmax_heads_dims=[("key_heads", 3)],
              dynamic_projections=["x2l"])
  with pytest.raises(ValueError, match=(
      r"mtf silently ignores dynamic projection 'x2l' because "
      r"key_heads_dims and softmax_heads_dims have the same names")):
    layer_weights.keras_layer(layer=layer, d_model=v.WIDTH)


def test_an_unknown_gin_name_is_refused_with_a_suggestion():
  with pytest.raises(ValueError, match=(
      r"unknown attention layer gin name 'TalkingHeadSelfAttention'; "
      r"expected one of SelfAttention, .*Did you mean "
      r"'TalkingHeadsSelfAttention'\?")):
    mtf_layers.attention_layer("TalkingHeadSelfAttention")


@pytest.mark.parametrize("layer,message", [
    (tl.SelfAttention(num_heads=4, num_memory_heads=1),
     r"num_memory_heads=1 has no Keras counterpart"),
    (tl.SelfAttention(num_heads=4, shared_kv=True),
     r"shared_kv=True has no Keras counterpart"),
    (tl.EncDecAttention(num_heads=4, relative_attention_type="bias"),
     r"relative_attention_type='bias' on encoder-decoder attention"),
    (tl.SelfAttention(num_heads=4, relative_attention_type="contextual"),
     r"relative_attention_type='contextual'"),
    (tl.LocalSelfAttention(), r"mtf layer LocalSelfAttention has no thattn "
     r"counterpart"),
    (tl.TalkingHeadsSelfAttention(key_heads_dims=[("heads", 3)],
                                  softmax_heads_dims=[("heads", 4)]),
     r"heads dim 'heads' has sizes 3 and 4 in different lists"),
])
def test_mtf_configurations_without_a_keras_counterpart_are_refused(
    layer, message):
  with pytest.raises(ValueError, match=message):
    layer_weights.keras_layer(layer=layer, d_model=v.WIDTH)
