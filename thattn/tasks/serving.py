"""What every task's serving module shares: tokenization in the graph.

A task's `serving_module` (see `thattn.tasks.base`) returns a `Serving`
holding the model and the tokenizer, whose methods marked with
`@signature(...)` are the SavedModel's functions: `serve_token_ids` and,
for text tasks, `serve_text`, which `thattn.export` saves as the
`serve_token_ids` and `serving_default` signatures. `Serving.tf_module()`
makes the `tf.Module` that is saved. Tokenization runs inside the graph
(tensorflow-text), so a client needs only `tensorflow` and
`tensorflow_text`. Texts longer than the trained sequence length are
truncated.

A `Serving` is a plain Python class, and the signatures' specs are plain
data, so that a task module defines its serving without importing
TensorFlow (see `thattn.tasks.base`, "Imports"); TensorFlow is imported
when a `Serving` is made.
"""

import dataclasses
import inspect
import os
import types
from typing import Optional, Tuple

from thattn.core import requirements
from thattn.models import wiring

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import tokenizers
  from thattn.io import checkpoint_reading


@dataclasses.dataclass(frozen=True)
class Spec:
  """A signature's input: `tf.TensorSpec(shape, dtype, name=name)`."""
  dtype: str
  shape: Tuple[Optional[int], ...]
  name: Optional[str] = None

  def tensor_spec(self):
    return tf.TensorSpec(self.shape, self.dtype, name=self.name)


IDS = Spec("int32", (None, None))
TEXT = Spec("string", (None,))


def signature(*specs):
  """Marks a `Serving` method as a SavedModel function of inputs `specs`
  (`Spec`s, one per argument); `Serving.tf_module` traces it with
  `tf.function(..., input_signature=...)`."""
  for spec in specs:
    if not isinstance(spec, Spec):
      raise ValueError(f"signature takes serving.Spec inputs, got {spec!r}.")

  def mark(method):
    method.input_specs = specs
    return method
  return mark


def restore(checkpoint, **objects):
  """Restores `objects` (backbone, head) from a training checkpoint.

  The checkpoint also holds the optimizer and trainer state, which serving
  does not need; a keras3 run's step folder is read by name
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


class Serving:
  """Base of the tasks' serving modules.

  Args:
    keras_models: {name: Keras model or layer}, reached in the signatures
      as `self._keras.<name>`.
    tokenizer: a `thattn.data.tokenizers.Tokenizer`, or None.
    sequence_length: the trained length texts are cut to.
    files: the tokenizer's files, saved as the SavedModel's assets.

  `saved_objects` are what the SavedModel keeps beside the functions: the
  models' weights (not the Keras models: no Keras is needed to load it, and
  no layer's call is traced at export time), the tokenizer and its files;
  a subclass may add to them.
  """

  def __init__(self, keras_models, tokenizer, sequence_length, files=()):
    self._keras = types.SimpleNamespace(**keras_models)
    self.tokenizer = tokenizer
    self.sequence_length = sequence_length
    # A tokenizer that runs Python (not `in_graph`) cannot be saved; its
    # files still are, for clients to tokenize with.
    in_graph = getattr(tokenizer, "in_graph", True)
    self.saved_objects = {
        "weights": [w for m in keras_models.values() for w in m.weights],
        "tokenizer": tokenizer if in_graph else None,
        "tokenizer_files": [tf.saved_model.Asset(f) for f in files]}

  def tf_module(self):
    """The `tf.Module` to save: `saved_objects`, and each method marked
    with `signature` as a `tf.function` of its input specs; with a
    tokenizer that is not `in_graph`, the text signatures are left out (a
    SavedModel cannot hold its Python), and token ids are served alone."""
    module = tf.Module()
    for name, value in self.saved_objects.items():
      setattr(module, name, value)
    text_served = getattr(self.tokenizer, "in_graph", True)
    for name, method in inspect.getmembers(type(self), inspect.isfunction):
      specs = getattr(method, "input_specs", None)
      if specs is not None and not text_served and any(
          spec.dtype == "string" for spec in specs):
        continue
      if specs is not None:
        setattr(module, name, tf.function(
            getattr(self, name),
            input_signature=[spec.tensor_spec() for spec in specs]))
    if not hasattr(module, "serve_token_ids"):
      raise ValueError(f"{type(self).__name__} has no serve_token_ids "
                       "signature; mark it with @serving.signature(...).")
    return module


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
