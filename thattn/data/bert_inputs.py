"""BERT inputs for sentence(-pair) classification and regression.

`encode` turns `glue.Example`s into BERT inputs, [CLS] a [SEP] (b [SEP]),
tokenizing in large batches with the in-graph tokenizer. An example longer
than sequence_length is a `DataError` naming its file and line; pass
on_overflow="truncate" to cut the longer text first (as BERT does), or
"drop" to skip such examples, counted in the `DropReport`.

The head, loss and GLUE metrics live with the task,
`thattn.tasks.classification`; `pad_rows` and `tokenize_texts` serve SQuAD's
features too (`thattn.data.squad`).
"""

import logging

import numpy as np
import tensorflow as tf

from thattn.core import validation
from thattn.data import errors

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
  validation.one_of("on_overflow", on_overflow, OVERFLOW_CHOICES)
  report = report if report is not None else errors.DropReport()
  special = tokenizer.special
  tokens_a = tokenize_texts(tokenizer, [e.text_a for e in examples])
  tokens_b = tokenize_texts(tokenizer, [e.text_b or "" for e in examples])
  rows, types, labels = [], [], []
  for example, a, b in zip(examples, tokens_a, tokens_b):
    pair = example.text_b is not None
    budget = sequence_length - (3 if pair else 2)
    if len(a) + len(b) > budget:
      error = errors.DataError(
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
