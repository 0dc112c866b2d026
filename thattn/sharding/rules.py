"""Mesh specs, logical-axis layout rules, and their validation.

This module imports no TensorFlow, so flags can be parsed and layouts
checked before any device exists. Both backends read the same
objects: `thattn.sharding.dtensor_layouts` turns them into DTensor layouts,
and `LayoutRules.to_mtf_layout()` / `MeshSpec.to_mtf_mesh_shape()` give the
strings Mesh TensorFlow parses::

    mesh = MeshSpec.parse("batch:2,model:2")
    rules = LayoutRules.parse("batch:batch;heads:model;d_ff:model")
    plan = plan_layouts([("query/kernel:0", (768, 12, 64),
                          ("d_model", "key_heads", "d_k"))], rules, mesh)
    # {"query/kernel:0": (None, None, None)}  (key_heads is not in the rules)

The string forms follow Mesh TensorFlow: "name:value" pairs separated by
";" or "," (mtf also accepts "." and spaces). Departures from mtf, both to
fail early: a rule naming a mesh axis the mesh lacks is an error (mtf ignores
it), and so is a logical axis given two rules (mtf fails only when both mesh
axes exist).
"""

import dataclasses
import difflib
import itertools
import math
import re

from thattn.core import dims

# thattn's default rules, for DTensor and keras.distribution alike: Mesh
# TensorFlow's classic "batch:batch;heads:model;d_ff:model;vocab:model" in
# thattn's axes. Data parallel on `batch`, and on `model` the query/key heads
# and the value heads (so multi-head attention shards, and talking heads'
# P_l and P_w split along one side; the softmax heads stay whole, see the
# rules' error hint), the feed-forward width and the vocabulary.
DEFAULT_LAYOUT_RULES = ("batch:batch;key_heads:model;value_heads:model;"
                        "d_ff:model;vocab:model")

# Activation axes: they name no weight dimension (thattn.core.dims lists those),
# but rules shard them, e.g. "batch:batch" for data parallelism.
BATCH = "batch"
LENGTH = "length"
EXPERTS = "experts"
ACTIVATION_AXES = (BATCH, LENGTH, EXPERTS)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEPARATORS = re.compile(r"[,;\s]+")
_HEAD_AXES = frozenset((dims.KEY_HEADS, dims.HEADS, dims.VALUE_HEADS))


def known_logical_axes():
  """Every logical axis a rule or a weight may name."""
  return tuple(dict.fromkeys(dims.LOGICAL_AXES + ACTIVATION_AXES))


def _did_you_mean(name, choices):
  close = difflib.get_close_matches(name, choices, n=1)
  return f" Did you mean {close[0]!r}?" if close else ""


