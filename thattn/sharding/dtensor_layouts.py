"""DTensor layouts for thattn weights and activations, from one rules table.

Every thattn layer declares `layer.logical_axes`: {variable name: logical
axes}. The rules map logical axes to mesh axes, so a weight's layout is
`Layout([rules.mesh_axis(axis) or UNSHARDED for axis in axes], mesh)`.

Building a sharded model (see `build_sharded`) works like t5x's abstract
initialization: a probe build reads every weight's logical axes and shape,
then a second build, under `tf.variable_creator_scope`, creates each weight
directly as a `dtensor.DVariable` with its layout.

Why not `tf_keras.dtensor.experimental.LayoutMap`: its keys are matched
against object attribute paths ("tha._query_dense.kernel"), not variable
names, so using it would tie the rules to the layers' private attribute
names; and it converts variables only when a Model is constructed or first
called, so a bare layer keeps lazy variables. The creator scope needs
neither.

Known TensorFlow 2.21 DTensor pitfalls (measured on logical CPU devices):

- `x[:, tf.newaxis]` (a strided slice with a new axis) on a DTensor inside
  tf.function crashes the process (SIGSEGV) or fails the SPMD pass
  ("'tf.StridedSlice' op ComputeLayoutForward error"); `tf.expand_dims`
  works. Masks and position biases go through such slices in
  `thattn.layers` (base, attention_ops, relative_position) and
  `thattn.models.embeddings`, so masked attention and the models cannot run
  under DTensor until those use `tf.expand_dims`.
- `tape.gradient` in eager mode fails ("got a regular tensor ... but was
  expecting a DTensor") because the seed gradient is not a DTensor; take
  gradients inside tf.function.
- `tf.Variable(dtensor_value)` gives a plain ResourceVariable; only
  `dtensor.DVariable` keeps the layout.
- `tf.gather(variable, ids)` (ResourceGather) refuses a table sharded on
  its first axis, so a vocab-sharded embedding must gather from
  `variable.read_value()` (its gradient then comes back replicated);
  `thattn.models.embeddings.TokenEmbedding` does so for DVariables.
- Stateful random ops (tf-keras Dropout) are refused: "Stateful random
  operations are not supported in DTensor".
- ResourceScatterAdd (tf-keras Adam's path for IndexedSlices gradients)
  has no layout propagation, even on a replicated table: pass dense
  gradients.
- tf-keras Adam's weight updates are lost when `apply_gradients` runs in
  the same tf.function that takes the gradients (its m and v update, the
  weights do not); in a second tf.function they land. Adafactor is not
  affected. `thattn.training.dtensor` works around all three.
- tf_keras LayerNormalization with epsilon >= 1.001e-5 (the default is
  1e-3) runs FusedBatchNormV3, which DTensor cannot lay out; BERT's 1e-12
  takes the unfused path.
"""

import re
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from thattn.sharding import rules as rules_lib


def make_mesh(mesh_spec, device_type="CPU"):
  """A `dtensor.Mesh` for `mesh_spec` on the first local devices.

  Raises ValueError, before any computation, if there are too few devices.
  Listing the devices initializes TensorFlow's runtime, so logical CPU
  devices must be configured before this call.
  """
  if isinstance(mesh_spec, str):
    mesh_spec = rules_lib.MeshSpec.parse(mesh_spec)
  devices = tf.config.list_logical_devices(device_type)
  mesh_spec.check_devices(len(devices), device_type)
  return dtensor.create_mesh(
      list(mesh_spec.axes),
      devices=[device.name for device in devices[:mesh_spec.size]],
      device_type=device_type)


