"""Mesh specs and layout rules: parsing, validation messages, mtf strings."""

import re

import pytest

from thattn.sharding import rules as rules_lib
from thattn.sharding.rules import LayoutRules
from thattn.sharding.rules import MeshSpec
from thattn.sharding.rules import plan_layouts

T5_RULES = "batch:batch;heads:model;d_ff:model;vocab:model"


# ---- MeshSpec ---------------------------------------------------------------
@pytest.mark.parametrize("spec", ["batch:2,model:4", "batch:2;model:4",
                                  " batch:2 , model:4 "])
def test_mesh_spec_parses_mtf_style_strings(spec):
  mesh = MeshSpec.parse(spec)
  assert mesh.names == ("batch", "model")
  assert mesh.shape == (2, 4)
  assert mesh.size == 8
  assert mesh.axis_size("model") == 4
  assert str(mesh) == mesh.to_mtf_mesh_shape() == "batch:2,model:4"


@pytest.mark.parametrize("spec,message", [
    ("batch:2,model", r"cannot read 'model'; write name:value pairs"),
    ("batch:2:3", r"cannot read 'batch:2:3'"),
    ("batch:two", r"size 'two' of axis 'batch' must be a positive integer"),
    ("batch:0", r"size '0' of axis 'batch' must be a positive integer"),
    ("batch:2,batch:2", r"names axis 'batch' twice"),
    ("", r"mesh spec '' is empty; write axis:size pairs such as "
         r"'batch:2,model:2'"),
    ("2d:4", r"axis name '2d' must start with a letter"),
    (8, r"mesh spec must be a string such as 'batch:2,model:2', got 8"),
])
def test_malformed_mesh_specs(spec, message):
  with pytest.raises(ValueError, match=message):
    MeshSpec.parse(spec)


def test_unknown_mesh_axis_suggests_the_close_one():
  with pytest.raises(ValueError, match=r"mesh batch:2,model:2 has no axis "
                     r"'modle' \(axes: batch, model\)\. Did you mean 'model'"):
    MeshSpec.parse("batch:2,model:2").axis_size("modle")


@pytest.mark.parametrize("spec,devices,smaller", [
    ("batch:2,model:4", 4, "batch:2,model:2"),
    ("batch:3,model:4", 4, "batch:1,model:4"),
    ("batch:8", 6, "batch:4"),
])
def test_a_mesh_larger_than_the_devices(spec, devices, smaller):
  mesh = MeshSpec.parse(spec)
  mesh.check_devices(mesh.size)  # fits exactly
  with pytest.raises(ValueError) as error:
    mesh.check_devices(devices)
  message = str(error.value)
  assert (f"mesh {spec} needs {mesh.size} devices but only {devices} CPU "
          "devices are available") in message
  assert f"use a smaller mesh such as {smaller}" in message
  assert "tf.config.set_logical_device_configuration" in message


# ---- LayoutRules ------------------------------------------------------------
def test_rules_parse_and_map_logical_axes():
  rules = LayoutRules.parse(T5_RULES)
  assert rules.mesh_axis("heads") == "model"
  assert rules.mesh_axis("d_model") is None
  assert rules.mesh_axes(("batch", "length", None, "d_ff")) == (
      "batch", None, None, "model")
  assert rules.to_mtf_layout() == str(rules) == T5_RULES
  assert LayoutRules.parse(rules.to_mtf_layout()) == rules
  # mtf also separates pairs with ",".
  assert LayoutRules.parse(T5_RULES.replace(";", ",")) == rules


def test_rules_accept_every_logical_axis_including_thattns_own():
  spec = ";".join(f"{axis}:model" for axis in rules_lib.known_logical_axes())
  rules = LayoutRules.parse(spec)
  for axis in ("batch", "length", "d_model", "heads", "key_heads",
               "value_heads", "d_k", "d_v", "d_ff", "vocab", "experts",
               "relative_buckets"):
    assert rules.mesh_axis(axis) == "model"


def test_empty_rules_replicate_everything():
  rules = LayoutRules.parse("")
  assert rules.mesh_axes(("batch", "heads")) == (None, None)
  assert rules.to_mtf_layout() == ""


@pytest.mark.parametrize("spec,message", [
    ("batch:batch;head:model",
     r"unknown logical axis 'head' in 'head:model'\. Did you mean 'heads'\? "
     r"Known logical axes: d_model, key_heads"),
    ("heads:model;heads:batch",
     r"give logical axis 'heads' two rules, 'heads:model' and "
     r"'heads:batch'; a logical axis maps to at most one mesh axis"),
    ("heads", r"cannot read 'heads'; write name:value pairs"),
    ("heads:8model", r"mesh axis '8model' in 'heads:8model' must start with"),
])
def test_malformed_rules(spec, message):
  with pytest.raises(ValueError, match=message):
    LayoutRules.parse(spec)


