"""`thattn-train --backend=mtf`: thattn's T5 runs trained in Mesh TensorFlow.

    summary = training.train(
        model_dir="runs/t5_mtf", task="span_corruption",
        options=TrainOptions(backend="mtf", mesh_shape="batch:2,model:2"))

The model is mtf's own (`mesh_tensorflow.transformer`): a `Bitransformer`
for span corruption, an aligned `Unitransformer` for masked LM on a T5
encoder (`t5_tiny_encoder`), built from the gin config that
`thattn.mtf.architecture.gin_text` writes for the run's T5Config, and trained by a plain `tf.compat.v1` session loop
(TensorFlow 2.21 has no TPUEstimator) on `PlacementMeshImpl`: one device,
or `options.mesh_shape` logical CPUs laid out by `options.layout_rules`
(thattn's one rules table; the binary splits the CPU before TensorFlow
starts). The step's graph is `thattn.mtf.training_graph`'s.

This module is the Mesh TensorFlow adapter of the run driver
(`thattn.training.run`; the protocol is `thattn.training.backend`'s): the
driver runs the step loop, evaluation, progress lines, summaries,
summary.json, the resume policy and the lock for both backends, so that the
two are interchangeable and agree step for step. Shared with the Keras
backend too:
- the task, its tokenizer and its step-addressed batches (the task turns
  them into mtf's inputs and targets: `Task.inputs_and_targets`), and
  run_config.json (with "backend": "mtf");
- the initial weights: the task builds its Keras backbone under the run's
  seed, exactly as the Keras backend does, and `thattn.mtf.model_map`
  converts them (or, with `init_checkpoint`, that run's backbone);
- the loss, the optimizer and the schedule (see `training_graph`).

The model_dir is an mtf model_dir: `operative_config.gin` and TF1
checkpoints `model.ckpt-N` (the master variables under T5's names,
Adafactor's `<name>_slot_v*`, `global_step`), which `thattn-convert` takes
to Keras; beside them thattn's run_config.json, tokenizer/ and summaries.
`export` serves it through that conversion.

Departures, refused or documented: T5 models only (BERT and ALBERT have
no mtf model here); float32, Adafactor, no dropout.
Adafactor factors a weight's second moment over its two largest axes, and
mtf's multi-head SelfAttention keeps q, k, v, o combined ([d_model,
heads * d_kv]) where Keras keeps [d_model, heads, d_kv]: where an axis
reaches 128, the two backends factor those weights differently (both are
Adafactor; their steps differ slightly).
"""

import contextlib
import os

import tensorflow as tf

from thattn import export as export_lib
from thattn import models
from thattn.models import wiring
from thattn.io import checkpoint_reading
from thattn.io import run_dir
from thattn.io import staged_writes
from thattn import tasks
from thattn.mtf import architecture
from thattn.mtf import cluster as cluster_lib
from thattn.mtf import convert
from thattn.mtf import model_map
from thattn.mtf import models as mtf_models
from thattn.mtf import session as session_lib
from thattn.mtf import training_graph
from thattn.training import backend as backend_lib
from thattn.training import devices as devices_lib
from thattn.training import options as options_lib
from thattn.training import run


def train(*, model_dir, task="span_corruption", model=None, data=None,
          options=None, log=print):
  """Trains a T5 in Mesh TensorFlow (span corruption, or masked LM on a T5
  encoder); returns the summary.

  The run driver's `train` (`thattn.training.run`) with this backend.

  Args: as `thattn.training.run.train`, with `options.backend == "mtf"`.
  Raises:
    ValueError for a task or model this backend cannot train, bad mesh or
    rules (naming the variable and sizes), or a model_dir of another run.
  """
  options = options or options_lib.TrainOptions(backend=options_lib.MTF)
  if options.backend != options_lib.MTF:
    raise ValueError(f"backend={options.backend!r}; this trainer is "
                     "--backend=mtf's.")
  return run.train(model_dir=model_dir, task=task, model=model, data=data,
                   options=options, log=log)


def _mesh_size(processes, options):
  if options.mesh_shape is None:
    raise ValueError(
        f"--backend=mtf over the {len(processes.tasks)} tasks of TF_CONFIG "
        "needs --mesh_shape (and --layout_rules) to place the model on "
        "their devices.")
  return options.mtf_mesh()[0].size


@contextlib.contextmanager
def _chief_server(processes, options, log):
  """The chief's server (None in one process), started before anything
  can fail, and the serving tasks told when the run ends, however it
  ends."""
  if processes is None:
    yield None
    return
  server = cluster_lib.start_server(processes, _mesh_size(processes, options),
                                    options.cluster_timeout, log)
  finished = False
  try:
    yield server
    finished = True
  except tf.errors.UnavailableError as error:  # a serving task was lost
    raise cluster_lib.lost_tasks(processes, error) from error
  finally:
    cluster_lib.end_run(processes, server, finished, log)


