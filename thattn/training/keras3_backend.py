"""`thattn-train --backend=keras3`: the run driver's Keras 3 backend.

    KERAS_BACKEND=jax thattn-train --backend=keras3

`thattn.training.backend` documents the protocol; this adapter trains the
task's model as a Keras 3 model (`thattn.keras3.models`, on whatever
framework `keras.backend.backend()` is: JAX by default in `thattn-train`
where JAX is installed, else TensorFlow; PyTorch too), with the step of
`thattn.training.keras3_steps` (`jax.jit` over `stateless_call` on JAX).
It trains every task that gives its Keras 3 parts
(`thattn.tasks.base.Task.trains_on_keras3`): masked LM, span corruption,
classification, SQuAD and recall.

What it shares with the Keras backend, so that the two agree step for step:
- the task, its tokenizer and its step-addressed batches (tf.data, read as
  NumPy);
- the initial weights: the Keras 3 model draws its own from the run's seed
  by weight name (`thattn.keras3.models.initial_weights`), the values the
  Keras backend's tf_keras model draws (`thattn.models.initial_weights`);
  `--init_checkpoint`'s backbone is read into the Keras 3 backbone by
  checkpoint key (`thattn.io.checkpoint_reading`; a `tf.train` checkpoint
  through `thattn.keras3.models.loading`, which needs TensorFlow and
  tf_keras);
- the weights left untrained (frozen embeddings, the pooler in masked LM),
  named by the task's rule (`Task.trains_weight`);
- the optimizer and schedule (`thattn.keras3.optimizers`: thattn's
  Adafactor and inverse-square-root schedule in keras.ops; or Keras's Adam),
  and the loss (`keras3_steps.TaskLoss`).

Mixed precision (`--mixed_precision`): the Keras 3 model is made under
Keras 3's dtype policy `mixed_<dtype>` (`keras3_steps.dtype_policy`),
float32 weights and a bfloat16 or float16 computation, as the Keras
backend makes its model under tf_keras's (`Backend.framework_scope`);
float16 adds Keras 3's `LossScaleOptimizer`
(`make_optimizer`; `keras3_steps` says how a step uses it).

Checkpoints. A save writes the Keras 3 values themselves (`_Store`), and
the run builds no tf_keras model on any framework: the weights under their
shared names (`thattn.core.weight_names.checkpoint_key`), the optimizer's
variables (its `iteration` is the run's step), the random state (dropout's
seed generators), and the held-out loss at step 0, as a step folder
`checkpoints/N/`: with Orbax on JAX (`thattn.io.orbax_checkpoints`, whose
sharded writes span processes), and elsewhere as one safetensors file
(`thattn.io.safetensors_checkpoints`; Orbax needs JAX).
`thattn.io.checkpoint_reading` reads either into tf_keras objects for
`thattn-export`, `thattn.models.load`, `thattn-convert --to=mtf` and
`--init_checkpoint`, and `thattn.keras3.models.load` into Keras 3 without
TensorFlow. Nothing of tf_keras runs in a step, an evaluation, a save or
the task's metrics (the task's `metrics_of` reads the Keras 3 model's
`TaskLoss.metric_outputs`; span corruption decodes with the Keras 3
model).

Across processes (JAX): `processes` joins the JAX cluster the flags or
the environment name (`thattn.training.jax_processes`); process 0 owns
the model_dir, the others write their files to temporary folders and take
process 0's tokenizer; every process feeds its own rows of each batch
(`keras3_steps.Steps.inputs`) and writes its own shards of each Orbax
checkpoint; processes started with different settings are refused before
the first step (`agree`), and a SIGTERM on any of them stops all after one
agreed step, saved (`preempted`). docs/training.md, "Keras 3 on JAX across
processes and hosts".

Exact resume: the step is the data's whole state (as in every backend),
and the checkpoint holds every value the step reads, dropout's random
state included (the Keras backend cannot: tf-keras keeps it out of
checkpoints); on JAX's CPU backend a run killed and rerun ends with the
uninterrupted run's weights, with dropout on or off.
"""

import contextlib
import dataclasses
import math
import os
import tempfile

from etils import epath
import keras