def test_a_rule_naming_a_mesh_axis_the_mesh_lacks():
  rules = LayoutRules.parse("batch:batch;heads:modle")
  with pytest.raises(ValueError, match=re.escape(
      "layout rule 'heads:modle' names mesh axis 'modle', which mesh "
      "batch:2,model:2 does not have (axes: batch, model). Did you mean "
      "'model'? Add modle to the mesh or drop the rule.")):
    plan_layouts([], rules, MeshSpec.parse("batch:2,model:2"))


# ---- validation of tensors --------------------------------------------------
QUERY_KERNEL_AXES = ("d_model", "key_heads", "d_k")


def _error(tensors, rules, mesh, **kwargs):
  with pytest.raises(ValueError) as error:
    plan_layouts(tensors, LayoutRules.parse(rules), MeshSpec.parse(mesh),
                 **kwargs)
  return str(error.value)


def test_a_plan_gives_mesh_axes_per_dimension():
  plan = plan_layouts(
      [("query/kernel:0", (768, 12, 64), QUERY_KERNEL_AXES),
       ("pre_softmax_projection:0", (12, 12), ("key_heads", "heads")),
       ("ffn/kernel:0", (768, 3072), ("d_model", "d_ff")),
       ("tokens", (8, 128), ("batch", None))],
      LayoutRules.parse(T5_RULES), MeshSpec.parse("batch:2,model:4"),
      num_devices=8)
  assert plan == {"query/kernel:0": (None, None, None),
                  "pre_softmax_projection:0": (None, "model"),
                  "ffn/kernel:0": (None, "model"),
                  "tokens": ("batch", None)}


def test_heads_not_divisible_by_the_model_axis():
  message = _error([("tha/pre_softmax_projection:0", (12, 12),
                     ("key_heads", "heads"))],
                   "heads:model", "batch:1,model:8")
  assert message.startswith("layout rules 'heads:model' on mesh "
                            "'batch:1,model:8' do not fit:\n")
  assert ("tensor 'tha/pre_softmax_projection:0' [12, 12] (key_heads, heads)"
          ": heads=12 is not divisible by model=8: use a mesh with model in "
          "{1,2,3,4,6,12}, or pad/choose heads divisible by 8, or leave heads "
          "unsharded (drop 'heads:model').") in message


def test_unpadded_vocabulary_on_the_model_axis():
  message = _error([("embeddings:0", (30522, 768), ("vocab", "d_model"))],
                   T5_RULES, "batch:2,model:4")
  assert ("tensor 'embeddings:0' [30522, 768] (vocab, d_model): vocab=30522 "
          "on model:4: pad the vocabulary to a multiple of 4 (e.g. 30524), "
          "use a mesh with model in {1,2,3,6}, or leave vocab unsharded "
          "(drop 'vocab:model').") in message


def test_the_suggested_mesh_sizes_fit_every_tensor_on_that_axis():
  message = _error([("pre_softmax_projection:0", (12, 12),
                     ("key_heads", "heads")),
                    ("ffn/kernel:0", (768, 1000), ("d_model", "d_ff"))],
                   T5_RULES, "batch:1,model:8")
  # gcd(12, 1000) = 4: model:6 would split heads but not d_ff=1000.
  assert "use a mesh with model in {1,2,4}" in message


def test_two_axes_of_one_tensor_on_the_same_mesh_axis():
  message = _error([("tha/pre_softmax_projection:0", (8, 8),
                     ("key_heads", "heads"))],
                   "key_heads:model;heads:model", "model:4")
  assert ("tensor 'tha/pre_softmax_projection:0' [8, 8] (key_heads, heads): "
          "key_heads and heads both map to mesh axis model ('key_heads:model',"
          " 'heads:model'), but a mesh axis can split only one dimension of a "
          "tensor: leave all but one of them unsharded or map them to other "
          "mesh axes.") in message
  assert ("shard key_heads and value_heads and leave heads unsharded, or "
          "shard heads alone.") in message


def test_the_head_sets_clash_hint_points_to_head_groups():
  message = _error([("tha/post_softmax_projection:0", (8, 8),
                     ("heads", "value_heads"))],
                   "heads:model;value_heads:model", "model:2")
  assert ("use grouped talking heads (num_head_groups a multiple of the "
          "model size) and add 'head_groups:model'.") in message


GROUPED_RULES = "batch:batch;head_groups:model;key_heads:model;value_heads:model"