def _pairs(spec, what, example):
  """Splits "a:b;c:d" into [("a", "b"), ("c", "d")]; callers check names."""
  if not isinstance(spec, str):
    raise ValueError(f"{what} must be a string such as {example!r}, got "
                     f"{spec!r}.")
  pairs = []
  for item in _SEPARATORS.split(spec.strip()):
    if not item:
      continue
    parts = item.split(":")
    if len(parts) != 2 or not all(parts):
      raise ValueError(f"{what} {spec!r}: cannot read {item!r}; write "
                       f"name:value pairs separated by ';' or ',', such as "
                       f"{example!r}.")
    pairs.append(tuple(parts))
  return pairs


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """Named mesh axes and their sizes, e.g. `MeshSpec.parse("batch:2,model:2")`.

  The device count is the product of the sizes; axes are major to minor, as
  in Mesh TensorFlow and DTensor (the last axis varies fastest over devices).
  """
  axes: tuple  # ((name, size), ...)

  @classmethod
  def parse(cls, spec):
    example = "batch:2,model:2"
    pairs = _pairs(spec, "mesh spec", example)
    if not pairs:
      raise ValueError(f"mesh spec {spec!r} is empty; write axis:size pairs "
                       f"such as {example!r} (use 'batch:1' for one device).")
    axes = []
    for name, size in pairs:
      if not _NAME.match(name):
        raise ValueError(f"mesh spec {spec!r}: axis name {name!r} must start "
                         "with a letter or '_'.")
      if not size.isdigit() or int(size) < 1:
        raise ValueError(f"mesh spec {spec!r}: size {size!r} of axis {name!r} "
                         "must be a positive integer.")
      if name in dict(axes):
        raise ValueError(f"mesh spec {spec!r} names axis {name!r} twice; each "
                         "mesh axis appears once.")
      axes.append((name, int(size)))
    return cls(tuple(axes))

  @property
  def names(self):
    return tuple(name for name, _ in self.axes)

  @property
  def shape(self):
    return tuple(size for _, size in self.axes)

  @property
  def size(self):
    return math.prod(self.shape)

  def axis_size(self, name):
    sizes = dict(self.axes)
    if name not in sizes:
      raise ValueError(f"mesh {self} has no axis {name!r} (axes: "
                       f"{', '.join(self.names)}).{_did_you_mean(name, sizes)}")
    return sizes[name]

  def to_mtf_mesh_shape(self):
    """The `mesh_shape` string Mesh TensorFlow parses: "batch:2,model:2"."""
    return ",".join(f"{name}:{size}" for name, size in self.axes)

  def __str__(self):
    return self.to_mtf_mesh_shape()

  def check_devices(self, num_devices, device_type="CPU"):
    """Raises ValueError if the mesh needs more than `num_devices` devices."""
    if self.size <= num_devices:
      return
    smaller = _shrink(self, num_devices)
    hint = f" such as {smaller}" if smaller else ""
    logical = (
        ", or for CPU tests create logical devices first with "
        "tf.config.set_logical_device_configuration(cpu, "
        f"[tf.config.LogicalDeviceConfiguration()] * {self.size}) before "
        "TensorFlow initializes its devices" if device_type == "CPU" else "")
    raise ValueError(
        f"mesh {self} needs {self.size} devices but only {num_devices} "
        f"{device_type} devices are available: use a smaller mesh{hint}"
        f"{logical}.")


def _shrink(mesh, num_devices):
  """The largest mesh with the same axes that fits in `num_devices`.

  Each axis keeps a divisor of its size; ties go to the mesh with the most
  axes larger than 1. None if nothing fits.
  """
  choices = [[(name, d) for d in _divisors(size, size)]
             for name, size in mesh.axes]
  fitting = [axes for axes in itertools.product(*choices)
             if math.prod(size for _, size in axes) <= num_devices]
  if not fitting:
    return None
  return MeshSpec(max(fitting, key=lambda axes: (
      math.prod(size for _, size in axes),
      sum(size > 1 for _, size in axes))))


@dataclasses.dataclass(frozen=True)
class LayoutRules:
  """Logical axis -> mesh axis, e.g. "batch:batch;heads:model;d_ff:model".

  A logical axis without a rule is not sharded (replicated).
  """
  rules: tuple  # ((logical axis, mesh axis), ...)

  @classmethod
  def parse(cls, spec):
    example = "batch:batch;heads:model;d_ff:model;vocab:model"
    known = known_logical_axes()
    rules = []
    for logical, mesh_axis in _pairs(spec, "layout rules", example):
      if logical not in known:
        raise ValueError(
            f"layout rules {spec!r}: unknown logical axis {logical!r} in "
            f"'{logical}:{mesh_axis}'.{_did_you_mean(logical, known)} Known "
            f"logical axes: {', '.join(known)}.")
      if not _NAME.match(mesh_axis):
        raise ValueError(f"layout rules {spec!r}: mesh axis {mesh_axis!r} in "
                         f"'{logical}:{mesh_axis}' must start with a letter "
                         "or '_'.")
      earlier = dict(rules).get(logical)
      if earlier is not None:
        raise ValueError(
            f"layout rules {spec!r} give logical axis {logical!r} two rules, "
            f"'{logical}:{earlier}' and '{logical}:{mesh_axis}'; a logical "
            "axis maps to at most one mesh axis, so keep one of them.")
      rules.append((logical, mesh_axis))
    return cls(tuple(rules))

  def mesh_axis(self, logical_axis):
    """The mesh axis that shards `logical_axis`, or None."""
    return dict(self.rules).get(logical_axis)

  def mesh_axes(self, logical_axes):
    """Mesh axis (or None) per dimension, for a tuple of logical axes."""
    return tuple(None if axis is None else self.mesh_axis(axis)
                 for axis in logical_axes)

  def to_mtf_layout(self):
    """The `layout` string that mtf.convert_to_layout_rules parses."""
    return ";".join(f"{logical}:{mesh_axis}"
                    for logical, mesh_axis in self.rules)

  def __str__(self):
    return self.to_mtf_layout()

  def check_mesh(self, mesh):
    """Raises ValueError if a rule names a mesh axis that `mesh` lacks."""
    for logical, mesh_axis in self.rules:
      if mesh_axis not in mesh.names:
        raise ValueError(
            f"layout rule '{logical}:{mesh_axis}' names mesh axis "
            f"{mesh_axis!r}, which mesh {mesh} does not have (axes: "
            f"{', '.join(mesh.names)}).{_did_you_mean(mesh_axis, mesh.names)} "
            f"Add {mesh_axis} to the mesh or drop the rule.")


