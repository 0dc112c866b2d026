"""Sentence(-pair) classification and regression: features, head, loss, metrics.

`encode` turns `glue.Example`s into BERT inputs, [CLS] a [SEP] (b [SEP]),
tokenizing in large batches with the in-graph tokenizer. An example longer
than sequence_length is a `DataError` naming its file and line; pass
on_overflow="truncate" to cut the longer text first (as BERT does), or
"drop" to skip such examples, counted in the `DropReport`.

The head takes a backbone's pooled output (BERT's and ALBERT's pooler) and
returns logits [b, num_classes], or [b] predictions for regression. Metrics
are GLUE's: accuracy, F1 of the positive class, Matthews correlation,
Pearson and Spearman correlation.
"""

import logging

import numpy as np
import tensorflow as tf
import tf_keras

from thattn.tasks import data_errors

OVERFLOW_CHOICES = ("raise", "truncate", "drop")
_TOKENIZE_BATCH = 4096


def tokenize_texts(tokenizer, texts):
  """Token id lists for a list of strings, tokenized in large batches."""
  ids = []
  for start in range(0, len(texts), _TOKENIZE_BATCH):
    batch = tokenizer.tokenize(tf.constant(texts[start:start +
                                                 _TOKENIZE_BATCH]))
    ids.extend(batch.to_list())
  return ids


def _truncate_pair(a, b, limit):
  """Cuts the longer of a and b, one token at a time, until they fit."""
  a, b = list(a), list(b)
  while len(a) + len(b) > limit:
    (a if len(a) >= len(b) else b).pop()
  return a, b


def encode(examples, tokenizer, sequence_length, *, on_overflow="raise",
           report=None):
  """A dict of int32 numpy arrays [n, sequence_length] plus "labels" [n]."""
  if on_overflow not in OVERFLOW_CHOICES:
    raise ValueError(f"on_overflow must be one of {OVERFLOW_CHOICES}, got "
                     f"{on_overflow!r}.")
  report = report if report is not None else data_errors.DropReport()
  special = tokenizer.special
  tokens_a = tokenize_texts(tokenizer, [e.text_a for e in examples])
  tokens_b = tokenize_texts(tokenizer, [e.text_b or "" for e in examples])
  rows, types, labels = [], [], []
  for example, a, b in zip(examples, tokens_a, tokens_b):
    pair = example.text_b is not None
    budget = sequence_length - (3 if pair else 2)
    if len(a) + len(b) > budget:
      error = data_errors.DataError(
          *example.source, f"{len(a) + len(b)} tokens, but sequence_length="
          f"{sequence_length} leaves room for {budget}; pass on_overflow="
          "'truncate' or 'drop'", kind="too long")
      if on_overflow == "truncate":
        a, b = _truncate_pair(a, b, budget)
      else:
        report.handle(error, "raise" if on_overflow == "raise" else "drop")
        continue
    row = [special.cls] + a + [special.sep]
    type_row = [0] * len(row)
    if pair:
      row += b + [special.sep]
      type_row += [1] * (len(b) + 1)
    rows.append(row)
    types.append(type_row)
    labels.append(example.label)
  report.kept += len(rows)
  if report.total_dropped:
    logging.warning("classification.encode: %s. First: %s", report,
                    report.examples[0])
  features = {
      "input_word_ids": pad_rows(rows, sequence_length, special.pad),
      "input_type_ids": pad_rows(types, sequence_length, 0),
  }
  features["input_mask"] = pad_rows([[1] * len(r) for r in rows],
                                sequence_length, 0)
  if all(label is not None for label in labels):
    dtype = np.float32 if any(isinstance(l, float) for l in labels) \
        else np.int32
    features["labels"] = np.asarray(labels, dtype)
  return features


def pad_rows(rows, length, value):
  """Lists of ints as an int32 array [len(rows), length], padded with value."""
  array = np.full([len(rows), length], value, np.int32)
  for i, row in enumerate(rows):
    array[i, :len(row)] = row
  return array


def dataset(features, *, batch_size, shuffle=False, seed=None, repeat=False,
            drop_remainder=False):
  """A tf.data pipeline over encoded features: (inputs dict, labels)."""
  inputs = {k: v for k, v in features.items() if k != "labels"}
  data = tf.data.Dataset.from_tensor_slices(
      (inputs, features["labels"]) if "labels" in features else inputs)
  if shuffle:
    data = data.shuffle(len(features["input_word_ids"]), seed=seed,
                        reshuffle_each_iteration=True)
  if repeat:
    data = data.repeat()
  return data.batch(batch_size, drop_remainder=drop_remainder).prefetch(
      tf.data.AUTOTUNE)


@tf_keras.utils.register_keras_serializable(package="thattn")
class ClassificationHead(tf_keras.layers.Layer):
  """Logits [b, num_classes] from a pooled output [b, d].

  inner_dim > 0 adds a Dense+tanh pooler first, for backbones without one
  (T5's encoder, after taking position 0). num_classes=1 is regression and
  returns [b].
  """

  def __init__(self, num_classes, *, inner_dim=0, dropout_rate=0.1,
               kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    if num_classes < 1:
      raise ValueError(f"num_classes must be positive, got {num_classes}.")
    self.num_classes = num_classes
    self.inner_dim = inner_dim
    self.dropout_rate = dropout_rate
    self.kernel_initializer = kernel_initializer
    self.dense = (tf_keras.layers.Dense(
        inner_dim, activation="tanh", kernel_initializer=kernel_initializer,
        name="pooler_dense") if inner_dim else None)
    self.dropout = tf_keras.layers.Dropout(dropout_rate)
    self.out_proj = tf_keras.layers.Dense(
        num_classes, kernel_initializer=kernel_initializer, name="logits")

  def call(self, pooled_output, training=None):
    x = pooled_output
    if self.dense is not None:
      x = self.dense(x)
    logits = self.out_proj(self.dropout(x, training=training))
    return logits[:, 0] if self.num_classes == 1 else logits

  def get_config(self):
    return dict(super().get_config(), num_classes=self.num_classes,
                inner_dim=self.inner_dim, dropout_rate=self.dropout_rate,
                kernel_initializer=self.kernel_initializer)


def classification_loss(labels, logits):
  """Mean cross-entropy over the batch (nats)."""
  return tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True))


def regression_loss(labels, predictions):
  """Mean squared error."""
  labels = tf.cast(labels, predictions.dtype)
  return tf.reduce_mean(tf.square(predictions - labels))


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
