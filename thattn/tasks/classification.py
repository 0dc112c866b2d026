"""Sentence(-pair) classification and regression on GLUE-style TSV files.

The data (`thattn.data.glue` reads the TSV, `thattn.data.bert_inputs`
encodes [CLS] a [SEP] (b [SEP])) is chosen with --glue_task, which says the
file's columns and labels. The head takes the backbone's pooled output
(BERT's and ALBERT's pooler) and returns logits [b, num_classes], or [b]
predictions for regression. The held-out metrics are GLUE's: accuracy, F1
of the positive class, Matthews correlation, Pearson and Spearman
correlation. Serving: logits and predictions of raw text (pairs).
"""

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses
from thattn.models import wiring
from thattn.tasks import base
from thattn.tasks import finetune
from thattn.tasks import serving

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import bert_inputs
  from thattn.data import errors
  from thattn.data import glue
  from thattn.models import front_end
  from thattn.models import heads


def classification_loss(labels, logits):
  """Mean cross-entropy over the batch (nats)."""
  total, count = heads_and_losses.classification_loss(
      front_end.TF_KERAS_OPS, logits, labels, regression=False)
  return total / count


def regression_loss(labels, predictions):
  """Mean squared error."""
  total, count = heads_and_losses.classification_loss(
      front_end.TF_KERAS_OPS, predictions, labels, regression=True)
  return total / count


def accuracy(labels, predictions):
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels, predictions, positive=1):
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  true_positive = np.sum((predictions == positive) & (labels == positive))
  predicted, actual = np.sum(predictions == positive), np.sum(
      labels == positive)
  if true_positive == 0:
    return 0.0
  precision, recall = true_positive / predicted, true_positive / actual
  return float(2 * precision * recall / (precision + recall))


def matthews_corrcoef(labels, predictions):
  """(TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)); 0 if undefined."""
  labels, predictions = np.asarray(labels) == 1, np.asarray(predictions) == 1
  tp = float(np.sum(labels & predictions))
  tn = float(np.sum(~labels & ~predictions))
  fp = float(np.sum(~labels & predictions))
  fn = float(np.sum(labels & ~predictions))
  denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return 0.0 if denominator == 0 else float((tp * tn - fp * fn) / denominator)


def pearson(labels, predictions):
  return float(np.corrcoef(np.asarray(labels, np.float64),
                           np.asarray(predictions, np.float64))[0, 1])


def _ranks(values):
  """Ranks 1..n, ties given their average rank."""
  values = np.asarray(values, np.float64)
  order = np.argsort(values, kind="stable")
  ranks = np.empty(len(values))
  ranks[order] = np.arange(1, len(values) + 1)
  for value in np.unique(values):
    tied = values == value
    ranks[tied] = ranks[tied].mean()
  return ranks


def spearman(labels, predictions):
  return pearson(_ranks(labels), _ranks(predictions))


METRICS = {"accuracy": accuracy, "f1": f1,
           "matthews_corrcoef": matthews_corrcoef, "pearson": pearson,
           "spearman": spearman}


def glue_metrics(task, labels, outputs):
  """The task's GLUE metrics from labels and model outputs (logits or [b]).

  task: a glue.GlueTask. For classification, outputs are logits and the
  prediction is their argmax.
  """
  outputs = np.asarray(outputs)
  predictions = outputs if task.is_regression else outputs.argmax(-1)
  return {name: METRICS[name](labels, predictions) for name in task.metrics}


