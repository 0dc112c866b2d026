"""SavedModel export of a trained model_dir, serving raw text.

`export(model_dir=..., export_dir=...)` rebuilds the model that
`thattn-train` trained (from `run_config.json`), restores its latest
checkpoint and writes a SavedModel with two signatures:

| task                | serving_default (strings in)                   | serve_token_ids (ids in)            |
|---------------------|------------------------------------------------|-------------------------------------|
| mlm                 | text -> sequence_output, pooled_output, input_mask, input_word_ids | BERT's three inputs -> encodings |
| classification      | text (text_b for pairs) -> logits, predictions | BERT's inputs -> logits             |
| squad               | question, context -> answer, start/end logits  | BERT's inputs -> start/end logits   |
| span_corruption     | text -> text (generated), tokens               | encoder_input_tokens -> tokens      |
| recall              | (no text) the token-ids signature              | tokens [b, n, 2] -> logits          |

Tokenization runs inside the graph (tensorflow-text), so a client needs only
`tensorflow` and `tensorflow_text`:

    import tensorflow as tf, tensorflow_text  # registers the text ops
    model = tf.saved_model.load(export_dir)
    model.signatures["serving_default"](text=tf.constant(["Some text."]))

Texts longer than the trained sequence length are truncated. The
tokenizer's files (`tokenizer.json` and `vocab.txt` or `sentencepiece.model`)
are saved as assets, in `export_dir/assets/`.

The export is atomic: everything is written to a hidden staging folder
beside export_dir, then renamed into place. A failed export removes the
staging folder and leaves any previous export untouched, so nothing that
looks like a valid SavedModel appears at export_dir unless it is complete.
"""

import json
import os
import shutil
import time

import tensorflow as tf

from thattn import models
from thattn.tasks import classification
from thattn.tasks import lm_data
from thattn.tasks import recall_model
from thattn.tasks import squad
from thattn.tasks import tokenizers

RUN_CONFIG = "run_config.json"
EXPORT_INFO = "thattn_export.json"
_BERT_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
_IDS = tf.TensorSpec([None, None], tf.int32)
_TEXT = tf.TensorSpec([None], tf.string)
_MAX_ANSWER_TOKENS = 30


class _Untracked:
  """Holds Keras models out of the tf.Module's tracking (see `_Serving`)."""

  def __init__(self, **attributes):
    self.__dict__.update(attributes)


