"""`thattn-train --strategy=dtensor`: the trainer's steps on a DTensor mesh.

    thattn-train --strategy=dtensor --mesh_shape=batch:2,model:2 \\
        --layout_rules="batch:batch;key_heads:model;value_heads:model;d_ff:model"

DTensor is not a `tf.distribute.Strategy` (see `thattn.training.strategies`):
its programs are global, one logical batch on one logical model whose
tensors are split over the mesh, so there are no replicas to run and no
per-replica losses to reduce. This module gives the trainer the same three
things a strategy gives it, the DTensor way:

- **Weights**: `DTensorDevices.build` builds the task's model with
  `thattn.sharding.build_sharded`: every weight is a `dtensor.DVariable`
  laid out by the rules from its logical axes, and the rules are checked
  against every weight (divisibility, one mesh axis per tensor, mesh axes
  that exist) before any weight is sharded or any step runs.
- **Optimizer state**: the optimizer is built with `mesh=`, the tf-keras
  hook for DTensor. A slot the shape of its variable (Adam's m and v,
  Adafactor's v and m) is made with `zeros_like(variable)` and so takes the
  variable's layout. Adafactor's factored slots (vr, vc: the variable's
  shape without one axis) are replicated: tf-keras copies any other initial
  value to a replicated layout, and they hold n + m floats for an n x m
  kernel, so replicating them costs little memory; DTensor inserts the
  collective that reduces a sharded gradient onto them.
- **Batches**: each batch comes from the task's (step-addressed)
  dataset on the host and is copied onto the mesh split along its first
  axis by the `batch` rule (replicated without one). A batch size the batch
  axis does not divide is refused before the first step.
- **Steps**: one global batch, so the loss is total / count with nothing to
  all-reduce; gradients are taken in one tf.function and applied in a
  second (see `DTensorTrainLoop`), dense.

Checkpoints are layout-agnostic. In TensorFlow 2.21 `tf.train.Checkpoint`
saves a DVariable as its full (global) tensor under the same key as an
ordinary variable, and restores either into either, on any mesh. So a
model_dir trained on one mesh resumes on another mesh or unsharded, and the
other way round, and `thattn-export` (an unsharded rebuild from the latest
checkpoint) exports a DTensor run like any other. The mesh is therefore not
part of `run_config.json`; each run writes the layouts it used to
`dtensor_layouts.json`.

What DTensor (TF 2.21) cannot run is refused before the first step, with
the layers named: dropout (stateful random ops; pretraining runs without
it, fine-tuning needs --dropout_rate=0) and tf-keras layer norms with
epsilon >= 1.001e-5 (FusedBatchNormV3; --task=recall's model has them).
TPUs are not supported. The mesh uses the local GPUs if there are enough,
else the CPUs; only CPUs are tested here. On a machine with one CPU device
and no GPU, `split_cpu` (called by thattn-train) makes the mesh's devices
as logical CPU devices, which share the CPU's cores: the sharded program
runs, with its communication, but no faster.

Multi-client (one mesh across processes or hosts): start the same command
once per client with TensorFlow's DTENSOR_CLIENT_ID, DTENSOR_NUM_CLIENTS,
DTENSOR_JOB_NAME and DTENSOR_JOBS; each client contributes its local
devices (mesh size / clients; `split_cpu` makes that many on a CPU) and
`connect_clients` joins the job before TensorFlow initializes. Every client
computes the same step-addressed global batch and copies it onto the mesh,
every client writes its shards of each checkpoint into the one model_dir,
and client 0 writes the rest of the run's files (`thattn.training.cluster`).
"""

import numbers

import tensorflow as tf
from tensorflow.experimental import dtensor

from thattn.core import requirements

# tf_keras loads on first use: the driver imports this module for its
# option checks on every backend, a keras3 run's included.
with requirements.lazy_imports("thattn.training.dtensor"):
  import tf_keras  # pylint: disable=g-import-not-at-top

from thattn import sharding
from thattn.training import devices
from thattn.io import run_dir
from thattn.training import cluster
from thattn.training import strategies

