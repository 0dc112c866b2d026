"""What every task's serving module shares: tokenization in the graph.

A task's `serving_module` (see `thattn.tasks.base`) returns a `Serving`: a
`tf.Module` holding the model's weights and the tokenizer, with a
`serve_token_ids` function and, for text tasks, `serve_text`, which
`thattn.export` saves as the SavedModel's `serve_token_ids` and
`serving_default` signatures. Tokenization runs inside the graph
(tensorflow-text), so a client needs only `tensorflow` and
`tensorflow_text`. Texts longer than the trained sequence length are
truncated.
"""

import os

import tensorflow as tf

from thattn.io import checkpoint_reading
from thattn.data import tokenizers
from thattn.models import wiring

IDS = tf.TensorSpec([None, None], tf.int32)
TEXT = tf.TensorSpec([None], tf.string)


def restore(checkpoint, **objects):
  """Restores `objects` (backbone, head) from a training checkpoint.

  The checkpoint also holds the optimizer and trainer state, which serving
  does not need; a keras3 run's Orbax step is read by name
  (`thattn.io.checkpoint_reading`).
  """
  checkpoint_reading.restore(checkpoint, **objects)


def load_tokenizer(tokenizer_dir):
  """(tokenizer, its files), the files to save as the SavedModel's assets."""
  tokenizer = tokenizers.load(tokenizer_dir)
  files = sorted(os.path.join(tokenizer_dir, name)
                 for name in tf.io.gfile.listdir(tokenizer_dir))
  return tokenizer, files


def bert_features(input_word_ids, input_mask, input_type_ids):
  """BERT's three inputs as the backbone's input dict."""
  return dict(zip(wiring.BERT_INPUTS,
                  (input_word_ids, input_mask, input_type_ids)))


class _Untracked:
  """Holds Keras models out of the tf.Module's tracking (see `Serving`)."""

  def __init__(self, **attributes):
    self.__dict__.update(attributes)


class Serving(tf.Module):
  """Base of the tasks' serving modules.

  The Keras models sit in an untracked holder and only their weights are
  tracked: the SavedModel then holds the variables and the signature
  functions, not a Keras model (no Keras needed to load it, and no tracing
  of every layer at export time).
  """

  def __init__(self, keras_models, tokenizer, sequence_length, files=()):
    super().__init__()
    self._keras = _Untracked(**keras_models)
    self._weights = [w for m in keras_models.values() for w in m.weights]
    self.tokenizer = tokenizer
    self.sequence_length = sequence_length
    self.tokenizer_files = [tf.saved_model.Asset(f) for f in files]


class BertServing(Serving):
  """BERT (mlm, classification, squad): [CLS] text [SEP] (b [SEP]) in."""

  def _features(self, first, second=None):
    special = self.tokenizer.special
    segments = [self.tokenizer.tokenize(first)]
    if second is not None:
      segments.append(self.tokenizer.tokenize(second))
    budget = self.sequence_length - 1 - len(segments)
    segments = truncate(segments, budget)
    batch = segments[0].nrows()
    cls = tf.fill([batch, 1], special.cls)
    sep = tf.fill([batch, 1], special.sep)
    pieces, types = [cls], [tf.zeros_like(cls)]
    for index, segment in enumerate(segments):
      pieces += [segment, sep]
      types += [tf.ones_like(segment) * index, tf.fill([batch, 1], index)]
    ids = tf.concat(pieces, axis=1)
    type_ids = tf.concat(types, axis=1)
    return {"input_word_ids": ids.to_tensor(special.pad),
            "input_mask": tf.ones_like(ids).to_tensor(0),
            "input_type_ids": type_ids.to_tensor(0)}

  def _encode(self, features):
    return self._keras.backbone(features, training=False)


def truncate(segments, budget):
  """Cuts the segments (ragged rows) so that together they fit budget.

  One segment is cut to budget; of two, the second (the context or text_b)
  gives way first, keeping at least half the budget for each when both
  are long.
  """
  if len(segments) == 1:
    return [segments[0][:, :budget]]
  first, second = segments
  first_length = tf.minimum(first.row_lengths(),
                            tf.maximum(budget - second.row_lengths(),
                                       budget // 2))
  first = tf.ragged.boolean_mask(first, tf.ragged.range(
      first.row_lengths()) < tf.expand_dims(first_length, 1))
  second_length = budget - first.row_lengths()
  second = tf.ragged.boolean_mask(second, tf.ragged.range(
      second.row_lengths()) < tf.expand_dims(second_length, 1))
  return [first, second]