class _Serving(tf.Module):
  """Base of the serving modules.

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


class _BertServing(_Serving):
  """BERT (mlm, classification, squad): [CLS] text [SEP] (b [SEP]) in."""

  def _features(self, first, second=None):
    special = self.tokenizer.special
    segments = [self.tokenizer.tokenize(first)]
    if second is not None:
      segments.append(self.tokenizer.tokenize(second))
    budget = self.sequence_length - 1 - len(segments)
    segments = _truncate(segments, budget)
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


def _truncate(segments, budget):
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


class EncoderServing(_BertServing):
  """mlm: BERT encodings of raw text."""

  @tf.function(input_signature=[_TEXT])
  def serve_text(self, text):
    features = self._features(text)
    outputs = self._encode(features)
    return {"sequence_output": outputs["sequence_output"],
            "pooled_output": outputs["pooled_output"],
            "input_mask": features["input_mask"],
            "input_word_ids": features["input_word_ids"]}

  @tf.function(input_signature=[_IDS, _IDS, _IDS])
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    outputs = self._encode(dict(zip(_BERT_INPUTS, (
        input_word_ids, input_mask, input_type_ids))))
    return {"sequence_output": outputs["sequence_output"],
            "pooled_output": outputs["pooled_output"]}


class ClassifierServing(_BertServing):
  """classification: logits and predictions of raw text (pairs)."""

  def _classify(self, features):
    pooled = self._encode(features)["pooled_output"]
    logits = tf.cast(self._keras.head(pooled, training=False), tf.float32)
    if len(logits.shape) == 1:  # regression
      return {"predictions": logits}
    return {"logits": logits,
            "predictions": tf.argmax(logits, -1, output_type=tf.int32)}

  @tf.function(input_signature=[_IDS, _IDS, _IDS])
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    return self._classify(dict(zip(_BERT_INPUTS, (
        input_word_ids, input_mask, input_type_ids))))


class SingleTextClassifierServing(ClassifierServing):

  @tf.function(input_signature=[_TEXT])
  def serve_text(self, text):
    return self._classify(self._features(text))


class PairClassifierServing(ClassifierServing):

  @tf.function(input_signature=[_TEXT, _TEXT])
  def serve_text(self, text_a, text_b):
    return self._classify(self._features(text_a, text_b))


class SquadServing(_BertServing):
  """squad: the best answer span (at most 30 tokens) of question, context."""

  def _logits(self, features):
    sequence = self._encode(features)["sequence_output"]
    start, end = self._keras.head(sequence, mask=squad.answer_mask(features))
    return tf.cast(start, tf.float32), tf.cast(end, tf.float32)

  @tf.function(input_signature=[_TEXT, _TEXT])
  def serve_text(self, question, context):
    features = self._features(question, context)
    start_logits, end_logits = self._logits(features)
    # Context tokens follow [CLS] question [SEP] and precede the last [SEP];
    # only they may answer.
    _, starts, ends = self.tokenizer.tokenize_with_offsets(context)
    types, mask = features["input_type_ids"], features["input_mask"]
    offset = tf.reduce_sum((1 - types) * mask, axis=1)
    length = tf.shape(start_logits)[1]
    positions = tf.range(length)
    in_context = (types == 1) & (tf.roll(types, -1, axis=1) == 1)
    scores = start_logits[:, :, None] + end_logits[:, None, :]
    span = positions[None, :] - positions[:, None]
    allowed = ((span >= 0) & (span < _MAX_ANSWER_TOKENS))[None]
    allowed &= in_context[:, :, None] & in_context[:, None, :]
    scores = tf.where(allowed, scores, -1e9)
    best = tf.argmax(tf.reshape(scores, [-1, length * length]), axis=-1,
                     output_type=tf.int32)
    first = tf.maximum(best // length - offset, 0)
    last = tf.maximum(best % length - offset, 0)
    byte_start = tf.gather(starts.to_tensor(), first, batch_dims=1)
    byte_end = tf.gather(ends.to_tensor(), last, batch_dims=1)
    return {"answer": tf.strings.substr(context, byte_start,
                                        byte_end - byte_start),
            "start_logits": start_logits, "end_logits": end_logits}

  @tf.function(input_signature=[_IDS, _IDS, _IDS])
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    start, end = self._logits(dict(zip(_BERT_INPUTS, (
        input_word_ids, input_mask, input_type_ids))))
    return {"start_logits": start, "end_logits": end}


class T5Serving(_Serving):
  """span_corruption: T5 generation (greedy) from raw text."""

  def __init__(self, generator, tokenizer, sequence_length, files=()):
    super().__init__({}, tokenizer, sequence_length, files)
    self.generator = generator

  @tf.function(input_signature=[_TEXT])
  def serve_text(self, text):
    special = self.tokenizer.special
    ids = self.tokenizer.tokenize(text)[:, :self.sequence_length - 1]
    ids = tf.concat([ids, tf.fill([ids.nrows(), 1], special.eos)], axis=1)
    tokens = self.generator(ids.to_tensor(special.pad))["tokens"]
    text_out = self.tokenizer.detokenize(
        tf.RaggedTensor.from_tensor(tokens, padding=special.pad))
    return {"text": text_out, "tokens": tokens}

  @tf.function(input_signature=[
      tf.TensorSpec([None, None], tf.int32, name="encoder_input_tokens")])
  def serve_token_ids(self, encoder_input_tokens):
    return {"tokens": self.generator(encoder_input_tokens)["tokens"]}


class RecallServing(_Serving):
  """recall: value logits and predictions of (key, value) tokens."""

  @tf.function(input_signature=[tf.TensorSpec([None, None, 2], tf.int32)])
  def serve_token_ids(self, tokens):
    logits = tf.cast(self._keras.backbone(tokens, training=False), tf.float32)
    return {"logits": logits,
            "predictions": tf.argmax(logits, -1, output_type=tf.int32)}


def read_run_config(model_dir):
  path = os.path.join(model_dir, RUN_CONFIG)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"{model_dir} has no {RUN_CONFIG}: is it a model_dir "
                     "that thattn-train wrote?")
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def _latest_checkpoint(model_dir):
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  if not latest:
    raise ValueError(f"{model_dir}/checkpoints holds no checkpoint to export.")
  return latest


def build_serving_module(model_dir, checkpoint=None):
  """(the serving module, run config, checkpoint path) of a model_dir."""
  config = read_run_config(model_dir)
  checkpoint = checkpoint or _latest_checkpoint(model_dir)
  task, length = config["task"], config["sequence_length"]
  if task == "recall":
    recall_config = config["recall"]
    backbone = recall_model.RecallEncoder(
        num_keys=recall_config["num_keys"],
        num_values=recall_config["num_values"], **config["overrides"])
    backbone(tf.zeros([1, length, 2], tf.int32))
    _restore(checkpoint, backbone=backbone)
    return RecallServing({"backbone": backbone}, None, length), config, \
        checkpoint
  tokenizer_dir = os.path.join(model_dir, config["tokenizer_dir"])
  tokenizer = tokenizers.load(tokenizer_dir)
  files = sorted(os.path.join(tokenizer_dir, name)
                 for name in tf.io.gfile.listdir(tokenizer_dir))
  backbone = models.create_model(config["preset"], **config["overrides"])
  if task == "span_corruption":
    _restore(checkpoint, backbone=backbone)
    _, targets_length = lm_data.span_corruption_lengths(length)
    generator = models.T5Generator(backbone, max_length=targets_length,
                                   eos_id=config["eos_id"])
    return T5Serving(generator, tokenizer, length, files), config, checkpoint
  if task == "mlm":
    _restore(checkpoint, backbone=backbone)
    return EncoderServing({"backbone": backbone}, tokenizer, length, files), \
        config, checkpoint
  if task == "classification":
    head = classification.ClassificationHead(config["num_classes"],
                                             name="classifier")
    head(backbone.output["pooled_output"])
    pair = _is_pair_task(config["glue_task"])
    serving = PairClassifierServing if pair else SingleTextClassifierServing
  else:
    head = squad.SpanHead(name="span_head")
    head(backbone.output["sequence_output"])
    serving = SquadServing
  _restore(checkpoint, backbone=backbone, head=head)
  return serving({"backbone": backbone, "head": head}, tokenizer, length,
                 files), config, checkpoint


def _is_pair_task(name):
  from thattn.tasks import glue  # pylint: disable=g-import-not-at-top
  return glue.get_task(name).tsv_text_b is not None


def _restore(checkpoint, **objects):
  # The checkpoint also holds the optimizer and trainer state: not exported.
  tf.train.Checkpoint(**objects).restore(
      checkpoint).expect_partial().assert_existing_objects_matched()


def _signatures(module):
  signatures = {"serve_token_ids": module.serve_token_ids}
  signatures["serving_default"] = getattr(module, "serve_text",
                                          module.serve_token_ids)
  return signatures


def _write_info(staging, config, checkpoint):
  info = dict(config, checkpoint=checkpoint,
              signatures=["serving_default", "serve_token_ids"])
  with tf.io.gfile.GFile(os.path.join(staging, EXPORT_INFO), "w") as f:
    f.write(json.dumps(info, indent=2, sort_keys=True) + "\n")


def export(*, model_dir, export_dir, checkpoint=None, log=print):
  """Writes the SavedModel of model_dir's latest checkpoint to export_dir.

  Atomic (see the module): an existing export_dir is replaced only by a
  complete new export. Returns export_dir.
  """
  started = time.time()
  module, config, checkpoint = build_serving_module(model_dir, checkpoint)
  export_dir = os.path.abspath(export_dir)
  parent, name = os.path.split(export_dir)
  tf.io.gfile.makedirs(parent)
  staging = os.path.join(parent, f".{name}.incomplete-{os.getpid()}")
  try:
    tf.saved_model.save(module, staging, signatures=_signatures(module))
    _write_info(staging, config, checkpoint)
    _replace(staging, export_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  log(f"Exported {config['task']} model ({os.path.basename(checkpoint)}) to "
      f"{export_dir} in {time.time() - started:.1f}s.")
  return export_dir


def _replace(staging, export_dir):
  """Moves staging to export_dir; an old export is removed only after."""
  old = None
  if os.path.exists(export_dir):
    old = f"{staging}.old"
    os.rename(export_dir, old)
  os.rename(staging, export_dir)
  if old:
    shutil.rmtree(old, ignore_errors=True)