# tf-keras's LayerNormalization runs FusedBatchNormV3 from this epsilon up.
_FUSED_LAYER_NORM_EPSILON = 1.001e-5


def check_options(*, strategy, mesh_shape, layout_rules, tpu):
  """Parses and checks the DTensor options; None unless strategy is dtensor.

  Returns:
    (MeshSpec, LayoutRules) for --strategy=dtensor, else None.
  Raises:
    ValueError, naming the flags, for a mesh or rules without dtensor,
    dtensor without a mesh, malformed strings, rules naming mesh axes the
    mesh lacks, or --tpu.
  """
  if strategy != strategies.DTENSOR:
    given = [f"--{name}={value!r}" for name, value in (
        ("mesh_shape", mesh_shape), ("layout_rules", layout_rules))
             if value is not None]
    if given:
      verb = "apply" if len(given) > 1 else "applies"
      raise ValueError(f"{' and '.join(given)} {verb} only with "
                       f"--strategy=dtensor, got --strategy={strategy}; add "
                       "--strategy=dtensor or drop the layout flags.")
    return None
  if not mesh_shape:
    raise ValueError("--strategy=dtensor needs --mesh_shape, the mesh's axes "
                     "and sizes, e.g. --mesh_shape=batch:2,model:2 (4 "
                     "devices).")
  if tpu:
    raise ValueError(f"--tpu={tpu!r}: --strategy=dtensor runs on local CPUs "
                     "or GPUs only.")
  mesh_spec = sharding.MeshSpec.parse(mesh_shape)
  rules = sharding.LayoutRules.parse(layout_rules or
                                     sharding.DEFAULT_LAYOUT_RULES)
  rules.check_mesh(mesh_spec)
  return mesh_spec, rules


def split_cpu(mesh_shape):
  """Splits a lone CPU into the mesh's devices; returns how many were made.

  Logical devices can only be configured before TensorFlow initializes its
  devices, so the binary calls this first. Nothing is done (0) when there is
  a GPU, more than one CPU, a mesh of one device, or when TensorFlow has
  initialized already (then `make_mesh` explains what to do).
  """
  mesh_spec = sharding.MeshSpec.parse(mesh_shape)
  local = mesh_spec.size // num_clients()  # multi-client: this client's part
  cpus = tf.config.list_physical_devices("CPU")
  if (tf.config.list_physical_devices("GPU") or len(cpus) != 1 or
      local <= 1):
    return 0
  try:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * local)
  except RuntimeError:  # already initialized
    return 0
  return local


def connect_clients(timeout_seconds=300, log=print):
  """Joins this client to a multi-client DTensor job (DTENSOR_* variables),
  once every other client answers: ValueError naming those that did not
  within `timeout_seconds` (`cluster.wait_for_dtensor_clients`)."""
  cluster.wait_for_dtensor_clients(timeout_seconds, log)
  device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
  sharding.connect_clients(device_type)


def num_clients():
  """The clients of a multi-client DTensor job (DTENSOR_NUM_CLIENTS), or 1."""
  return cluster.dtensor_clients()[0]  # ValueError naming a bad variable


def _device_type(mesh_spec):
  gpus = tf.config.list_logical_devices("GPU")
  return "GPU" if len(gpus) >= mesh_spec.size else "CPU"


class _Model(tf.Module):
  """The task's backbone and head as one module, for build_sharded."""

  def __init__(self, task):
    super().__init__(name=None)
    self.layers = [layer for layer in (task.backbone, task.head)
                   if layer is not None]


