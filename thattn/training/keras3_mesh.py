"""`--backend=keras3 --mesh_shape=...`: a run laid out by keras.distribution.

The mesh and the rules are thattn's one table (`thattn.sharding`, the same
flags as `--strategy=dtensor` and `--backend=mtf`): with the default rules
the heads, d_ff and the vocabulary are split over the `model` axis and the
batch over the `batch` axis. `KerasMesh` makes the
`keras.distribution.DeviceMesh` on JAX's devices (on a CPU, JAX's host
platform split into as many devices: XLA's
--xla_force_host_platform_device_count, set before JAX starts), the
`ModelParallel` distribution of a model (`thattn.keras3.model_layout_map`)
and the layout of each batch. The compiled step (`keras3_steps.Steps`) then
runs on the sharded values as XLA partitions it.

Keras 3 lays a model out on JAX only (`keras.distribution`), so a mesh
needs KERAS_BACKEND=jax. The optimizer's slots are laid out as Keras makes
them: a slot of its variable's shape (Adam's, Adafactor's unfactored `v`)
like its variable, the factored row and column statistics whole.
"""

import dataclasses
import os

import keras

from thattn.keras3 import distribution as distribution_lib
from thattn.sharding import rules as rules_lib

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def split_host(count):
  """On a CPU, JAX's host platform split into `count` devices, unless
  XLA_FLAGS names a count already (before JAX starts; no effect after)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if HOST_DEVICES_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICES_FLAG}={count}".strip()


def jax_devices(count, mesh_shape):
  """JAX's devices (every process's, across a JAX cluster), at least
  `count` of them; on a CPU, the host split into `count` devices when JAX
  has not started yet (across processes `jax_processes` split each host
  into its share before joining).

  Raises:
    ValueError naming the mesh, the devices JAX has, and the flag to set.
  """
  split_host(count)
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  if len(devices) < count:
    raise ValueError(
        f"--mesh_shape={mesh_shape} needs {count} devices; JAX has "
        f"{len(devices)} ({devices[0].platform}). On a CPU, start the process "
        f"with XLA_FLAGS={HOST_DEVICES_FLAG}={count} (thattn-train sets it "
        "itself unless JAX started before it or XLA_FLAGS names another "
        "count).")
  return devices[:count]


class KerasMesh:
  """The device mesh, rules and layouts of one run; see the module."""

  def __init__(self, options, processes=None):
    """`processes`: the run's `jax_processes.Processes` across a JAX
    cluster (without --mesh_shape, the batch split over every process's
    devices), or None."""
    framework = keras.backend.backend()
    if framework != "jax":
      raise ValueError(
          f"--mesh_shape={options.mesh_shape} with --backend=keras3 needs "
          f"KERAS_BACKEND=jax (Keras 3 lays models out on JAX only); got "
          f"KERAS_BACKEND={framework}.")
    if options.mesh_shape is None:  # several processes: data parallel
      import jax  # pylint: disable=g-import-not-at-top
      options = dataclasses.replace(
          options, mesh_shape=f"{rules_lib.BATCH}:{jax.device_count()}")
    self.processes = processes
    self.spec, self.rules = options.mtf_mesh()
    self.mesh_shape = options.mesh_shape
    devices = jax_devices(self.spec.size, options.mesh_shape)
    held = len(keras.distribution.list_devices())  # every process's
    if processes and held != self.spec.size:
      raise ValueError(
          f"--mesh_shape={self.mesh_shape} has {self.spec.size} devices, but "
          f"the {processes.count} processes hold {held}: across processes "
          "the mesh spans every process's devices; pass a mesh of that many.")
    self.device_mesh = keras.distribution.DeviceMesh(
        self.spec.shape, list(self.spec.names), devices)
    self.batch_axis = self.rules.mesh_axes((rules_lib.BATCH,))[0]
    self.sharded = self.weights = 0

  def check_batch_size(self, batch_size):
    if self.batch_axis is None:
      return
    size = self.spec.axis_size(self.batch_axis)
    across = (f", over {self.processes.count} processes" if self.processes
              else "")
    if batch_size % size:
      raise ValueError(
          f"--batch_size={batch_size} does not split over the mesh's "
          f"{size} batch shards (its {self.batch_axis!r} axis, --mesh_shape="
          f"{self.mesh_shape}{across}); pass a multiple of {size}.")

  def distribution(self, reference):
    """The `ModelParallel` distribution of a model built like `reference`
    (built, without a distribution)."""
    layout_map = distribution_lib.model_layout_map(self.device_mesh,
                                                   reference, self.rules)
    self.weights = len(reference.weights)
    self.sharded = sum(
        any(axis is not None for axis in layout_map[path].axes)
        for path in layout_map.keys())
    return keras.distribution.ModelParallel(
        layout_map=layout_map,
        batch_dim_name=self.batch_axis or self.device_mesh.axis_names[0])

  def batch_layout(self, shape):
    """A batch array's layout: split over the batch axis, if a rule says."""
    return keras.distribution.TensorLayout(
        (self.batch_axis,) + (None,) * (len(shape) - 1), self.device_mesh)

  def describe(self):
    across = (f" ({self.processes.describe()})" if self.processes else "")
    return (f"mesh {self.mesh_shape} on {self.spec.size} JAX devices{across}, "
            f"{self.sharded} of {self.weights} weights sharded")