from thattn import tasks
from thattn.io import checkpoint_reading
from thattn.io import orbax_checkpoints
from thattn.io import run_dir
from thattn.io import safetensors_checkpoints
from thattn.core import weight_names
from thattn.keras3 import optimizers as keras3_optimizers
from thattn.keras3.models import generation
from thattn.keras3.models import initial_weights
from thattn.keras3.models import loading
from thattn.training import backend as backend_lib
from thattn.training import jax_processes
from thattn.training import keras3_mesh
from thattn.training import keras3_steps
from thattn.training import optimizer as optimizer_lib

FRAMEWORKS = ("jax", "tensorflow", "torch")


def make_schedule(options):
  """The run's learning-rate schedule in `keras.ops`, as
  `optimizer_lib.make_schedule` makes tf_keras's."""
  return keras3_optimizers.InverseSqrtSchedule(
      **optimizer_lib.schedule_arguments(options))


def make_optimizer(options):
  """The Keras 3 optimizer of `options`, as `optimizer_lib.make_optimizer`
  makes the tf_keras one (float16: in Keras 3's `LossScaleOptimizer`, the
  dynamic loss scale that tf_keras's starts from too, 2**15)."""
  schedule = make_schedule(options)
  if options.optimizer == "adafactor":
    optimizer = keras3_optimizers.Adafactor(schedule)
  else:
    optimizer = keras.optimizers.Adam(schedule)
  if options.mixed_precision == "float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def framework_line(framework):
  """The run's first line: which framework Keras 3 runs on, and how to
  choose another."""
  return (f"Keras 3 backend: {framework} (KERAS_BACKEND; thattn-train picks "
          f"jax where it is installed, else tensorflow; set "
          f"KERAS_BACKEND={' or '.join(FRAMEWORKS)} to choose).")


def _state_key(kind, index, variable):
  """A checkpoint key for one variable of the run's Keras 3 state: its kind
  and index, and for the optimizer's its path (paths alone repeat: Keras
  names a slot after its variable's own name, and two layers' `embeddings`
  share it). A seed generator's path is numbered by how many the process
  made before it (a mesh run makes a model twice), so it is left out."""
  if kind == "random":
    return f"{kind}.{index:04d}"
  return f"{kind}.{index:04d}.{variable.path.replace('/', '.')}"


