"""The task interface and registry: what the trainer and the export ask.

A task is one class, in one module of `thattn.tasks`, registered by name
with `@register`. The class holds the task's defaults; an instance holds one
run's data and model. The trainer (`thattn.training.trainer`), the binaries
and the export (`thattn.export`) look tasks up with `get(name)` and use only
this interface, so a new task is a new module plus its `@register` line (and
an import in `thattn/tasks/__init__.py` for a built-in one).

Defaults (class attributes):
- `name`: the registry key, `--task=<name>`;
- `default_preset` and `default_overrides`: the backbone when none is given
  (None for a task without presets, such as recall);
- `default_sequence_length`;
- `pretraining`: True if the task trains from scratch (no dropout, the
  paper's recipe, unless asked);
- `supports_dropout`: False if the task's model has no dropout to set;
- `eval_metric`: the name of the held-out loss in logs and summaries.

One run (an instance, made with the keywords of `Task.__init__`):
- `build()`: create the backbone and head (inside the devices' scope; the
  DTensor devices may call it twice, see `thattn.training.dtensor`);
- `trainable_variables`, `checkpoint_items()` (the trackables to save:
  `backbone`, and `head` if any, so that `--init_checkpoint` can load a
  pretrained backbone into another task);
- `train_dataset(start_step)`, `eval_dataset(num_steps)`: step-addressed
  batches (`thattn.data.batches`), so a resumed run continues exactly;
- `loss(batch, training)`: `(sum of weighted losses, sum of weights)` in
  nats, so the trainer can average exactly over replicas and batches;
- `tokens_per_step`, `describe()`;
- metrics beyond the loss, written once for every front end:
  `metric_outputs(batch)`, the tf_keras model's outputs the metrics read
  (classification's logits, SQuAD's start and end logits, recall's value
  logits; the Keras 3 model computes the same,
  `keras3_steps.TaskLoss.metric_outputs`), and `metrics_of(predict,
  num_steps)`, the metrics from `predict(batch) -> those outputs as NumPy`;
  `extra_eval_metrics(num_steps, devices)` runs them on the tf_keras model,
  placing batches with `devices.place(batch)` and reading outputs back with
  `devices.fetch(tensor)` (a task may override it whole, as the toy tasks
  of the tests do); `has_metrics` says whether there are any;
- `decoding_metrics`: None, or for a task whose metrics decode step by
  step (span corruption) `decoding_metrics(generate)`, its metrics from a
  greedy decoder `generate(inputs) -> tokens`; `extra_eval_metrics` passes
  tf_keras's, and a backend with a decoder of its own (Keras 3) passes
  that;
- `run_config()`: what `serving_module` needs to rebuild the model.

Keras 3 (`--backend=keras3`) trains a task that gives its Keras 3 parts,
as class methods (`trains_on_keras3()` says whether it does):
`keras3_parts(config, head_config)` (the Keras 3 backbone and head,
built), `input_dtypes(config, head)` (the batch arrays the loss reads),
`loss_of(task_ops, backbone, head, batch, training, pad_id)` and
`metric_outputs_of(task_ops, backbone, head, batch)`, the loss and the
metric outputs written once over a `heads_and_losses.TaskOps` (the
tf_keras `loss` and `metric_outputs` call them with TensorFlow's), and
per run `keras3_options()`, the config and head keywords
`keras3_steps.TaskLoss` is made with.

Mesh TensorFlow (`--backend=mtf`, `thattn.mtf.training`) trains a task that
says how (the same batches and the same Keras backbone's initial weights,
converted):
- `mtf_model`: a description of the T5 it trains ("a T5 encoder (e.g.
  t5_tiny_encoder)"), None for a task mtf cannot train; `mtf_trains(config)`
  says whether a backbone config is one of them;
- `model_config`: the run's backbone config (a `T5Config`), from which mtf
  builds its model (a Bitransformer, or for stacks="encoder" an aligned
  Unitransformer);
- `inputs_and_targets(batch)`: one batch as mtf's int32 arrays
  [batch, length], targets 0 where not scored.

Imports: a task module imports no framework at import time. TensorFlow,
tf_keras and the modules built on them (`thattn.data`, the tf_keras
models) are imported inside `thattn.core.requirements.lazy_imports`, which
loads them when they are first used: the Keras 3 step
(`thattn.training.keras3_steps`) reads a task's Keras 3 parts on JAX or
PyTorch with no TensorFlow installed, as `benchmarks/model_steps.py` does
on the GPU machines. The tf_keras heads live in `thattn.models.heads`, and
a serving's signatures are declared as plain data
(`thattn.tasks.serving.signature`), so that no class statement needs
TensorFlow.

Serving (a class method, no run needed):
- `serving_module(config=..., checkpoint=..., tokenizer_dir=...)`: a
  `thattn.tasks.serving.Serving` with a `serve_token_ids` signature and,
  for text tasks, `serve_text`.
"""

