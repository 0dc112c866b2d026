"""Sharding the Keras 3 layers' heads with `keras.distribution`.

`layout_map(device_mesh, rules)` turns thattn's one rules table
(`thattn.sharding.LayoutRules`: logical axis -> mesh axis) into a
`keras.distribution.LayoutMap` for every weight the Keras 3 layers create,
matched by the weight's path ending (`.../query/kernel`,
`.../pre_softmax_projection`, ...), so::

    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"])
    keras.distribution.set_distribution(keras.distribution.ModelParallel(
        layout_map=thattn.keras3.layout_map(mesh), batch_dim_name="batch"))

shards the query/key/value/output kernels along their heads. Keras matches
variables by path, not by shape, and grouped talking heads store P_l, P_w
and the dynamic projections with one more dimension (their G blocks), so
the map is made for one `num_head_groups`; with G a multiple of the model
axis and the rule "head_groups:model", each device holds whole groups. The
same holds for the gate, P_g[d_X, h_v, d_v], or P_g[d_X, h_v] with
`headwise_gate`. DCMHA's kernels D_1, Q_kw and D_d split along their
heads where a rule shards `heads` (the default rules shard only the
projections' key and value heads: the compose mixes all heads of a
query-key pair).

`model_layout_map(device_mesh, model, rules)` does the same for a whole
model (`thattn.keras3.models`, or any layer built of thattn's Keras 3
layers): every weight whose layer names its logical axes (`logical_axes`:
heads, d_ff, vocab, d_model, ...) by its exact path, read from a built
model, with the sizes checked against the mesh (a heads count a mesh axis
does not divide is named before any device is touched). Weights without
logical axes (LayerNormalization's, the masked-LM transform) stay whole.
"""

import re

import keras

from thattn.core import attention_spec
from thattn.core import dims
from thattn.sharding import rules as rules_lib


def weight_axes(num_head_groups=1, headwise_gate=False):
  """{path pattern: logical axes} of every weight the Keras 3 layers make."""
  shapes = attention_spec.MixingShapes(1, 1, 1, num_head_groups)
  (_, mixing_l), (_, mixing_w) = shapes.static("l"), shapes.static("w")
  # Keras matches whole paths (re.fullmatch): a quantized projection's
  # `kernel_scale` and a LoRA projection's factors match no pattern and stay
  # replicated.
  axes = {f".*/{name}/{part}": part_axes
          for name, by_part in attention_spec.PROJECTION_AXES.items()
          for part, part_axes in by_part.items()}
  if headwise_gate:
    axes.update({f".*/gate/{part}": part_axes for part, part_axes in
                 attention_spec.HEADWISE_GATE_AXES.items()})
  axes.update({
      ".*/pre_softmax_projection": mixing_l,
      ".*/post_softmax_projection": mixing_w,
      ".*/x2l/kernel": (dims.D_MODEL,) + mixing_l,
      ".*/m2l/kernel": (dims.D_MODEL,) + mixing_l,
      ".*/x2w/kernel": (dims.D_MODEL,) + mixing_w,
      ".*/m2w/kernel": (dims.D_MODEL,) + mixing_w,
      ".*/relative_attention_bias": attention_spec.RELATIVE_BIAS_AXES,
  })
  axes.update({f".*/{name}": name_axes for name, name_axes in
               attention_spec.BILINEAR_AXES.items()})
  # DCMHA's dynamic kernels and static mix (their axes do not depend on
  # the sizes).
  axes.update({f".*/{name}": name_axes for name, _, name_axes, _ in
               attention_spec.compose_weights(1, 1, 1, 1, True)})
  return axes


def layout_map(device_mesh, rules=None, *, num_head_groups=1,
               headwise_gate=False):
  """A `keras.distribution.LayoutMap` of thattn's weights under `rules`.

  Args:
    device_mesh: a `keras.distribution.DeviceMesh`.
    rules: a `thattn.sharding.LayoutRules` or its string form, e.g.
      "batch:batch;key_heads:model;value_heads:model"; defaults to
      `thattn.sharding.DEFAULT_LAYOUT_RULES`.
    num_head_groups: the G of the model's talking-heads layers (1 for
      multi-head and ungrouped talking heads).
    headwise_gate: whether the layers' gates are head-wise (`use_gate`
      with `headwise_gate`), P_g[d_X, h_v] rather than P_g[d_X, h_v, d_v].

  Raises:
    ValueError naming the rule, if a rule names a mesh axis the device mesh
    lacks or would split one weight twice along the same mesh axis. Sizes
    that a mesh axis does not divide are named when the layer is built.
  """
  if not isinstance(rules, rules_lib.LayoutRules):
    rules = rules_lib.LayoutRules.parse(rules or
                                        rules_lib.DEFAULT_LAYOUT_RULES)
  mesh = rules_lib.MeshSpec(tuple(zip(device_mesh.axis_names,
                                      device_mesh.shape)))
  rules.check_mesh(mesh)
  result = keras.distribution.LayoutMap(device_mesh)
  tensors = [(pattern, (1,) * len(axes), axes) for pattern, axes in
             weight_axes(num_head_groups, headwise_gate).items()]
  # Sizes of 1 stand in for the unknown sizes: this checks the rules'
  # structure (no mesh axis twice in one weight), not divisibility.
  unit_mesh = rules_lib.MeshSpec(tuple((name, 1) for name in mesh.names))
  for (pattern, _, _), mesh_axes in zip(
      tensors, rules_lib.check_layouts(tensors, rules, unit_mesh)):
    result[pattern] = tuple(mesh_axes)
  return result


def logical_axes_by_path(model):
  """{weight path: logical axes} of every layer of a built `model` that
  names its weights' axes (the `logical_axes` property)."""
  axes = {}
  for layer in model._flatten_layers(include_self=True):  # pylint: disable=protected-access
    axes.update(getattr(layer, "logical_axes", None) or {})
  return axes


def model_layout_map(device_mesh, model, rules=None):
  """A `keras.distribution.LayoutMap` of every weight of a built `model`.

  Build the model once without a distribution to make the map, then build
  it again under `keras.distribution.ModelParallel(layout_map=...)`: Keras
  lays a variable out when it is created, by its path (the same in both
  builds: thattn's model builders name every layer).

  Raises:
    ValueError naming the weights whose sizes a mesh axis does not divide,
    or rules that do not fit the mesh.
  """
  if not isinstance(rules, rules_lib.LayoutRules):
    rules = rules_lib.LayoutRules.parse(rules or
                                        rules_lib.DEFAULT_LAYOUT_RULES)
  mesh = rules_lib.MeshSpec(tuple(zip(device_mesh.axis_names,
                                      device_mesh.shape)))
  shapes = {weight.path: tuple(weight.shape) for weight in model.weights}
  tensors = [(path, shapes[path], axes)
             for path, axes in logical_axes_by_path(model).items()
             if path in shapes]
  result = keras.distribution.LayoutMap(device_mesh)
  for (path, _, _), mesh_axes in zip(
      tensors, rules_lib.check_layouts(tensors, rules, mesh)):
    result[re.escape(path)] = tuple(mesh_axes)
  return result