@backend_lib.register
class Keras3Backend(backend_lib.Backend):
  """Keras 3 on KERAS_BACKEND's framework; see the module."""

  name = run_dir.KERAS3
  feeds_learning_rate = False  # the optimizer's schedule, in the step

  @classmethod
  def schedule(cls, options):
    return make_schedule(options)

  @classmethod
  def check_task(cls, task_class, model):
    del model
    if not task_class.trains_on_keras3():
      trained = [name for name in tasks.names()
                 if tasks.get(name).trains_on_keras3()]
      raise ValueError(f"--backend=keras3 trains the tasks "
                       f"{', '.join(trained)}; --task="
                       f"{task_class.name} trains with --backend=keras.")

  @classmethod
  def framework_scope(cls, options):
    """None of tf_keras's: Keras 3's seed and dtype policy are set in
    `build` (`keras.utils.set_random_seed`, `keras3_steps.dtype_policy`)."""
    del options
    return contextlib.nullcontext()

  @classmethod
  @contextlib.contextmanager
  def processes(cls, model_dir, options, log):
    """Joins the JAX cluster the options or the environment name
    (`jax_processes`); process 0 owns the model_dir, the others write
    their files to temporary folders (their checkpoint shards go to the
    model_dir's checkpoints, with process 0's)."""
    if jax_processes.wanted(options) and keras.backend.backend() != "jax":
      raise ValueError(
          "--backend=keras3 across processes runs on JAX's distributed "
          f"runtime: set KERAS_BACKEND=jax (got {keras.backend.backend()}).")
    with jax_processes.joined(options, log) as processes:
      # The flags first (a batch size one process cannot split would stop
      # it alone); the run config (model, data, tokenizer) once the task
      # is made (`agree`).
      jax_processes.check_same_run(
          {key: value for key, value in dataclasses.asdict(options).items()
           if key != "process_id"}, processes)
      if processes is None or processes.chief:
        yield backend_lib.Place(model_dir, processes, chief=True)
        return
      with tempfile.TemporaryDirectory(
          prefix=f"thattn-process{processes.index}-") as folder:
        yield backend_lib.Place(folder, processes, chief=False)

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.framework = keras.backend.backend()
    if self.framework not in FRAMEWORKS:
      raise ValueError(f"--backend=keras3 runs on KERAS_BACKEND "
                       f"{', '.join(FRAMEWORKS)}; got {self.framework!r}.")
    self.log(framework_line(self.framework))
    self.task = self.loss_layer = self.steps = self.store = None
    self.state, self._step = {}, 0
    self.processes = self.place.state  # jax_processes.Processes, or None
    # Devices before any data is read: a mesh JAX cannot make fails here.
    self.mesh = (keras3_mesh.KerasMesh(self.options, self.processes)
                 if self.options.mesh_shape or self.processes else None)
    if self.mesh:
      self.mesh.check_batch_size(self.options.batch_size)
    self._initial_eval = float("nan")
    self.preemption = jax_processes.Preemption(self.processes)

  def make_task(self, make):
    """Across processes, process 0 makes the task first (its tokenizer
    learned or loaded, and saved in the model_dir), and the others take
    that tokenizer: every process tokenizes alike."""
    if self.processes is None:
      return make(None)
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    if self.processes.chief:
      task = make(None)
      multihost_utils.sync_global_devices("thattn: the chief's tokenizer")
      return task
    multihost_utils.sync_global_devices("thattn: the chief's tokenizer")
    return make(run_dir.path(self.model_dir, run_dir.TOKENIZER))

  def agree(self, settings, check):
    """Across processes: the same settings everywhere, and run_config.json's
    check (process 0's) refusing on every process alike."""
    jax_processes.check_same_run(settings, self.processes)
    jax_processes.everywhere(check, self.processes)

  def preempted(self):
    return self.preemption.reached(self._step)

  def build(self, task):
    """The Keras 3 model with its weights drawn from the run's seed (the
    task's rule leaving some untrained), the optimizer with its slots, and
    the checkpoints of them."""
    self.task = task
    # Keras 3's seed (its dropout layers' seed generators). Keras's
    # set_random_seed reseeds TensorFlow too, to the seed the driver set.
    keras.utils.set_random_seed(self.options.seed)
    with keras3_steps.dtype_policy(self.options.mixed_precision), (
        self._layout()):
      self.loss_layer = self._task_loss()
      initial_weights.assign([self.loss_layer], self.options.seed)
      for weight in self.weights:
        weight.trainable = task.trains_weight(weight.path)
      self.steps = keras3_steps.Steps(
          self.loss_layer, make_optimizer(self.options),
          batch_layout=self.mesh.batch_layout if self.mesh else None)
    self.state = self._state()
    self.store = _Store(self, run_dir.path(self.model_dir,
                                           run_dir.CHECKPOINTS))

  def _state(self):
    """{checkpoint key: Keras 3 variable} of what the run holds beside the
    weights: the optimizer's variables (its iteration is the step) and the
    random state (dropout's seed generators), so that a resumed run draws
    the uninterrupted run's dropout masks."""
    weights = {id(weight) for weight in self.weights}
    randoms = [variable for variable in self.loss_layer.non_trainable_variables
               if id(variable) not in weights]
    state = {}
    for kind, variables in (("optimizer", self.steps.optimizer.variables),
                            ("random", randoms)):
      for index, variable in enumerate(variables):
        state[_state_key(kind, index, variable)] = variable
    return state

  @property
  def weights(self):
    """The Keras 3 model's and head's weights, each once (the masked-LM
    head's table is the backbone's)."""
    return list({id(weight): weight
                 for weight in self.loss_layer.weights}.values())

  def _task_loss(self):
    """The Keras 3 model, head and loss of the task, made as its
    `keras3_options` say (the two front ends' classes take the same
    keywords)."""
    return keras3_steps.TaskLoss(type(self.task),
                                 **self.task.keras3_options())

  def _layout(self):
    """The scope the model and optimizer are made in: on a mesh, the
    `ModelParallel` distribution of the model's layout (read from a first,
    unsharded build); else none."""
    if self.mesh is None:
      return contextlib.nullcontext()
    return self.mesh.distribution(self._task_loss()).scope()

  def _reloaded(self):
    """After the Keras 3 variables changed: the compiled step reads them,
    and the step count is the optimizer's."""
    self.steps.reload()
    self._step = int(keras.ops.convert_to_numpy(
        self.steps.optimizer.iterations))

  def checkpoints(self):
    return self.store.checkpoints()

  def restore(self, path):
    self.store.restore(path)
    self._reloaded()

  def initialize(self, init_checkpoint=None):
    """The drawn weights (`build`), the backbone's from `init_checkpoint`
    if given (by checkpoint key, `_read_backbone`)."""
    if init_checkpoint:
      self._read_backbone(init_checkpoint)
    self._reloaded()

  def _read_backbone(self, checkpoint):
    """The Keras 3 backbone's weights from `checkpoint`, by checkpoint key.

    A step folder (a keras3 run's) must hold every backbone weight (as
    `checkpoint_reading.restore` asks on the Keras backend); a `tf.train`
    checkpoint (a Keras run's, a conversion's, an earlier thattn's keras3
    run on TensorFlow or PyTorch) is read through its run's tf_keras
    backbone (`loading.tf_train_values`), and a weight it does not hold
    keeps its drawn value, as a `tf.train` restore leaves it on the Keras
    backend."""
    backbone = self.loss_layer.backbone
    weights = list({id(w): w for w in backbone.weights}.values())
    owner = f"the {self.task.model_options.preset} backbone"
    if checkpoint_reading.is_step(checkpoint):
      checkpoint_reading.assign_by_name(
          checkpoint, checkpoint_reading.read_step(checkpoint), weights,
          [weight.path for weight in weights], owner)
      return
    values = loading.tf_train_values(run_dir.run_dir_of(checkpoint),
                                     checkpoint)
    held = [weight for weight in weights
            if weight_names.checkpoint_key(weight.path) in values]
    checkpoint_reading.assign_by_name(checkpoint, values, held,
                                      [weight.path for weight in held], owner)

  @property
  def step(self):
    return self._step  # kept here: no read of the compiled state per step

  @property
  def initial_eval(self):
    return self._initial_eval

  def set_initial_eval(self, value):
    self._initial_eval = float(value)

  def train_batches(self, start_step):
    return self.task.train_dataset(start_step).as_numpy_iterator()

  def train_step(self, batches, learning_rate):
    del learning_rate  # None: the optimizer's own schedule gives the rate
    loss = self.steps.train_step(next(batches))
    self._step += 1
    return loss

  def evaluate(self, batches):
    return self.steps.evaluate(batches)

  def task_metrics(self, num_steps):
    """The task's metrics, from the Keras 3 model: its metric outputs
    (`TaskLoss.metric_outputs`, compiled as the steps are) read by the
    task's `metrics_of`; span corruption's, by the Keras 3 model's own
    greedy decoding."""
    if self.task.decoding_metrics is not None:
      self.steps.sync()  # the generator reads the Keras 3 variables
      generator = generation.T5Generator(
          self.loss_layer.backbone, max_length=self.task.targets_length,
          eos_id=self.task.tokenizer.special.eos)

      def generate(inputs):
        return keras3_steps.whole_value(generator(inputs)["tokens"])
      return self.task.decoding_metrics(generate)
    if not self.task.has_metrics:
      return {}
    return self.task.metrics_of(self.steps.predict, num_steps)

  def save(self):
    self.steps.sync()
    return self.store.save(self.step)

  def latest_checkpoint(self):
    return self.store.latest()

  def checkpoint_directory(self):
    return self.store.directory

  def close(self):
    self.preemption.close()
    if self.store is not None:
      self.store.close()

  def parameters(self):
    """(model parameters, of which in the backbone), of the Keras 3 model
    and head, each weight once."""
    total = sum(math.prod(weight.shape) for weight in self.weights)
    return total, self.loss_layer.backbone.count_params()

  def describe(self):
    return backend_lib.describe_run(
        self.task, self.options,
        [tuple(v.shape) for v in self.loss_layer.trainable_variables],
        self.mesh.describe() if self.mesh else _devices(),
        engine=f"Keras 3 on {self.framework}{_precision(self.loss_layer)}",
        parameters=self.parameters())