import dataclasses

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.models import front_end

_REGISTRY = {}

# Embedding layers that --freeze_embeddings keeps fixed.
EMBEDDING_LAYERS = ("word_embeddings", "position_embedding", "type_embeddings",
                    "token_embedding", "embedding_projection")
# Examples in eval batches come from a seed stream apart from training's.
EVAL_SEED_OFFSET = 1_000_003


def register(task_class):
  """Class decorator: makes `task_class` available as `get(task_class.name)`."""
  name = task_class.name
  if not isinstance(name, str) or not name:
    raise ValueError(f"{task_class.__name__}.name must be a non-empty "
                     f"string, got {name!r}.")
  if name in _REGISTRY and _REGISTRY[name] is not task_class:
    raise ValueError(f"Task {name!r} is registered already, by "
                     f"{_REGISTRY[name].__module__}."
                     f"{_REGISTRY[name].__name__}.")
  _REGISTRY[name] = task_class
  return task_class


def get(name):
  """The task class registered as `name`; the error lists every name."""
  if name not in _REGISTRY:
    raise ValueError(f"Unknown task {name!r}; expected one of "
                     f"{', '.join(names())}.")
  return _REGISTRY[name]


def names():
  """Registered task names, in registration order."""
  return tuple(_REGISTRY)


@dataclasses.dataclass(frozen=True)
class DataOptions:
  """Where the data comes from and how it is read (every text task)."""
  train_files: str = None  # glob; None: the embedded default corpus
  eval_files: str = None  # glob; None: a held-out split of train_files
  tokenizer: str = "sentencepiece"  # a kind, or a folder Tokenizer.save wrote
  vocab_size: int = 8000
  cache_dir: str = None  # default corpus cache; None: $THATTN_CACHE_DIR
  glue_task: str = "sst2"  # classification: the GLUE task the TSV follows
  on_overflow: str = "raise"  # fine-tuning: too-long examples, see the tasks


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """The backbone: a preset, overrides, and training-time switches."""
  preset: str
  overrides: dict = dataclasses.field(default_factory=dict)
  freeze_embeddings: bool = False
  # The user's modules that register the variants the overrides name
  # (--attention_module): run_config.json records them, and reading it
  # imports them (thattn.io.run_dir.read_run_config).
  attention_modules: tuple = ()


@dataclasses.dataclass(frozen=True)
class TaskFiles:
  """Folders a task reads and writes; the trainer owns the run's layout.

  tokenizer_dir: where this run keeps its tokenizer (a resumed run finds it
    there). init_tokenizer_dir: a tokenizer the run must take, or None: the
    --init_checkpoint run's (a fine-tuned backbone must keep it), or across
    processes the chief's (every process tokenizes alike).
  """
  tokenizer_dir: str = None
  init_tokenizer_dir: str = None


def backbone_overrides(model, vocab_size, sequence_length, log=print):
  """The preset's overrides for this run: the vocabulary and positions.

  A BERT (or learned-position LM) preset whose position table is shorter
  than sequence_length gets one as long (the tiny BERTs have 64 positions).
  """
  overrides = dict(model.overrides, vocab_size=vocab_size)
  config = models.model_config(model.preset, **overrides)
  learned = {models.BertConfig: "absolute", models.DecoderConfig: "learned"}
  if (type(config) in learned and
      config.position_embedding == learned[type(config)] and
      config.max_position_embeddings < sequence_length):
    log(f"{model.preset}: {config.max_position_embeddings} positions -> "
        f"{sequence_length}, for sequence_length={sequence_length}.")
    overrides["max_position_embeddings"] = sequence_length
  return overrides


def is_frozen_embedding(name):
  """Whether the weight `name` (a tf_keras name or a Keras 3 path) is in one
  of the embedding layers --freeze_embeddings keeps fixed."""
  return any(f"{layer}/" in name for layer in EMBEDDING_LAYERS)


def trainable_variables(layers, freeze_embeddings):
  """The variables of layers, once each, minus frozen embeddings.

  A head that ties its output to the backbone's embeddings lists that
  table too; it is kept once, or the optimizer would step it twice.
  """
  variables, seen = [], set()
  for layer in layers:
    for variable in layer.trainable_variables:
      if variable.ref() in seen or (freeze_embeddings and
                                    is_frozen_embedding(variable.name)):
        continue
      seen.add(variable.ref())
      variables.append(variable)
  return variables