def _placement(processes, server, options):
  """Where the step graph runs: this process, or the cluster's devices."""
  if processes is None:
    return session_lib.Placement()
  return session_lib.Placement(
      target=server.target,
      devices=tuple(processes.mesh_devices(_mesh_size(processes, options))),
      client_device=processes.device(processes.chief))


def _check_or_write_gin(model_dir, gin_text):
  path = os.path.join(model_dir, mtf_models.OPERATIVE_CONFIG)
  if not tf.io.gfile.exists(path):
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(gin_text)
  elif mtf_models.read_operative_config(model_dir) != gin_text:
    raise ValueError(f"{path} describes another model than this run's; use "
                     "a new --model_dir, or the flags of the run there.")


@contextlib.contextmanager
def _quiet_tensorflow_logger():
  """Hides warnings of TensorFlow's logger (mtf's) inside the block."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel("ERROR")
  try:
    yield
  finally:
    logger.setLevel(level)


@backend_lib.register
class MtfBackend(backend_lib.Backend):
  """Mesh TensorFlow's model in a TF1 session; see the module."""

  name = options_lib.MTF

  @classmethod
  def check_task(cls, task_class, model):
    """Refuses tasks and models that have no mtf model here."""
    config = (models.model_config(model.preset, **model.overrides)
              if model.preset else None)
    if not task_class.mtf_trains(config):
      trains = "; ".join(f"--task={name} with {tasks.get(name).mtf_model}"
                         for name in tasks.names()
                         if tasks.get(name).mtf_model)
      raise ValueError(f"--backend=mtf trains T5 models ({trains}); "
                       f"--task={task_class.name} with preset "
                       f"{model.preset!r} has no Mesh TensorFlow model here.")
    # The held-out loss is read from the training graph, which is exact
    # only without dropout (the paper's pretraining recipe).
    if config.dropout_rate:
      raise ValueError(f"--backend=mtf trains without dropout, got "
                       f"dropout_rate={config.dropout_rate}; pass "
                       "--dropout_rate=0.")

  @classmethod
  def logical_devices(cls, options):
    # Over a TF_CONFIG cluster each task's server brings its own devices
    # (thattn.mtf.cluster).
    del options
    return cluster_lib.from_tf_config() is None

  @classmethod
  def serve(cls, model_dir, options, log):
    """A task other than the chief: its devices serve the chief's steps."""
    processes = cluster_lib.from_tf_config()
    if processes is None or processes.is_chief:
      return None
    server = cluster_lib.start_server(
        processes, _mesh_size(processes, options), options.cluster_timeout,
        log)
    cluster_lib.serve(processes, server, log)
    return {"served": processes.name(), "model_dir": model_dir}

  @classmethod
  @contextlib.contextmanager
  def processes(cls, model_dir, options, log):
    processes = cluster_lib.from_tf_config()
    with _chief_server(processes, options, log) as server:
      yield backend_lib.Place(model_dir,
                              _placement(processes, server, options))

  @classmethod
  def model_dir_for_export(cls, model_dir, temp_dir, log):
    """The newest checkpoint converted to a thattn model_dir in temp_dir
    (`thattn.mtf.convert.mtf_to_thattn`, with the run's tokenizer and
    sequence length)."""
    config = run_dir.read_run_config(model_dir)
    keras_dir = os.path.join(temp_dir, "run")
    convert.mtf_to_thattn(
        mtf_model_dir=model_dir, model_dir=keras_dir,
        vocabulary=run_dir.path(model_dir, run_dir.TOKENIZER),
        sequence_length=config["sequence_length"], task=config["task"],
        log=log)
    return keras_dir

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.task = self.gin_text = self.model = self.session = None
    self._step = 0
    self._scopes = contextlib.ExitStack()

  def build(self, task):
    """The gin config (checked against the model_dir's) and the task's
    Keras backbone, whose weights (drawn from the run's seed, as the Keras
    backend's are) start the run; the step graph waits for `restore` or
    `initialize`."""
    self.task = task
    _check_prefix_lm_ids(task)
    self.gin_text = architecture.gin_text(task.model_config)
    _check_or_write_gin(self.model_dir, self.gin_text)
    devices_lib.build_task(task, self.options.seed)
    self._scopes.enter_context(mtf_models.gin_scope(self.gin_text))

  def _open(self):
    """The `StepGraph` in a session, with the backbone's current weights
    as the initial values."""
    options, placement = self.options, self.place.state
    mesh_and_rules = options.mtf_mesh()
    mesh, rules = mesh_and_rules or (None, None)
    self.model = mtf_models.build_model(
        gin_text=self.gin_text, vocab_size=self.task.model_config.vocab_size,
        mesh_shape=mesh, layout=rules)
    initial = model_map.keras_to_mtf(mtf_model=self.model,
                                     keras_model=self.task.backbone)
    # The placeholders take the shapes of the task's batches.
    inputs, targets = self.task.inputs_and_targets(
        next(iter(self.task.eval_dataset(1))))
    with _quiet_tensorflow_logger():  # mtf's notes on initializers replaced
      step_graph = training_graph.build(
          model=self.model, batch_size=inputs.shape[0],
          inputs_length=inputs.shape[1], targets_length=targets.shape[1],
          initial_values=initial, mesh_and_rules=mesh_and_rules,
          seed=options.seed, max_to_keep=options.max_checkpoints,
          devices=placement.devices, client_device=placement.client_device)
    self.session = session_lib.Session(step_graph, self.model_dir,
                                       self.task.inputs_and_targets,
                                       placement.target)
    return self.session

  def checkpoints(self):
    state = tf.train.get_checkpoint_state(self.model_dir)
    return list(state.all_model_checkpoint_paths) if state else []

  def restore(self, path):
    session = self.session or self._open()
    session.restore(path)
    self._step = session.step

  def initialize(self, init_checkpoint=None):
    """The step graph from the tf_keras backbone's weights (drawn by
    `build`, the backbone's from `init_checkpoint` if given)."""
    if init_checkpoint:
      checkpoint_reading.restore(init_checkpoint, backbone=self.task.backbone)
    (self.session or self._open()).initialize()
    self._step = 0

  @property
  def step(self):
    return self._step  # kept here: one session.run less per step

  @property
  def initial_eval(self):
    return self.session.initial_eval

  def set_initial_eval(self, value):
    self.session.set_initial_eval(value)

  def train_batches(self, start_step):
    return iter(self.task.train_dataset(start_step))

  def train_step(self, batches, learning_rate):
    loss = self.session.train_step(next(batches), learning_rate)
    self._step += 1
    return loss

  def evaluate(self, batches):
    return devices_lib.evaluate(self.session, batches)

  def task_metrics(self, num_steps):
    """The task's metrics, computed by its Keras model holding mtf's
    trained weights (converted back, `model_map.mtf_to_keras`)."""
    if not self.task.has_metrics:
      return {}  # the task has none: no weights to convert
    model_map.mtf_to_keras(mtf_model=self.model,
                           keras_model=self.task.backbone,
                           variables=self.session.model_values())
    return self.task.extra_eval_metrics(
        num_steps, devices_lib.StrategyDevices(tf.distribute.get_strategy()))

  def save(self):
    return self.session.save()

  def latest_checkpoint(self):
    return tf.train.latest_checkpoint(self.model_dir)

  def checkpoint_directory(self):
    return self.model_dir

  def describe(self):
    graph, options = self.session.graph, self.options
    variables = len(graph.variable_names)
    mesh = (f"mesh {options.mesh_shape}, {len(graph.sharded)} of "
            f"{variables} variables sharded" if options.mesh_shape else
            "one device")
    kind = {mtf_models.BITRANSFORMER: "Bitransformer",
            "lm": "LM Unitransformer",
            "aligned": "aligned Unitransformer"}[graph.model_type]
    return (f"{self.task.describe()}; Mesh TensorFlow {kind}, {variables} "
            f"variables; adafactor, peak learning rate "
            f"{options.peak_learning_rate:g}; {mesh}.")

  def close(self):
    if self.session is not None:
      self.session.close()
    self._scopes.close()