class _Store:
  """A keras3 run's checkpoints: step folders of its Keras 3 values, each
  weight under its `weight_names.checkpoint_key`, beside the optimizer's
  and random state's keys; the held-out loss at step 0 in the step's meta.
  Orbax's on JAX (`orbax_checkpoints.RunCheckpoints`), safetensors'
  elsewhere (`safetensors_checkpoints.RunCheckpoints`, the same methods).

  Saved synchronously: the driver prints a step's progress line after its
  save, as the promise that the step is kept (thattn.training.run), which
  an asynchronous save would break; and on 2 CPU cores an asynchronous
  save's background write slows the steps it overlaps about as much as it
  saves (benchmarks/RESULTS.md, "Saving a keras3 run")."""

  def __init__(self, backend, directory):
    on_jax = backend.framework == "jax"
    _refuse_other_checkpoints(directory, on_jax)
    self.backend, self.directory = backend, directory
    self.values = {weight_names.checkpoint_key(weight.path): weight
                   for weight in backend.weights}
    self.values.update(backend.state)
    writer = (orbax_checkpoints if on_jax else safetensors_checkpoints)
    self.run = writer.RunCheckpoints(
        directory, max_to_keep=backend.options.max_checkpoints)

  def checkpoints(self):
    return [self.run.path(step) for step in self.run.steps()]

  def latest(self):
    step = self.run.latest_step()
    return None if step is None else self.run.path(step)

  def save(self, step):
    initial = self.backend.initial_eval
    return self.run.save(step, self.values, meta={
        "initial_eval": None if math.isnan(initial) else initial})

  def restore(self, path):
    meta = self.run.restore(checkpoint_reading.step_of(path), self.values)
    initial = meta.get("initial_eval")
    self.backend.set_initial_eval(float("nan") if initial is None else
                                  initial)

  def close(self):
    self.run.close()  # an asynchronous save finishes first