def make_distributed_mesh(mesh_spec, device_type="CPU"):
  """A `dtensor.Mesh` over the local devices of every client of a job.

  Multi-client DTensor: each process is one client, told its place by
  TensorFlow's variables DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS,
  DTENSOR_JOB_NAME and DTENSOR_JOBS; the mesh's devices are the clients'
  local devices in client order. Initializes DTensor's accelerator system
  (once per process), which connects the clients.

  Raises ValueError if the clients' devices do not add up to the mesh.
  """
  if isinstance(mesh_spec, str):
    mesh_spec = rules_lib.MeshSpec.parse(mesh_spec)
  connect_clients(device_type)
  local = dtensor.num_local_devices(device_type)
  if local * dtensor.num_clients() != mesh_spec.size:
    raise ValueError(
        f"mesh {mesh_spec} needs {mesh_spec.size} {device_type} devices, but "
        f"{dtensor.num_clients()} clients with {local} each have "
        f"{local * dtensor.num_clients()}.")
  return dtensor.create_distributed_mesh(list(mesh_spec.axes),
                                         device_type=device_type)


_clients_connected = []


def connect_clients(device_type="CPU"):
  """Initializes multi-client DTensor once per process; see above.

  It must run before TensorFlow initializes its runtime (the first op or
  device listing after the logical devices are configured), so binaries
  call it first thing.
  """
  if not _clients_connected:
    dtensor.initialize_accelerator_system(device_type)
    _clients_connected.append(device_type)


def mesh_spec_of(mesh):
  """The MeshSpec of a `dtensor.Mesh` (or of a MeshSpec: itself)."""
  if isinstance(mesh, rules_lib.MeshSpec):
    return mesh
  return rules_lib.MeshSpec(tuple((name, mesh.dim_size(name))
                                  for name in mesh.dim_names))


def layout(mesh, rules, logical_axes, shape=None, name="tensor"):
  """The layout of a tensor with these logical axes (None: never sharded).

  With `shape`, checks the rules against it first (see `plan_layouts`).
  """
  logical_axes = tuple(logical_axes)
  if shape is not None:
    mesh_axes = rules_lib.plan_layouts(
        [(name, tuple(shape), logical_axes)], rules,
        mesh_spec_of(mesh))[name]
  else:
    rules.check_mesh(mesh_spec_of(mesh))
    mesh_axes = rules.mesh_axes(logical_axes)
  return dtensor.Layout([axis or dtensor.UNSHARDED for axis in mesh_axes],
                        mesh)


def batch_layout(mesh, rules, rank, logical_axes=(rules_lib.BATCH,)):
  """Layout of a `[batch, ...]` input: the leading logical axes, then None."""
  axes = tuple(logical_axes) + (None,) * (rank - len(logical_axes))
  return layout(mesh, rules, axes)


def shard(value, mesh, rules, logical_axes, name="input"):
  """Copies `value` onto the mesh, laid out by `logical_axes`.

  Checks divisibility first, e.g. a batch of 6 on `batch:4` fails here with
  a ValueError rather than inside the computation.
  """
  value = tf.convert_to_tensor(value)
  axes = tuple(logical_axes) + (None,) * (value.shape.rank - len(logical_axes))
  return dtensor.copy_to_mesh(
      value, layout(mesh, rules, axes, value.shape.as_list(), name))


def to_numpy(value):
  """The full (unsharded) value of a tensor, DTensor or variable."""
  if isinstance(value, tf.Variable):
    value = value.read_value()
  if dtensor.is_dtensor(value):
    value_layout = dtensor.fetch_layout(value)
    value = dtensor.relayout(
        value, dtensor.Layout.replicated(value_layout.mesh,
                                         value_layout.rank))
    value = dtensor.unpack(value)[0]
  return np.asarray(value)


# ---- weights ----------------------------------------------------------------
def variable_layout(variable):
  """A DVariable's layout, or None for an ordinary variable.

  Read as an attribute rather than by isinstance, because under a mixed
  precision policy tf-keras wraps each DVariable in an AutoCastVariable,
  which passes attribute reads through to it.
  """
  return getattr(variable, "layout", None)


