"""Fine-tuning objectives: GLUE-style classification and SQuAD span labeling.

Both take a BERT or ALBERT backbone (usually loaded with --init_checkpoint
from a masked-LM run, whose tokenizer they then reuse) and a head from
`thattn.tasks.classification` or `thattn.tasks.squad`. Data is read once,
encoded to numpy features and served step by step (`lm_data.feature_batches`),
so a resumed run continues exactly. The eval loss is the mean cross-entropy
(mean squared error for regression); the task's own metrics (GLUE's, or
SQuAD's exact match and F1) are computed over the whole eval file.
"""

import dataclasses
import math
import os

import numpy as np
import tensorflow as tf

from thattn import models
from thattn.tasks import classification
from thattn.tasks import data_errors
from thattn.tasks import glue
from thattn.tasks import lm_data
from thattn.tasks import objectives
from thattn.tasks import squad
from thattn.tasks import squad_metrics
from thattn.tasks import tokenizers

_MODEL_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")


@dataclasses.dataclass(frozen=True)
class FinetuneOptions:
  glue_task: str = "sst2"  # classification: the GLUE task the TSV follows
  on_overflow: str = "raise"  # too-long examples: see classification/squad
  init_dir: str = None  # the model_dir of --init_checkpoint, for its tokenizer


def finetune_tokenizer(data, model_dir, init_dir, log=print):
  """The tokenizer: resumed, the pretraining run's, a folder, or the default.

  A fine-tuned backbone must see the ids it was pretrained on, so the
  tokenizer beside --init_checkpoint wins over --tokenizer.
  """
  saved = os.path.join(model_dir, objectives.TOKENIZER_DIR)
  candidates = [saved]
  if init_dir:
    candidates.append(os.path.join(init_dir, objectives.TOKENIZER_DIR))
  for folder in candidates:
    if tf.io.gfile.exists(os.path.join(folder, tokenizers.CONFIG_FILE)):
      tokenizer = tokenizers.load(folder)
      break
  else:
    if data.tokenizer in objectives.TOKENIZER_KINDS:
      log(f"Tokenizer: the default corpus's {data.tokenizer} "
          f"({data.vocab_size}); pass --init_checkpoint to reuse a "
          "pretraining run's.")
      tokenizer = tokenizers.default_tokenizer(
          data.tokenizer, data.vocab_size, data.cache_dir)
    else:
      tokenizer = tokenizers.load(data.tokenizer)
  if not tf.io.gfile.exists(os.path.join(saved, tokenizers.CONFIG_FILE)):
    tokenizer.save(saved)
  return tokenizer


def _single_file(pattern, flag):
  if pattern is None:
    raise ValueError(f"This task needs {flag}.")
  paths = sorted(tf.io.gfile.glob(pattern))
  if len(paths) != 1:
    raise ValueError(f"{flag}={pattern!r} must name one file, matched "
                     f"{len(paths)}.")
  return paths[0]


class _FinetuneObjective(objectives.Objective):
  """Shared: tokenizer, BERT backbone, features in memory."""

  eval_metric = "loss"

  def __init__(self, *, data, model, finetune, model_dir, log=print,
               **kwargs):
    super().__init__(**kwargs)
    self.data = data
    self.model_options = model
    self.finetune = finetune
    self.log = log
    self.tokenizer = finetune_tokenizer(data, model_dir, finetune.init_dir,
                                        log=log)
    self.overrides = objectives.backbone_overrides(
        model, self.tokenizer.vocab_size, self.sequence_length, log=log)
    self.model_config = models.model_config(model.preset, **self.overrides)
    if not isinstance(self.model_config, models.BertConfig):
      raise ValueError(f"--task={self.task} needs a BERT or ALBERT preset, "
                       f"got {model.preset!r}.")
    train_file = _single_file(data.train_files, "--train_files")
    eval_file = _single_file(data.eval_files or data.train_files,
                             "--eval_files")
    self.train_features, _ = self._read(train_file, is_training=True)
    self.eval_features, self.eval_info = self._read(eval_file,
                                                    is_training=False)

  @property
  def trainable_variables(self):
    return objectives.trainable_variables(
        [self.backbone, self.head], self.model_options.freeze_embeddings)

  def _batches(self, *, seed, start_step, num_steps, train):
    features = self.train_features if train else self.eval_features
    return lm_data.feature_batches(features, batch_size=self.batch_size,
                                   seed=seed, start_step=start_step,
                                   num_steps=num_steps, shuffle=train)

  def _outputs(self, batch, training):
    return self.backbone({key: batch[key] for key in _MODEL_INPUTS},
                         training=training)

  @property
  def tokens_per_step(self):
    return self.batch_size * self.sequence_length

  def _eval_outputs(self, function):
    """function(batch) over the eval features in order, once, concatenated."""
    count = len(self.eval_features["input_word_ids"])
    steps = math.ceil(count / self.batch_size)
    outputs = [function(self.place_batch(batch)) for batch in self._batches(
        seed=0, start_step=0, num_steps=steps, train=False)]
    return [np.concatenate([self.fetch(o[i]) for o in outputs])[:count]
            for i in range(len(outputs[0]))]

  def run_config(self):
    return {"task": self.task, "preset": self.model_options.preset,
            "overrides": self.overrides,
            "sequence_length": self.sequence_length,
            "tokenizer_dir": objectives.TOKENIZER_DIR}