class DTensorDevices(devices.Devices):
  """A mesh and layout rules: builds the task's model sharded, runs steps.

  The `thattn.training.devices.Devices` interface, on a DTensor mesh.
  """

  # T5Generator's caches and loop carry no layouts: no decoding metrics on
  # a mesh (span corruption reports its held-out loss alone there).
  decodes = False

  def __init__(self, options, model_dir):
    """Makes the mesh; checks the batch size against the batch axis.

    Raises ValueError before any model is built: too few devices for the
    mesh, or a batch size the batch axis does not divide.
    """
    self.mesh_spec, self.rules = check_options(
        strategy=options.strategy, mesh_shape=options.mesh_shape,
        layout_rules=options.layout_rules, tpu=options.tpu)
    make_mesh = (sharding.make_distributed_mesh if num_clients() > 1
                 else sharding.make_mesh)
    self.mesh = make_mesh(self.mesh_spec, _device_type(self.mesh_spec))
    sharding.plan_layouts(
        [(f"batch of --batch_size={options.batch_size}",
          [options.batch_size], [sharding.BATCH])],
        self.rules, self.mesh_spec)
    self.model_dir = model_dir
    self.num_weights = self.num_sharded = 0

  def describe(self):
    return (f"DTensor mesh {self.mesh_spec} on {self.mesh.device_type()} "
            f"devices, layout rules '{self.rules}': {self.num_sharded} of "
            f"{self.num_weights} weights sharded (see {run_dir.DTENSOR_LAYOUTS})")

  def build(self, task, make_optimizer, seed):
    """Builds the task's model sharded and the optimizer on the mesh.

    Args:
      task: an unbuilt `thattn.tasks.Task`. Its `build()` runs twice: once
        for an unsharded probe whose weights' shapes and logical axes the
        rules are checked against (so a bad rule fails before anything is
        sharded), then for the sharded model, which the task keeps
        (`sharding.build_sharded`).
      make_optimizer: `make_optimizer(mesh=...) -> (optimizer, schedule)`.
      seed: the run's seed; the probe's weights are drawn from it
        (`devices.build_task`), and the sharded model starts from them.
    Returns:
      (optimizer, schedule), the optimizer built with all of its slots.
    """
    probes = []

    def build_fn():
      if probes:
        task.build()  # the sharded weights start from the probe's values
      else:
        devices.build_task(task, seed)
      model = _Model(task)
      probes.append(model)
      # On the unsharded probe, before a sharded model is built and run.
      _check_layers(model, task.name)
      return model

    model, _ = sharding.build_sharded(build_fn, self.rules, self.mesh)
    optimizer, schedule = make_optimizer(mesh=self.mesh)
    optimizer.build(task.trainable_variables)
    layouts = {"mesh": str(self.mesh_spec), "layout_rules": str(self.rules),
               "weights": _specs(model.variables),
               "optimizer": _specs(optimizer.variables)}
    self.num_weights = len(layouts["weights"])
    self.num_sharded = sum(any(spec != dtensor.UNSHARDED for spec in specs)
                           for specs in layouts["weights"].values())
    run_dir.write_json(run_dir.path(self.model_dir, run_dir.DTENSOR_LAYOUTS),
                       layouts, sort_keys=True)
    return optimizer, schedule

  def place(self, batch):
    """Copies a host batch onto the mesh, split along axis 0 by `batch`."""
    return tf.nest.map_structure(
        lambda value: sharding.shard(value, self.mesh, self.rules,
                                     (sharding.BATCH,), "batch"), batch)

  def fetch(self, tensor):
    return sharding.to_numpy(tensor)

  def train_loop(self, task, optimizer, loss_scaling):
    return DTensorTrainLoop(self, task, optimizer, loss_scaling)