def logical_axes_of(obj):
  """[(variable, logical axes or None)] for every variable of `obj`.

  Reads `logical_axes` ({variable name: axes}) from `obj` and from each of
  its submodules, and matches names against that module's own variables,
  so two layers whose variables share a name never mix.
  """
  axes_by_variable = {}
  for module in [obj] + list(obj.submodules):
    declared = getattr(module, "logical_axes", None)
    if not isinstance(declared, dict):
      continue
    for variable in module.variables:
      if variable.name not in declared:
        continue
      axes = tuple(declared[variable.name])
      earlier = axes_by_variable.setdefault(variable.ref(), axes)
      if earlier != axes:
        raise ValueError(
            f"variable {variable.name!r} is declared with logical axes "
            f"{earlier} and {axes} (by {module.name!r}); declare it once.")
  return [(variable, axes_by_variable.get(variable.ref()))
          for variable in obj.variables]


def plan_weights(obj, rules, mesh, strict=False):
  """[(variable, mesh axes)] for every variable of `obj`, validated.

  `mesh` may be a `dtensor.Mesh` or a `MeshSpec`, so a plan can be checked
  without any device. Variables without logical axes are replicated, or
  with `strict` raise a ValueError listing them.
  """
  declared = logical_axes_of(obj)
  missing = [variable.name for variable, axes in declared if axes is None]
  if strict and missing:
    raise ValueError(
        f"{len(missing)} variables declare no logical axes: {missing}; add "
        "them to their layer's `logical_axes`, or pass strict=False to "
        "replicate them.")
  tensors = [(variable.name, variable.shape.as_list(),
              axes or (None,) * variable.shape.rank)
             for variable, axes in declared]
  mesh_axes = rules_lib.check_layouts(tensors, rules, mesh_spec_of(mesh))
  return [(variable, axes)
          for (variable, _), axes in zip(declared, mesh_axes)]


def weight_layouts(obj, rules, mesh, strict=False):
  """{variable name: dtensor.Layout} for every weight of a built layer/model.

  Raises ValueError if two weights share a name but not a layout (use
  `plan_weights`, which keys by variable, for such models).
  """
  layouts = {}
  for variable, mesh_axes in plan_weights(obj, rules, mesh, strict):
    layout_ = layouts.setdefault(variable.name, _layout(mesh, mesh_axes))
    if layout_.sharding_specs != _layout(mesh, mesh_axes).sharding_specs:
      raise ValueError(
          f"two weights are named {variable.name!r} but need layouts "
          f"{layout_.sharding_specs} and {list(mesh_axes)}; name them apart "
          "or use plan_weights.")
  return layouts


def _layout(mesh, mesh_axes):
  return dtensor.Layout([axis or dtensor.UNSHARDED for axis in mesh_axes],
                        mesh)


class ShardedBuild(NamedTuple):
  model: Any  # the layer or model built with DVariables
  reference: Any  # the unsharded probe; the model starts with its weights


def _base_name(name):
  """A variable name without Keras's uniquifying "_<n>" suffixes or ":0"."""
  return re.sub(r"_\d+(?=/|$)", "", name.split(":")[0])


