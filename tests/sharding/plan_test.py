"""Layouts of real thattn weights, checked without any device.

`plan_weights` accepts a MeshSpec, so these run in the ordinary pytest
process; the DTensor runs themselves are in dtensor_test.py.
"""

import pytest
import tensorflow as tf
import tf_keras

from thattn.core import dims
from thattn import layers
from thattn import sharding

MESH = sharding.MeshSpec.parse("batch:2,model:4")
RULES = sharding.LayoutRules.parse(
    "batch:batch;key_heads:model;value_heads:model;d_ff:model;vocab:model")


def _talking_heads(num_heads=4, num_key_heads=8, num_value_heads=8,
                   name="th", **kwargs):
  layer = layers.TalkingHeadsAttention(
      num_heads, 8, num_key_heads=num_key_heads,
      num_value_heads=num_value_heads,
      dynamic_projections=layers.DYNAMIC_PROJECTIONS, name=name, **kwargs)
  layer.build_from_shapes([None, None, 16], [None, None, 16])
  return layer


def _plan(obj, rules=RULES, mesh=MESH, **kwargs):
  return {variable.name.split(":")[0]: axes for variable, axes
          in sharding.plan_weights(obj, rules, mesh, **kwargs)}


class _Embedding(tf_keras.layers.Layer):
  """A vocabulary table that declares its logical axes, as models do."""

  def __init__(self, vocab_size, width, **kwargs):
    super().__init__(**kwargs)
    self.table = self.add_weight("embeddings", [vocab_size, width])

  @property
  def logical_axes(self):
    return {self.table.name: (dims.VOCAB, dims.D_MODEL)}


def test_every_talking_heads_weight_gets_its_mesh_axes():
  plan = _plan(_talking_heads(use_bias=True), strict=True)
  assert plan == {
      "th/query/kernel": (None, "model", None),
      "th/key/kernel": (None, "model", None),
      "th/value/kernel": (None, "model", None),
      "th/query/bias": ("model", None),
      "th/key/bias": ("model", None),
      "th/value/bias": ("model", None),
      "th/output/kernel": ("model", None, None),
      "th/output/bias": (None,),
      "th/pre_softmax_projection": ("model", None),
      "th/post_softmax_projection": (None, "model"),
      "th/x2l/kernel": (None, "model", None),
      "th/m2l/kernel": (None, "model", None),
      "th/x2w/kernel": (None, None, "model"),
      "th/m2w/kernel": (None, None, "model"),
  }


def test_layers_whose_variables_share_names_keep_their_own_axes():
  # Two layers of one name: their variable names share the "attention/"
  # prefix, and axes are matched per layer, not by name.
  class Pair(tf.Module):

    def __init__(self):
      super().__init__()
      self.talking = _talking_heads(name="attention")
      self.bilinear = layers.GeneralBilinearAttention(4, name="attention")
      self.bilinear.build_from_shapes([None, None, 16], [None, None, 16])

  rules = sharding.LayoutRules.parse("heads:model")
  plan = sharding.plan_weights(Pair(), rules, MESH, strict=True)
  by_name = {}
  for variable, axes in plan:
    by_name.setdefault(variable.name, []).append(axes)
  assert by_name["attention/bilinear_p:0"] == [(None, None, "model")]
  assert by_name["attention/pre_softmax_projection:0"] == [(None, "model")]
  assert len(plan) == 10 + 2


def test_heads_12_on_model_8_fails_naming_the_layers_weights():
  layer = _talking_heads(num_heads=12, num_key_heads=12, num_value_heads=12)
  with pytest.raises(ValueError) as error:
    _plan(layer, sharding.LayoutRules.parse("heads:model"),
          sharding.MeshSpec.parse("batch:1,model:8"))
  message = str(error.value)
  # P_l, P_w and the four dynamic projections, reported once.
  assert message.splitlines()[1].startswith(
      "tensor 'th/pre_softmax_projection:0' [12, 12] (key_heads, heads) and "
      "5 more (th/post_softmax_projection:0, ")
  assert ("...): heads=12 is not divisible by model=8: use a mesh with model "
          "in {1,2,3,4,6,12}, or pad/choose heads divisible by 8") in message


def test_unpadded_vocabulary_fails_before_anything_is_built():
  embedding = _Embedding(30522, 8, name="embedding")
  with pytest.raises(ValueError, match=r"tensor 'embeddings:0' "
                     r"\[30522, 8\] \(vocab, d_model\): vocab=30522 on "
                     r"model:4: pad the vocabulary to a multiple of 4 "
                     r"\(e\.g\. 30524\)"):
    _plan(embedding)
  assert _plan(_Embedding(30524, 8)) == {"embeddings": ("model", None)}


def test_sharding_both_sides_of_a_talking_heads_projection_is_refused():
  with pytest.raises(ValueError, match=r"tensor 'th/pre_softmax_projection:0' "
                     r"\[8, 4\] \(key_heads, heads\) and 2 more \(.*\): "
                     r"key_heads and heads both map to mesh axis model"):
    _plan(_talking_heads(), sharding.LayoutRules.parse(
        "key_heads:model;heads:model;value_heads:model"))


def test_strict_plans_name_weights_without_logical_axes():
  inputs = tf_keras.Input([None, 16])
  hidden = layers.MultiHeadAttention(4, 4, name="mha")(inputs, inputs)
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(3, name="head")(hidden))
  plan = _plan(model)
  assert plan["head/kernel"] == (None, None)  # replicated by default
  assert plan["mha/query/kernel"] == (None, "model", None)
  with pytest.raises(ValueError, match=r"2 variables declare no logical axes:"
                     r" \['head/kernel:0', 'head/bias:0'\]"):
    _plan(model, strict=True)