def _check_layers(model, task):
  """Refuses layers that DTensor (TF 2.21) cannot run, naming them.

  - Dropout draws stateful random numbers (tf.random.uniform), which DTensor
    refuses ("Stateful random operations are not supported").
  - tf-keras computes LayerNormalization with FusedBatchNormV3 when epsilon
    is at least 1.001e-5 (its default is 1e-3; --task=recall's
    RecallEncoder keeps it), and DTensor cannot lay that op out.
  Either would otherwise fail at the first step, deep inside the SPMD pass.
  """
  dropout = [f"{layer.name} ({_rate(layer):g})" for layer in model.submodules
             if _rate(layer)]
  fused = [f"{layer.name} (epsilon={layer.epsilon:g})"
           for layer in model.submodules
           if isinstance(layer, tf_keras.layers.LayerNormalization) and
           layer.epsilon >= _FUSED_LAYER_NORM_EPSILON]
  if dropout:
    raise ValueError(
        f"--task={task} with dropout cannot run under --strategy=dtensor: "
        f"dropout in {_some(dropout)} draws stateful random numbers, which "
        "DTensor does not support; pass --dropout_rate=0 (the pretraining "
        "default), or use another --strategy.")
  if fused:
    raise ValueError(
        f"--task={task} cannot run under --strategy=dtensor: the "
        f"tf-keras LayerNormalization layers {_some(fused)} would run "
        "FusedBatchNormV3, which DTensor cannot lay out (tf-keras uses it "
        f"when epsilon >= {_FUSED_LAYER_NORM_EPSILON:g}); use a model whose "
        "norms have a smaller epsilon (the BERT and ALBERT presets' 1e-12, "
        "T5's RMS norm), or another --strategy.")


def _rate(layer):
  """The dropout rate of a Keras Dropout or of a layer with dropout_rate."""
  if isinstance(layer, tf_keras.layers.Dropout):
    return layer.rate
  rate = getattr(layer, "dropout_rate", 0.0)
  return float(rate) if isinstance(rate, numbers.Real) else 0.0


def _some(names, shown=3):
  more = f" and {len(names) - shown} more" if len(names) > shown else ""
  return ", ".join(names[:shown]) + more


def _specs(variables):
  """{variable name: sharding specs (None: not a DVariable)}, for the file."""
  layouts = {variable.name: sharding.variable_layout(variable)
             for variable in variables}
  return {name: layout and list(layout.sharding_specs)
          for name, layout in layouts.items()}


class DTensorTrainLoop:
  """The compiled steps on the mesh; `devices.TrainLoop`'s interface."""

  def __init__(self, mesh_devices, task, optimizer, loss_scaling):
    self.devices = mesh_devices
    self.task = task
    self.optimizer = optimizer
    self.loss_scaling = loss_scaling
    self.variables = task.trainable_variables
    # Two compiled functions per step, not one: TF 2.21 DTensor loses
    # tf-keras Adam's weight updates when the gradients are taken in the
    # same tf.function (measured: every weight unchanged after a step while
    # Adam's m and v were right); applied in a second function they land.
    # No AutoGraph: see thattn.ops.autograph.
    self._gradients = tf.function(self._loss_and_gradients, autograph=False)
    self._apply = tf.function(self._apply_gradients, autograph=False)
    self.eval_step = tf.function(
        lambda batch: task.loss(batch, training=False), autograph=False)

  def distribute(self, dataset):
    """The dataset's batches, each placed on the mesh as it is read."""
    return (self.devices.place(batch) for batch in dataset)

  def train_step(self, iterator):
    loss, gradients = self._gradients(next(iterator))
    self._apply(gradients)
    return loss

  def _loss_and_gradients(self, batch):
    # One global batch: total / count is already the mean over every
    # weighted position, with no replicas to all-reduce across.
    with tf.GradientTape() as tape:
      total, count = self.task.loss(batch, training=True)
      loss = total / tf.maximum(count, 1.0)
      scaled = (self.optimizer.get_scaled_loss(loss) if self.loss_scaling
                else loss)
    gradients = tape.gradient(scaled, self.variables)
    # An embedding lookup's gradient is IndexedSlices, and Adam's sparse path
    # scatters into its slots (ResourceScatterAdd), an op DTensor cannot lay
    # out even for a replicated table; so every gradient goes in dense, as
    # Adafactor makes them anyway. (None: a weight the loss does not reach.)
    return loss, [None if gradient is None else tf.convert_to_tensor(gradient)
                  for gradient in gradients]

  def _apply_gradients(self, gradients):
    if self.loss_scaling:
      gradients = self.optimizer.get_unscaled_gradients(gradients)
    self.optimizer.apply_gradients(zip(gradients, self.variables))