class Classification(_FinetuneObjective):
  """Sentence(-pair) classification or regression on GLUE-style TSV files."""

  task = "classification"

  def _read(self, path, is_training):  # pylint: disable=unused-argument
    self.glue_task = glue.get_task(self.finetune.glue_task)
    report = data_errors.DropReport()
    examples = glue.read_tsv(path, self.glue_task, report=report)
    features = classification.encode(
        examples, self.tokenizer, self.sequence_length,
        on_overflow=self.finetune.on_overflow, report=report)
    if report.total_dropped:
      self.log(f"{path}: {report}.")
    return features, None

  def build(self):
    self.backbone = models.build_model(self.model_config)
    self.head = classification.ClassificationHead(
        self.glue_task.num_classes,
        dropout_rate=self.model_config.dropout_rate, name="classifier")
    # Built now, so the optimizer and a restore see all of its weights.
    self.head(self.backbone.output["pooled_output"])

  def _predict(self, batch, training=False):
    return self.head(self._outputs(batch, training)["pooled_output"],
                     training=training)

  def loss(self, batch, training):
    outputs = tf.cast(self._predict(batch, training), tf.float32)
    labels = batch["labels"]
    if self.glue_task.is_regression:
      losses = tf.square(outputs - tf.cast(labels, tf.float32))
    else:
      losses = tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=tf.cast(labels, tf.int32), logits=outputs)
    return tf.reduce_sum(losses), tf.cast(tf.size(losses), tf.float32)

  def extra_eval_metrics(self, num_steps):
    predict = tf.function(lambda batch: (self._predict(batch), batch["labels"]))
    outputs, labels = self._eval_outputs(predict)
    return classification.glue_metrics(self.glue_task, labels, outputs)

  def run_config(self):
    return dict(super().run_config(), glue_task=self.glue_task.name,
                num_classes=self.glue_task.num_classes)


class Squad(_FinetuneObjective):
  """SQuAD v1.1 span labeling: [CLS] question [SEP] context [SEP]."""

  task = "squad"

  def _read(self, path, is_training):
    report = data_errors.DropReport()
    examples = squad.read_squad(path, report=report)
    features, infos = squad.encode(
        examples, self.tokenizer, self.sequence_length, is_training=True,
        on_overflow=self.finetune.on_overflow, report=report)
    if report.total_dropped:
      self.log(f"{path}: {report}.")
    if not is_training:
      self.eval_examples = examples
    return features, infos

  def build(self):
    self.backbone = models.build_model(self.model_config)
    self.head = squad.SpanHead(name="span_head")
    self.head(self.backbone.output["sequence_output"])

  def _logits(self, batch, training=False):
    start, end = self.head(self._outputs(batch, training)["sequence_output"],
                           mask=squad.answer_mask(batch))
    return tf.cast(start, tf.float32), tf.cast(end, tf.float32)

  def loss(self, batch, training):
    start, end = self._logits(batch, training)
    loss = squad.span_loss(batch["start_positions"], batch["end_positions"],
                           start, end)
    count = tf.cast(tf.shape(start)[0], tf.float32)
    return loss * count, count

  def extra_eval_metrics(self, num_steps):
    starts, ends = self._eval_outputs(tf.function(self._logits))
    predictions = squad.predict(self.eval_examples, self.eval_info, starts,
                                ends)
    return squad_metrics.evaluate(squad.gold_answers(self.eval_examples),
                                  predictions)
