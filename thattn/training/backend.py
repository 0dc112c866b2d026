"""The protocol between the run driver and a backend, and the backends' registry.

The driver (`thattn.training.run`) owns everything two backends would
otherwise each repeat: the step loop, the schedule, evaluation every
`eval_every` steps, progress lines and summaries, summary.json, the one
resume policy, the run lock. A backend owns only where the model lives and
how one step runs. It is a `Backend` subclass, registered by name:

| when | member | what it does |
|---|---|---|
| before a run | `check_task(task_class, model)` | refuse a task or model it has no model for (ValueError) |
| | `logical_devices(options)` | whether the binary must split the CPU for `options.mesh_shape` |
| | `serve(model_dir, options, log)` | a process that only serves another's run: its result; else None |
| | `processes(model_dir, options, log)` | context manager around the run: yields its `Place` (the folder this process writes, and what the backend's processes hold) |
| | `framework_scope(options)` | context manager around the run: the framework's seed and dtype policy its model is made under (tf_keras's by default) |
| | `schedule(options)` | the learning-rate schedule its optimizer follows, `step -> rate` (tf_keras's by default) |
| | `model_dir_for_export(model_dir, temp_dir, log)` | a model_dir `thattn.export` reads (mtf: converted) |
| one run | `Backend(model_dir=, place=, options=, log=)` | devices, before any data is read |
| | `build(task)` | the model (and optimizer) for the built task |
| | `checkpoints()` | the run's checkpoint paths, oldest first |
| | `restore(path)` | every variable from `path` (raises on a damaged one) |
| | `initialize(init_checkpoint)` | a fresh start, from the weights `build` drew from the run's seed, with `init_checkpoint`'s backbone if given |
| | `step` | steps trained, as the next checkpoint saves it |
| | `initial_eval`, `set_initial_eval(value)` | the held-out loss at step 0, kept in the checkpoints |
| | `train_batches(start_step)` | what `train_step` reads its batches from |
| | `train_step(batches, learning_rate)` | one step on the next batch; the mean loss (float) |
| | `evaluate(batches)` | mean held-out loss over a dataset of the task's batches |
| | `task_metrics(num_steps)` | the task's `extra_eval_metrics` on the trained weights |
| | `save()` | a checkpoint at `step`; its path |
| | `latest_checkpoint()` | the newest checkpoint's path, or None |
| | `parameters()` | (model parameters, of which in the backbone), of the model it trains |
| | `describe()` | one log line: model, optimizer, devices |
| | `make_task(make)` | the run's task, `make(tokenizer_dir)`: across processes, every one takes the chief's tokenizer |
| | `agree(settings, check)` | `check()` (run_config.json's), and across processes the refusal of differing `settings` (the run config) |
| | `preempted()` | after a step: whether a SIGTERM asks the run to save and stop |
| | `close()` | release sessions and scopes (the driver calls it) |

`train_step` takes the schedule's learning rate at the step before the
update, as Mesh TensorFlow feeds it, where the backend's `feeds_learning_rate`
is True; the Keras backend's optimizer computes the same rate from its own
schedule inside the compiled step, so it says False and gets None (the
driver then runs no schedule ops of its own between steps).

Backends are found by name (`get`). The Keras backend is
`thattn.training.keras_backend`, the Keras 3 one
`thattn.training.keras3_backend` (imported only when asked for); the Mesh TensorFlow one,
`thattn.mtf.training`, lives above this package and registers itself when
imported: `get("mtf")` imports it by module name on first use, so a Keras
run never imports Mesh TensorFlow, and this package names no code above it.
"""

import abc
import contextlib
import dataclasses
import importlib
import math

from thattn.core import requirements

_REGISTRY = {}
# Where each built-in backend registers itself (imported on first `get`).
_MODULES = {"keras": "thattn.training.keras_backend",
            "keras3": "thattn.training.keras3_backend",
            "mtf": "thattn.mtf.training"}
# What pip installs for the Mesh TensorFlow backend (setup.py's extra).
MTF_EXTRA = requirements.install_command("mtf")


@dataclasses.dataclass(frozen=True)
class Place:
  """Where one process of a run writes, and what its backend holds there.

  write_dir: model_dir, but for the processes of a cluster that are not
    its chief (their own temporary folders). state: the backend's own (mtf:
    the chief's server of a TF_CONFIG cluster; keras3: its JAX
    `Processes`), None by default. chief: whether this process owns the
    model_dir (its lock, its files); None: as TF_CONFIG or DTENSOR_* say
    (`thattn.training.cluster.is_chief`).
  """
  write_dir: str
  state: object = None
  chief: bool = None


def register(backend_class):
  """Class decorator: makes `backend_class` `get(backend_class.name)`."""
  _REGISTRY[backend_class.name] = backend_class
  return backend_class


def get(name):
  """The backend class registered as `name`, imported on first use."""
  if name not in _REGISTRY and name in _MODULES:
    try:
      importlib.import_module(_MODULES[name])
    except ImportError as error:
      if name != "mtf":
        raise
      raise ValueError(f"--backend={name} needs Mesh TensorFlow, which is "
                       f"not installed ({error}); {MTF_EXTRA}.") from None
  if name not in _REGISTRY:
    raise ValueError(f"Unknown backend {name!r}; expected one of "
                     f"{', '.join(sorted(set(_MODULES) | set(_REGISTRY)))}.")
  return _REGISTRY[name]