def masked_cross_entropy(targets, logits, weights):
  """(sum of weighted cross-entropies, sum of weights), in nats.

  Returned apart, so that a mean over several batches or replicas weighs
  every position alike: ln(PPL) = total / count.
  """
  return heads_and_losses.masked_cross_entropy(front_end.TF_KERAS_OPS,
                                               targets, logits, weights)


def sizes(rows):
  """Rows and tokens of an int array of rows, for log lines."""
  rows = np.asarray(rows)
  return f"{rows.shape[0]:,} rows, {rows.size:,} tokens"


_FAMILY_NAMES = {models.BertConfig: "BERT or ALBERT", models.T5Config: "T5",
                 models.DecoderConfig: "decoder-only LM"}


class Task:
  """The interface every task implements; see the module docstring."""

  name = None
  default_preset = None
  default_overrides = {}
  default_sequence_length = 128
  pretraining = True
  supports_dropout = True
  eval_metric = "ln_ppl"
  config_type = None  # the backbone config class the task needs, if any
  # --backend=mtf: the model it trains for this task, for messages; None:
  # mtf has no model for it (see the module).
  mtf_model = None
  model_config = None  # the run's backbone config, once known

  def __init__(self, *, model, data, files, batch_size, sequence_length, seed,
               log=print):
    del data, files, log  # used by the tasks that need them
    type(self).check_model(model)
    self.model_options = model
    self.batch_size = batch_size
    self.sequence_length = sequence_length
    self.seed = seed
    self.backbone = None
    self.head = None
    self.tokenizer = None  # the text tasks' (thattn.data.tokenizers)

  @classmethod
  def check_model(cls, model):
    """Raises ValueError for model options the task cannot build.

    Called before any data is read or file written, so that a bad flag
    (--num_heads=0, a T5 preset for masked LM) fails at once.
    """
    if model.preset is None:
      return
    config = models.model_config(model.preset, **model.overrides)
    if cls.config_type is not None and not (
        isinstance(config, cls.config_type) and cls.fits(config)):
      raise ValueError(
          f"--task={cls.name} needs {cls.model_description()} preset, got "
          f"{model.preset!r}; one of "
          f"{', '.join(cls.fitting_presets())}.")

  @classmethod
  def fits(cls, config):
    """Whether the task can build a model of `config` (of `config_type`)."""
    del config  # tasks with one-stack models check theirs
    return True

  @classmethod
  def model_description(cls):
    return f"a {_FAMILY_NAMES.get(cls.config_type, cls.config_type.__name__)}"

  @classmethod
  def fitting_presets(cls):
    return [name for name in models.preset_names()
            if isinstance(models.model_config(name), cls.config_type)
            and cls.fits(models.model_config(name))]

  @classmethod
  def mtf_trains(cls, config):
    """Whether --backend=mtf trains this task on a backbone of `config`."""
    return (cls.mtf_model is not None and
            isinstance(config, models.T5Config) and cls.fits(config))

  def inputs_and_targets(self, batch):
    """(inputs, targets) of a batch for mtf: int32 NumPy [batch, length],
    targets 0 where nothing is scored."""
    raise NotImplementedError(f"Task {self.name!r} has no Mesh TensorFlow "
                              "inputs.")

  def checkpoint_items(self):
    items = {"backbone": self.backbone}
    if self.head is not None:
      items["head"] = self.head
    return items

  @property
  def trainable_variables(self):
    """The tf_keras model's weights the run trains (`trains_weight`)."""
    return [variable for variable in trainable_variables(
        [layer for layer in (self.backbone, self.head) if layer is not None],
        freeze_embeddings=False) if self.trains_weight(variable.name)]

  def trains_weight(self, name):
    """Whether the run trains the weight `name` (a tf_keras name or a Keras
    3 path: each backend asks of its own model's weights): all but the
    frozen embeddings (--freeze_embeddings); a task leaves out what its
    loss never reaches."""
    return not (self.model_options.freeze_embeddings and
                is_frozen_embedding(name))

  def eval_dataset(self, num_steps):
    return self._batches(seed=self.seed + EVAL_SEED_OFFSET, start_step=0,
                         num_steps=num_steps, train=False)

  def train_dataset(self, start_step):
    return self._batches(seed=self.seed, start_step=start_step,
                         num_steps=None, train=True)

  def _batches(self, *, seed, start_step, num_steps, train):
    raise NotImplementedError(f"{type(self).__name__} must define _batches, "
                              "or train_dataset and eval_dataset.")

  @property
  def tokens_per_step(self):
    return self.batch_size * self.sequence_length

  def parameters(self):
    """(model parameters, of which in the backbone), each weight once.

    A head that ties its output to the backbone's embeddings (masked LM)
    shares that table; it is counted once.
    """
    layers = [layer for layer in (self.backbone, self.head)
              if layer is not None]
    unique = {w.ref(): w for layer in layers for w in layer.weights}
    total = sum(w.shape.num_elements() for w in unique.values())
    return total, self.backbone.count_params()

  def describe(self, parameters=None):
    """One line: the task and its model's parameters, head included
    (`parameters`, (total, backbone), where a backend's model gives them;
    else the tf_keras model's, `parameters()`)."""
    total, backbone = parameters or self.parameters()
    text = f"{self.name}: {total:,} model parameters"
    if total != backbone:
      text += f" (backbone {backbone:,}, head {total - backbone:,})"
    return text

  # A task whose metrics decode: decoding_metrics(generate) (see the module).
  decoding_metrics = None

  def extra_eval_metrics(self, num_steps, devices):
    """Task metrics beyond the eval loss, of the tf_keras model on
    `devices`: `metrics_of` over its `metric_outputs`."""
    function = tf.function(self.metric_outputs, autograph=False)

    def predict(batch):
      placed = devices.place(tf.nest.map_structure(tf.convert_to_tensor,
                                                   batch))
      return tuple(devices.fetch(output) for output in function(placed))
    return self.metrics_of(predict, num_steps)

  @property
  def has_metrics(self):
    """Whether the task computes metrics beyond the eval loss."""
    kind = type(self)
    return (kind.extra_eval_metrics is not Task.extra_eval_metrics or
            kind.metrics_of is not Task.metrics_of)

  def metric_outputs(self, batch):
    """The model's outputs the task's metrics read, for one held-out batch:
    a tuple of tensors (each front end computes the same ones: the Keras 3
    model's are `keras3_steps.TaskLoss.metric_outputs`)."""
    raise NotImplementedError(f"{type(self).__name__} has no metrics.")

  def metrics_of(self, predict, num_steps):
    """Task metrics beyond the eval loss, {name: float}, from
    `predict(batch) -> tuple of NumPy arrays`, `metric_outputs` computed by
    either front end for one held-out batch (NumPy); {} by default."""
    del predict, num_steps  # tasks with metrics use them
    return {}

  # ---- Keras 3 (--backend=keras3) ----------------------------------------
  # A task that trains there gives, as class methods (no run's data needed):
  # its Keras 3 model and head, the batch arrays its loss reads, and its
  # loss and metric outputs over a `heads_and_losses.TaskOps`, written once
  # for both front ends (the tf_keras `loss` and `metric_outputs` call them
  # with TensorFlow's ops). `thattn.training.keras3_steps.TaskLoss` calls
  # them, and names no task.

  @classmethod
  def trains_on_keras3(cls):
    """Whether `--backend=keras3` trains the task (it has Keras 3 parts)."""
    return cls.keras3_parts.__func__ is not Task.keras3_parts.__func__

  @classmethod
  def keras3_parts(cls, config, head_config):
    """(backbone, head or None), the task's Keras 3 model and head, built,
    for the backbone `config` (and the head's keywords, `head_config`, that
    `keras3_options` gave)."""
    raise NotImplementedError(f"--task={cls.name} has no Keras 3 model.")

  @classmethod
  def input_dtypes(cls, config, head):
    """{batch key: dtype name} of the arrays `loss_of` reads, in the
    order a tuple batch holds them."""
    raise NotImplementedError

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    """`(sum of losses, count)` in nats, over `task_ops`; see `loss`."""
    raise NotImplementedError

  @classmethod
  def metric_outputs_of(cls, task_ops, backbone, head, batch):
    """`metric_outputs` over `task_ops`, on either front end's model."""
    raise ValueError(f"--task={cls.name} has no metrics of its model's "
                     "outputs.")

  def keras3_options(self):
    """The keywords of this run's Keras 3 `TaskLoss` beside the task: the
    backbone's `config`, the tokenizer's `pad_id` and the `head_config`."""
    pad_id = 0 if self.tokenizer is None else self.tokenizer.special.pad
    return {"config": self.model_config, "pad_id": pad_id, "head_config": {}}

  def run_config(self):
    config = {"task": self.name, "preset": self.model_options.preset,
              "overrides": dict(self.model_options.overrides),
              "sequence_length": self.sequence_length}
    if self.model_options.attention_modules:  # older runs have no key
      config["attention_modules"] = list(self.model_options.attention_modules)
    return config

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    raise NotImplementedError(f"Task {cls.name!r} has no serving module.")