def _refuse_other_checkpoints(directory, on_jax):
  """ValueError, changing nothing, when `directory` holds checkpoints this
  run's writer does not read: TensorFlow checkpoints (a keras3 run of an
  earlier thattn, which saved through a tf_keras twin), or step folders
  of the other writer (the run was made on another Keras 3 framework)."""
  run = os.path.dirname(directory)
  found = checkpoint_reading.steps(directory)
  if epath.Path(directory, checkpoint_reading.TF_CHECKPOINT_STATE).exists():
    made_by = ("TensorFlow checkpoints of a keras3 run made by an earlier "
               "thattn, which saved through a tf_keras twin")
  elif found and checkpoint_reading.is_orbax_step(found[-1]) != on_jax:
    made_by = ("Orbax checkpoints of a keras3 run on JAX" if not on_jax else
               "safetensors checkpoints of a keras3 run on TensorFlow or "
               "PyTorch")
  else:
    return
  here = ("Orbax checkpoints on JAX" if on_jax else
          "safetensors checkpoints on TensorFlow and PyTorch")
  raise ValueError(
      f"{directory} holds {made_by}; this run saves {here} and will not mix "
      f"them. Resume it on the framework that made it (KERAS_BACKEND), or "
      f"start a new --model_dir with --init_checkpoint={run} to go on from "
      "its weights (thattn-export, thattn.models.load and --init_checkpoint "
      "read every kind; nothing was changed).")


def _precision(loss_layer):
  """For the log: ", <policy> (<compute> compute, <dtype> weights)" when
  the model is not in float32 (read from the model itself)."""
  model = loss_layer.backbone
  if model.dtype_policy.name == "float32":
    return ""
  weights = sorted({keras.backend.standardize_dtype(v.dtype)
                    for v in loss_layer.trainable_variables})
  return (f", {model.dtype_policy.name} ({model.compute_dtype} compute, "
          f"{'/'.join(weights)} weights)")


def _devices():
  """The devices Keras 3 sees, for the log (keras.distribution knows them
  on JAX; elsewhere the framework's default device)."""
  try:
    devices = keras.distribution.list_devices()
  except (AttributeError, NotImplementedError):  # not on this framework
    return "its default device"
  return f"{len(devices)} device(s)"