def describe_run(task, options, shapes, devices, engine=None,
                 parameters=None):
  """The one log line every backend's `describe` gives: the task and its
  model (`parameters`, (total, backbone), of the model the backend trains;
  by default the task's tf_keras model's), what trains it (`engine`, if the
  backend names one), the trained variables (`shapes`), the optimizer and
  `devices`.

  The trained parameters can be fewer than the model's
  (`task.parameters()`): frozen embeddings and weights the loss never
  reaches (BERT's pooler in masked LM) are left out.
  """
  trained = sum(math.prod(shape) for shape in shapes)
  parameters = parameters or task.parameters()
  untrained = parameters[0] - trained
  left_out = (f" ({untrained:,} frozen or unused by the loss)" if untrained
              else "")
  engine = f"{engine}, " if engine else ""
  return (f"{task.describe(parameters)}; {engine}trained: "
          f"{len(shapes)} tensors, {trained:,} parameters{left_out}; "
          f"{options.optimizer}, peak learning rate "
          f"{options.peak_learning_rate:g}; {devices}.")


class Backend(abc.ABC):
  """One backend of the driver; see the module for the protocol."""

  name = None
  feeds_learning_rate = True  # see the module

  @classmethod
  def check_task(cls, task_class, model):
    """Raises ValueError for a task or model this backend cannot train."""
    del task_class, model  # the Keras backend trains every task

  @classmethod
  def logical_devices(cls, options):
    """Whether this process needs `options.mesh_shape` logical CPUs."""
    del options
    return False

  @classmethod
  def serve(cls, model_dir, options, log):
    """Serves another process's run and returns its result, or None."""
    del model_dir, options, log
    return None

  @classmethod
  def processes(cls, model_dir, options, log):
    """Context manager around a run; yields its `Place`."""
    del options, log
    return contextlib.nullcontext(Place(model_dir))

  @classmethod
  @contextlib.contextmanager
  def framework_scope(cls, options):
    """Context manager around a run: the framework state its model is made
    under. By default tf_keras's: its seed (`set_random_seed`, which also
    seeds Python, NumPy and TensorFlow) and its global dtype policy,
    `mixed_<dtype>` for `options.mixed_precision` (float32 weights, a
    half-precision computation), restored afterwards. A backend whose
    model is not tf_keras's sets its own."""
    import tf_keras  # pylint: disable=g-import-not-at-top
    tf_keras.utils.set_random_seed(options.seed)
    previous = tf_keras.mixed_precision.global_policy()
    if options.mixed_precision != "off":
      tf_keras.mixed_precision.set_global_policy(
          f"mixed_{options.mixed_precision}")
    try:
      yield
    finally:
      tf_keras.mixed_precision.set_global_policy(previous)

  @classmethod
  def schedule(cls, options):
    """The run's learning-rate schedule, `step -> rate`, the one the
    backend's optimizer follows: the driver feeds it where
    `feeds_learning_rate` and logs it always. By default tf_keras's
    (`optimizer_lib.make_schedule`)."""
    from thattn.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top
    return optimizer_lib.make_schedule(options)

  @classmethod
  def model_dir_for_export(cls, model_dir, temp_dir, log):
    """A model_dir that `thattn.export.export` reads, for a run of ours."""
    del temp_dir, log
    return model_dir

  def __init__(self, *, model_dir, place, options, log):
    self.model_dir, self.place, self.write_dir = (model_dir, place,
                                                  place.write_dir)
    self.options, self.log = options, log

  @abc.abstractmethod
  def build(self, task):
    """Builds the model (and optimizer) of `task`, an unbuilt task."""

  @abc.abstractmethod
  def checkpoints(self):
    """The paths of the checkpoints a run resumes from, oldest first."""

  @abc.abstractmethod
  def restore(self, path):
    """Restores every variable from `path`; raises if it cannot."""

  @abc.abstractmethod
  def initialize(self, init_checkpoint=None):
    """Starts from the weights `build` drew from the run's seed, the
    backbone's read from `init_checkpoint` (a checkpoint path) if given."""

  def parameters(self):
    """(model parameters, of which in the backbone) of the model the backend
    trains, each weight once; by default the task's tf_keras model's."""
    return self.task.parameters()

  @property
  @abc.abstractmethod
  def step(self):
    """Steps trained so far."""

  @property
  @abc.abstractmethod
  def initial_eval(self):
    """The held-out loss at step 0 (NaN until set), saved with the run."""

  @abc.abstractmethod
  def set_initial_eval(self, value):
    """Sets `initial_eval`."""

  @abc.abstractmethod
  def train_batches(self, start_step):
    """What `train_step` reads from: the task's batches from start_step."""

  @abc.abstractmethod
  def train_step(self, batches, learning_rate):
    """Trains on the next batch of `batches`; returns its mean loss."""

  @abc.abstractmethod
  def evaluate(self, batches):
    """Mean loss over every weighted position of `batches` (a dataset)."""

  @abc.abstractmethod
  def task_metrics(self, num_steps):
    """The task's extra held-out metrics, {name: float}."""

  @abc.abstractmethod
  def save(self):
    """Saves a checkpoint numbered `step`; returns its path."""

  @abc.abstractmethod
  def latest_checkpoint(self):
    """The newest checkpoint's path, or None."""

  @abc.abstractmethod
  def checkpoint_directory(self):
    """The folder `save` writes this process's checkpoints into."""

  @abc.abstractmethod
  def describe(self):
    """One log line: the model, what is trained, optimizer, devices."""

  def make_task(self, make):
    """The run's task: `make(tokenizer_dir)`, where tokenizer_dir (None
    here) is a tokenizer every process of the run must take."""
    return make(None)

  def agree(self, settings, check):
    """Runs `check()`, which raises ValueError for settings the model_dir's
    run refuses; a backend whose processes must agree also refuses
    processes whose `settings` (a JSON-able dict) differ."""
    del settings
    check()

  def preempted(self):
    """Whether, after the step just trained, the run saves and stops (a
    SIGTERM); the driver asks after every step."""
    return False

  def close(self):
    """Releases what the backend holds (sessions, scopes)."""