def _check_prefix_lm_ids(task):
  """Refuses a prefix LM whose tokenizer mtf cannot read: its prefix LM
  (`input_full_attention`, `delimited_lm_inputs_mask`) finds each part by
  the end token 1, and T5's padding is 0."""
  if not getattr(task.model_config, "prefix_lm", False):
    return
  special = task.tokenizer.special
  if (special.eos, special.pad) != (convert.T5_EOS_ID, wiring.PAD_ID):
    raise ValueError(
        f"Mesh TensorFlow's prefix LM finds the prefix by the end token "
        f"{convert.T5_EOS_ID} and the padding by {wiring.PAD_ID}; the run's "
        f"tokenizer has eos={special.eos}, pad={special.pad}. Give "
        "--tokenizer a T5 vocabulary (a thattn tokenizer folder of kind "
        "t5_sentencepiece), or train on --backend=keras.")


def export(*, model_dir, export_dir, log=print):
  """Exports a `--backend=mtf` run: converted to Keras, then exported.

  The newest checkpoint is converted (`MtfBackend.model_dir_for_export`)
  into a thattn model_dir staged beside export_dir (`thattn.io.staged_writes`: a
  killed export's copy is removed by the next one), which
  `thattn.export.export` exports as any Keras run.
  """
  export_lib.check_export_dir(export_dir, model_dir=model_dir)  # not after
  with staged_writes.staged(export_dir, program="thattn-export", log=log,
                      suffix=".converted") as temp:
    keras_dir = MtfBackend.model_dir_for_export(model_dir, temp, log)
    return export_lib.export(model_dir=keras_dir, export_dir=export_dir,
                             log=log)