# ---- validation -------------------------------------------------------------
def plan_layouts(tensors, rules, mesh, num_devices=None, device_type="CPU"):
  """Checks the rules against every tensor and returns their mesh axes.

  Args:
    tensors: iterable of (name, shape, logical_axes); a logical axis may be
      None (never sharded).
    rules: LayoutRules.
    mesh: MeshSpec.
    num_devices: if given, the mesh must fit in this many devices.
    device_type: named in the device-count error.

  Returns:
    {name: tuple of mesh axis or None, one per dimension}.

  Raises:
    ValueError listing every problem, one per line, each naming the tensor,
    the logical axis and the sizes, and saying what to change.
  """
  tensors = list(tensors)
  mesh_axes = check_layouts(tensors, rules, mesh, num_devices, device_type)
  return {name: axes for (name, _, _), axes in zip(tensors, mesh_axes)}


def check_layouts(tensors, rules, mesh, num_devices=None, device_type="CPU"):
  """`plan_layouts` as a list in the order of `tensors` (names may repeat).

  A problem shared by many tensors (say heads=12 on model:8 in every layer)
  is reported once, naming the first tensor and counting the others.
  """
  rules.check_mesh(mesh)
  if num_devices is not None:
    mesh.check_devices(num_devices, device_type)
  tensors = [(name, tuple(shape), tuple(axes))
             for name, shape, axes in tensors]
  problems = {}  # {what to change: [tensor descriptions]}, in order
  for name, shape, axes in tensors:
    for problem in _shape_problems(shape, axes):
      problems.setdefault(problem, []).append(_describe(name, shape, axes))
  if problems:
    raise ValueError(_report(problems))
  common = _common_sizes(tensors, rules)
  planned = []
  for name, shape, axes in tensors:
    mesh_axes = rules.mesh_axes(axes)
    found = _duplicate_problems(axes, mesh_axes)
    for size, axis, mesh_axis in zip(shape, axes, mesh_axes):
      if mesh_axis is not None and size % mesh.axis_size(mesh_axis):
        found.append(_divisibility_problem(
            size, axis, mesh_axis, mesh.axis_size(mesh_axis),
            common[mesh_axis]))
    for problem in found:
      problems.setdefault(problem, []).append(_describe(name, shape, axes))
    planned.append(mesh_axes)
  if problems:
    raise ValueError(f"layout rules '{rules}' on mesh '{mesh}' do not fit:\n"
                     + _report(problems))
  return planned


def _describe(name, shape, axes):
  return (f"tensor {name!r} [{', '.join(map(str, shape))}] "
          f"({', '.join(str(axis) for axis in axes)})")