@base.register
class Classification(finetune.FinetuneTask):
  """Sentence(-pair) classification or regression on GLUE-style TSV files."""

  name = "classification"
  default_sequence_length = 128

  def _read(self, path, is_training):  # pylint: disable=unused-argument
    self.glue_task = glue.get_task(self.data.glue_task)
    report = errors.DropReport()
    examples = glue.read_tsv(path, self.glue_task, report=report)
    features = bert_inputs.encode(
        examples, self.tokenizer, self.sequence_length,
        on_overflow=self.data.on_overflow, report=report)
    if report.total_dropped:
      self.log(f"{path}: {report}.")
    return features, None

  def head_keywords(self):
    """The `ClassificationHead`'s keywords, on either front end."""
    return {"num_classes": self.glue_task.num_classes,
            "dropout_rate": self.model_config.dropout_rate}

  def build(self):
    self.backbone = models.build_model(self.model_config)
    self.head = heads.ClassificationHead(name="classifier",
                                         **self.head_keywords())
    # Built now, so the optimizer and a restore see all of its weights.
    self.head(self.backbone.output["pooled_output"])

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, self.head,
                        batch, training, pad_id=self.tokenizer.special.pad)

  def metric_outputs(self, batch):
    """(logits [batch, classes], or predictions [batch] in regression)."""
    return self.metric_outputs_of(front_end.TF_KERAS_OPS, self.backbone,
                                  self.head, batch)

  @classmethod
  def keras3_parts(cls, config, head_config):
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    from thattn.keras3.models import heads  # pylint: disable=g-import-not-at-top
    head = heads.ClassificationHead(name="classifier", **head_config)
    head.build((None, config.d_model))
    return keras3_models.build_model(config), head

  @classmethod
  def input_dtypes(cls, config, head):
    del config
    return dict({key: "int32" for key in wiring.BERT_INPUTS},
                labels="float32" if head.num_classes == 1 else "int32")

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del pad_id
    outputs = heads_and_losses.classification_outputs(backbone, head, batch,
                                                      training)
    return heads_and_losses.classification_loss(
        task_ops, outputs, batch["labels"], regression=head.num_classes == 1)

  @classmethod
  def metric_outputs_of(cls, task_ops, backbone, head, batch):
    del task_ops
    return (heads_and_losses.classification_outputs(backbone, head, batch,
                                                    False),)

  def keras3_options(self):
    return dict(super().keras3_options(), head_config=self.head_keywords())

  def metrics_of(self, predict, num_steps):
    """The GLUE task's metrics over every held-out example."""
    del num_steps  # every example once
    outputs, labels = self._eval_outputs(
        lambda batch: (predict(batch)[0], batch["labels"]))
    return glue_metrics(self.glue_task, labels, outputs)

  def run_config(self):
    return dict(super().run_config(), glue_task=self.glue_task.name,
                num_classes=self.glue_task.num_classes)

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    backbone, tokenizer, files = cls.serving_backbone(config, tokenizer_dir)
    head = heads.ClassificationHead(config["num_classes"], name="classifier")
    head(backbone.output["pooled_output"])
    serving.restore(checkpoint, backbone=backbone, head=head)
    pair = glue.get_task(config["glue_task"]).tsv_text_b is not None
    module = PairClassifierServing if pair else SingleTextClassifierServing
    return module({"backbone": backbone, "head": head}, tokenizer,
                  config["sequence_length"], files)


class ClassifierServing(serving.BertServing):
  """classification: logits and predictions of raw text (pairs)."""

  def _classify(self, features):
    pooled = self._encode(features)["pooled_output"]
    logits = tf.cast(self._keras.head(pooled, training=False), tf.float32)
    if len(logits.shape) == 1:  # regression
      return {"predictions": logits}
    return {"logits": logits,
            "predictions": tf.argmax(logits, -1, output_type=tf.int32)}

  @serving.signature(serving.IDS, serving.IDS, serving.IDS)
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    return self._classify(serving.bert_features(
        input_word_ids, input_mask, input_type_ids))


class SingleTextClassifierServing(ClassifierServing):

  @serving.signature(serving.TEXT)
  def serve_text(self, text):
    return self._classify(self._features(text))


class PairClassifierServing(ClassifierServing):

  @serving.signature(serving.TEXT, serving.TEXT)
  def serve_text(self, text_a, text_b):
    return self._classify(self._features(text_a, text_b))
