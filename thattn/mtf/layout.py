"""thattn's sharding rules as Mesh TensorFlow layouts, on logical CPU devices.

One rules table drives both backends: `thattn.sharding.LayoutRules` maps
logical axes to mesh axes for DTensor, and the same object gives mtf its
`layout` string; `thattn.sharding.MeshSpec` gives its `mesh_shape`.

    rules = sharding.LayoutRules.parse("batch:batch;heads:model")
    mesh = sharding.MeshSpec.parse("batch:2,model:2")
    mesh_impl = layout.placement_mesh_impl(mesh=mesh, rules=rules)

mtf lays out a tensor dimension by its *name*, so the rules work on an mtf
layer when its dimensions carry thattn's logical-axis names: mtf's own
layers already call them `d_model`, `heads`, `d_k`, `d_v`, `batch` and
`length`; talking heads names them after its arguments (`key_heads`,
`heads`, `value_heads` as thattn does), and `thattn.mtf.layers` names the
groups of grouped talking heads `head_groups`. mtf dimensions that are not
thattn logical axes (`d_kv`, `memory_length`, `buckets`, ...) are never
sharded, since `LayoutRules.parse` refuses unknown logical axes.

Departures from mtf, to fail early and clearly: a rule naming a mesh axis
the mesh lacks and a dimension the mesh axis does not divide are
ValueErrors naming the variable and the sizes (`check_variables`); mtf
ignores the first and fails on the second deep in the lowering.
"""

import tensorflow as tf

from thattn import sharding
from thattn.mtf import compat

mtf = compat.import_mesh_tensorflow()


def _rules(rules):
  return (rules if isinstance(rules, sharding.LayoutRules) else
          sharding.LayoutRules.parse(rules))


def _mesh(mesh):
  return (mesh if isinstance(mesh, sharding.MeshSpec) else
          sharding.MeshSpec.parse(mesh))


def mtf_layout(rules):
  """The mtf `layout` string of `rules` (a LayoutRules or its string)."""
  return _rules(rules).to_mtf_layout()


def mtf_mesh_shape(mesh):
  """The mtf `mesh_shape` string of `mesh` (a MeshSpec or its string)."""
  return _mesh(mesh).to_mtf_mesh_shape()


def configure_logical_cpus(count):
  """Splits the first physical CPU into `count` logical devices.

  Must run before TensorFlow initializes its devices (for tests, in a fresh
  process). Idempotent when the devices already exist.

  Raises:
    ValueError when TensorFlow already has fewer logical CPUs than `count`.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    # Listing logical devices would initialize them, so try first.
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * count)
  except RuntimeError as error:
    existing = len(tf.config.list_logical_devices("CPU"))
    if existing >= count:
      return
    raise ValueError(
        f"cannot make {count} logical CPU devices: TensorFlow already "
        f"initialized {existing}; call configure_logical_cpus({count}) "
        "before anything runs on a device (in a fresh process).") from error


def cpu_devices(count):
  """The names of the first `count` logical CPU devices."""
  devices = [device.name for device in tf.config.list_logical_devices("CPU")]
  sharding.MeshSpec((("devices", count),)).check_devices(len(devices))
  return devices[:count]


def placement_mesh_impl(*, mesh, rules, devices=None):
  """`mtf.placement_mesh_impl.PlacementMeshImpl` for thattn's rules.

  Args:
    mesh: a `sharding.MeshSpec` or its string, e.g. "batch:2,model:2".
    rules: a `sharding.LayoutRules` or its string, e.g.
      "batch:batch;heads:model".
    devices: device names, one per mesh position; defaults to the first
      logical CPUs.

  Raises:
    ValueError when a rule names a mesh axis the mesh lacks, names an
    unknown logical axis, or the mesh needs more devices than there are.
  """
  mesh, rules = _mesh(mesh), _rules(rules)
  rules.check_mesh(mesh)
  if devices is None:
    devices = cpu_devices(mesh.size)
  elif len(devices) != mesh.size:
    raise ValueError(f"mesh {mesh} has {mesh.size} positions, got "
                     f"{len(devices)} devices {list(devices)}; give one "
                     "device per position.")
  return mtf.placement_mesh_impl.PlacementMeshImpl(
      shape=mtf_mesh_shape(mesh), layout=mtf_layout(rules),
      devices=list(devices))


def logical_axes(mtf_shape):
  """thattn logical axes of an mtf shape's dimension names (None if none)."""
  known = set(sharding.known_logical_axes())
  return tuple(dim.name if dim.name in known else None
               for dim in mtf_shape.dims)


def check_variables(variables, *, mesh, rules, prefix=""):
  """Checks every mtf variable against the rules before lowering.

  Args:
    variables: mtf Variables (e.g. `mesh_graph.trainable_variables`).
    mesh: a `sharding.MeshSpec` or its string.
    rules: a `sharding.LayoutRules` or its string.
    prefix: stripped from the variable names in messages.

  Returns:
    {variable name: mesh axis or None per dimension}.

  Raises:
    ValueError naming each variable whose dimension the mesh axis does not
    divide (e.g. "heads=3 is not divisible by model=2"), with what to change.
  """
  tensors = [(variable.name[len(prefix):] if variable.name.startswith(prefix)
              else variable.name, variable.shape.to_integer_list,
              logical_axes(variable.shape)) for variable in variables]
  return sharding.plan_layouts(tensors, _rules(rules), _mesh(mesh))


def lower(mtf_mesh, variables, *, mesh=None, rules=None, devices=None,
          prefix=""):
  """(mtf.Lowering of `mtf_mesh`'s graph, the layout plan).

  On one device when `mesh` is None (the plan is {}); else on the mesh's
  devices by `rules`, every variable checked first (`check_variables`:
  the plan maps each name to a mesh axis or None per dimension).
  autostack=False: on a multi-device mesh mtf would otherwise merge
  same-shaped variables into stacked ones, renaming them.
  """
  if mesh is None:
    mesh_impl, plan = mtf.placement_mesh_impl.PlacementMeshImpl(
        shape=[], layout={}, devices=[""]), {}
  else:
    plan = check_variables(variables, mesh=mesh, rules=rules or "",
                           prefix=prefix)
    mesh_impl = placement_mesh_impl(mesh=mesh, rules=rules or "",
                                    devices=devices)
  return mtf.Lowering(mtf_mesh.graph, {mtf_mesh: mesh_impl},
                      autostack=False), plan