def test_grouped_talking_heads_shard_every_head_set_on_one_axis():
  plan = plan_layouts(
      [("query/kernel:0", (768, 12, 64), QUERY_KERNEL_AXES),
       ("pre_softmax_projection:0", (4, 3, 3),
        ("head_groups", "key_heads_per_group", "heads_per_group")),
       ("post_softmax_projection:0", (4, 3, 3),
        ("head_groups", "heads_per_group", "value_heads_per_group")),
       ("x2l/kernel:0", (768, 4, 3, 3),
        ("d_model", "head_groups", "key_heads_per_group", "heads_per_group"))],
      LayoutRules.parse(GROUPED_RULES), MeshSpec.parse("batch:2,model:4"))
  assert plan == {"query/kernel:0": (None, "model", None),
                  "pre_softmax_projection:0": ("model", None, None),
                  "post_softmax_projection:0": ("model", None, None),
                  "x2l/kernel:0": (None, "model", None, None)}


def test_fewer_head_groups_than_the_model_axis():
  message = _error([("tha/pre_softmax_projection:0", (2, 6, 6),
                     ("head_groups", "key_heads_per_group",
                      "heads_per_group"))],
                   GROUPED_RULES, "batch:2,model:4")
  assert ("tensor 'tha/pre_softmax_projection:0' [2, 6, 6] (head_groups, "
          "key_heads_per_group, heads_per_group): head_groups=2 is not "
          "divisible by model=4: build the talking-heads layers with "
          "num_head_groups a multiple of 4, use a mesh with model in {1,2}, "
          "or leave head_groups unsharded (drop 'head_groups:model')."
          ) in message


def test_a_batch_not_divisible_by_the_batch_axis():
  message = _error([("tokens", (6, 128), ("batch", "length"))],
                   "batch:batch", "batch:4")
  assert ("tensor 'tokens' [6, 128] (batch, length): batch=6 on batch:4: use "
          "a batch size that is a multiple of 4 (e.g. 8), use a mesh with "
          "batch in {1,2,3,6}, or leave batch unsharded (drop "
          "'batch:batch').") in message


def test_unknown_logical_axis_and_wrong_rank_name_the_tensor():
  message = _error([("ffn/kernel:0", (16, 64), ("d_model", "dff")),
                    ("query/kernel:0", (16, 4), QUERY_KERNEL_AXES)],
                   "d_ff:model", "model:2")
  assert ("tensor 'ffn/kernel:0' [16, 64] (d_model, dff): unknown logical "
          "axis 'dff'. Did you mean 'd_ff'?") in message
  assert ("tensor 'query/kernel:0' [16, 4] (d_model, key_heads, d_k): 2 "
          "dimensions but 3 logical axes") in message


def test_device_count_is_checked_with_the_rules():
  message = _error([], T5_RULES, "batch:2,model:4", num_devices=4)
  assert "mesh batch:2,model:4 needs 8 devices but only 4" in message


def test_every_problem_is_reported_at_once_and_repeats_are_grouped():
  tensors = [(f"layer_{i}/query/kernel:0", (768, 12, 64), QUERY_KERNEL_AXES)
             for i in range(6)]
  tensors.append(("embeddings:0", (30522, 768), ("vocab", "d_model")))
  message = _error(tensors, "key_heads:model;vocab:model", "model:8")
  lines = message.splitlines()
  assert len(lines) == 3, message
  assert lines[1].startswith(
      "tensor 'layer_0/query/kernel:0' [768, 12, 64] (d_model, key_heads, "
      "d_k) and 5 more (layer_1/query/kernel:0, layer_2/query/kernel:0, "
      "layer_3/query/kernel:0, ...): key_heads=12 is not divisible by "
      "model=8")
  assert lines[2].startswith("tensor 'embeddings:0' [30522, 768] "
                             "(vocab, d_model): vocab=30522 on model:8")


# ---- Mesh TensorFlow --------------------------------------------------------
def test_mtf_parses_the_strings_and_agrees_on_every_layout():
  compat = pytest.importorskip("thattn.mtf.compat")
  mtf = compat.import_mesh_tensorflow()
  rules = LayoutRules.parse(T5_RULES)
  mesh = MeshSpec.parse("batch:2,model:4")
  mtf_rules = mtf.convert_to_layout_rules(rules.to_mtf_layout())
  mtf_mesh = mtf.convert_to_shape(mesh.to_mtf_mesh_shape())
  assert mtf_mesh.to_integer_list == [2, 4]
  tensors = [("x", (8, 16, 64), ("batch", "length", "d_model")),
             ("q", (64, 4, 16), ("d_model", "heads", "d_k")),
             ("ffn", (64, 256), ("d_model", "d_ff")),
             ("emb", (32000, 64), ("vocab", "d_model"))]
  plan = plan_layouts(tensors, rules, mesh)
  for name, shape, axes in tensors:
    mtf_shape = mtf.Shape([mtf.Dimension(axis, size)
                           for axis, size in zip(axes, shape)])
    expected = [None if axis is None else mesh.names.index(axis)
                for axis in plan[name]]
    assert list(mtf_rules.tensor_layout(mtf_shape, mtf_mesh)) == expected