def build_sharded(build_fn, rules, mesh, strict=False):
  """Builds `build_fn()` with every weight a DVariable laid out by `rules`.

  `build_fn` must create all the weights before it returns (build the layer
  or construct the functional model), the same way each time it is called:
  it is called twice. The first call is an ordinary, unsharded probe that
  gives each weight's logical axes, shape and initial value; the second
  runs under a variable creator that makes the i-th weight a DVariable with
  its layout, initialized from the probe's i-th weight. (The probe holds the
  full weights once on the host; a lazy probe would avoid that.)

  Returns:
    ShardedBuild(model, reference): the sharded result and the probe, which
    holds the same weights unsharded.

  Raises:
    ValueError if the rules do not fit a weight (before anything is
    sharded), or if the second build differs from the first.
  """
  created = []

  def record(next_creator, **kwargs):
    created.append(next_creator(**kwargs))
    return created[-1]

  with tf.variable_creator_scope(record):
    reference = build_fn()
  creator = _ShardedCreator(created, _planned_layouts(reference, rules, mesh,
                                                      strict), mesh)
  with tf.variable_creator_scope(creator):
    model = build_fn()
  if creator.remaining:
    raise ValueError(f"build_fn created {creator.made} weights the second "
                     f"time but {len(created)} the first; it must be "
                     "deterministic.")
  unsharded = [variable.name for variable in model.variables
               if variable_layout(variable) is None]
  if unsharded:
    raise ValueError(
        f"weights {unsharded} were created after build_fn returned (e.g. on "
        "the first call); build the layer or model inside build_fn.")
  return ShardedBuild(model, reference)


def _planned_layouts(reference, rules, mesh, strict):
  """{weight name: mesh axes} of the probe's weights.

  Keyed by name, not by variable: under a mixed precision policy the
  model's weights are AutoCastVariables that tf-keras wraps around what
  the creator made, so the recorded variables are not the model's.
  """
  planned = {}
  for variable, mesh_axes in plan_weights(reference, rules, mesh, strict):
    if planned.setdefault(variable.name, mesh_axes) != mesh_axes:
      raise ValueError(
          f"two weights are named {variable.name!r} but need layouts "
          f"{list(planned[variable.name])} and {list(mesh_axes)}; name "
          "their layers apart.")
  return planned


class _ShardedCreator:
  """A variable creator: the i-th weight as a DVariable laid out as the
  probe's i-th weight is planned, with the probe's value."""

  def __init__(self, probes, planned, mesh):
    self.probes, self.planned, self.mesh = probes, planned, mesh
    self.remaining = list(probes)

  @property
  def made(self):
    return len(self.probes) - len(self.remaining)

  def __call__(self, next_creator, **kwargs):
    del next_creator  # never creates an unsharded copy
    if not self.remaining:
      raise ValueError(f"build_fn created more weights the second time than "
                       f"the first ({len(self.probes)}); it must be "
                       "deterministic.")
    probe = self.remaining.pop(0)
    name = kwargs.get("name") or "Variable"
    shape = kwargs.get("shape")
    if (_base_name(name) != _base_name(probe.name.rsplit("/", 1)[-1]) or
        (shape is not None and tf.TensorShape(shape) != probe.shape)):
      raise ValueError(
          f"build_fn is not deterministic: weight {self.made - 1} was "
          f"{probe.name!r} {probe.shape} in the probe build but "
          f"{name!r} {shape} in the sharded build.")
    mesh_axes = self.planned.get(probe.name, (None,) * probe.shape.rank)
    with tf.init_scope():
      initial = dtensor.copy_to_mesh(probe.read_value(),
                                     _layout(self.mesh, mesh_axes))
      return dtensor.DVariable(initial, trainable=probe.trainable, name=name)


def copy_weights(source, target):
  """Copies every weight of `source` into `target`, sharded or not.

  The two must have the same structure (e.g. built by the same function);
  either may hold DVariables, so this moves weights between an unsharded
  model and a sharded one in both directions.
  """
  pairs = list(zip(source.variables, target.variables))
  if len(source.variables) != len(target.variables) or any(
      s.shape != t.shape or _base_name(s.name) != _base_name(t.name)
      for s, t in pairs):
    raise ValueError(
        "copy_weights needs two models of the same structure, got "
        f"{[(v.name, v.shape.as_list()) for v in source.variables]} and "
        f"{[(v.name, v.shape.as_list()) for v in target.variables]}.")
  for source_variable, target_variable in pairs:
    value = to_numpy(source_variable)
    if variable_layout(target_variable) is not None:
      value = dtensor.copy_to_mesh(value, variable_layout(target_variable))
    target_variable.assign(value)