def _report(problems):
  lines = []
  for problem, tensors in problems.items():
    others = ""
    if len(tensors) > 1:
      names = ", ".join(t.split("'")[1] for t in tensors[1:4])
      more = ", ..." if len(tensors) > 4 else ""
      others = f" and {len(tensors) - 1} more ({names}{more})"
    lines.append(f"{tensors[0]}{others}: {problem}")
  return "\n".join(lines)


def _shape_problems(shape, axes):
  if len(shape) != len(axes):
    return [f"{len(shape)} dimensions but {len(axes)} logical axes; give one "
            "logical axis per dimension."]
  known = known_logical_axes()
  return [f"unknown logical axis {axis!r}.{_did_you_mean(axis, known)} Use a "
          "name from thattn.core.dims (or add it there)."
          for axis in axes if axis is not None and axis not in known]


def _common_sizes(tensors, rules):
  """gcd, per mesh axis, of every dimension size the rules put on it."""
  common = {}
  for _, shape, axes in tensors:
    for size, mesh_axis in zip(shape, rules.mesh_axes(axes)):
      if mesh_axis is not None:
        common[mesh_axis] = math.gcd(common.get(mesh_axis, 0), size)
  return common


def _duplicate_problems(axes, mesh_axes):
  problems = []
  for mesh_axis in dict.fromkeys(a for a in mesh_axes if a is not None):
    sharing = [axis for axis, m in zip(axes, mesh_axes) if m == mesh_axis]
    if len(sharing) < 2:
      continue
    listed = (" and ".join(sharing) + " both" if len(sharing) == 2 else
              ", ".join(sharing) + " all")
    rules = ", ".join(f"'{axis}:{mesh_axis}'" for axis in sharing)
    hint = ""
    if set(sharing) <= _HEAD_AXES:
      hint = (" Talking-heads projections mix one head set with another "
              "(P_l is [key_heads, heads], P_w is [heads, value_heads]), so "
              "shard key_heads and value_heads and leave heads unsharded, "
              "or shard heads alone. To shard every head set without "
              "communication in the attention core, use grouped talking "
              f"heads (num_head_groups a multiple of the {mesh_axis} size) "
              f"and add '{dims.HEAD_GROUPS}:{mesh_axis}'.")
    problems.append(
        f"{listed} map to mesh axis {mesh_axis} ({rules}), but a mesh axis "
        "can split only one dimension of a tensor: leave all but one of them "
        f"unsharded or map them to other mesh axes.{hint}")
  return problems


def _divisors(n, limit):
  return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _divisibility_problem(size, axis, mesh_axis, mesh_size, common):
  rule = f"'{axis}:{mesh_axis}'"
  # The sizes up to 64 (or twice this one) that divide every dimension the
  # rules put on this mesh axis.
  fitting = _divisors(common, max(64, 2 * mesh_size))
  meshes = f"use a mesh with {mesh_axis} in {{{','.join(map(str, fitting))}}}"
  padded = -(-size // mesh_size) * mesh_size
  if axis == dims.VOCAB:
    return (f"vocab={size} on {mesh_axis}:{mesh_size}: pad the vocabulary to "
            f"a multiple of {mesh_size} (e.g. {padded}), {meshes}, or leave "
            f"vocab unsharded (drop {rule}).")
  if axis == dims.HEAD_GROUPS:
    return (f"head_groups={size} is not divisible by {mesh_axis}="
            f"{mesh_size}: build the talking-heads layers with "
            f"num_head_groups a multiple of {mesh_size}, {meshes}, or leave "
            f"head_groups unsharded (drop {rule}).")
  if axis in (BATCH, LENGTH):
    what = "batch size" if axis == BATCH else "sequence length"
    return (f"{axis}={size} on {mesh_axis}:{mesh_size}: use a {what} that is "
            f"a multiple of {mesh_size} (e.g. {padded}), {meshes}, or leave "
            f"{axis} unsharded (drop {rule}).")
  return (f"{axis}={size} is not divisible by {mesh_axis}={mesh_size}: "
          f"{meshes}, or pad/choose {axis} divisible by {mesh_size}, or leave "
          f"{axis} unsharded (drop {rule}).")
