"""SQuAD v1.1 span labeling: [CLS] question [SEP] context [SEP].

The data (`thattn.data.squad`) is read from one SQuAD JSON file per split,
every answer checked against its context; contexts longer than the sequence
length are an error unless --on_overflow=window (BERT's sliding windows) or
drop. The head (`thattn.models.heads.SpanHead`) maps the backbone's
sequence output to start and end logits, `span_loss` is the mean of the two cross-entropies, and `predict` picks the
best span per question (start <= end, at most max_answer_length tokens,
inside the context, best over windows) and returns its text, scored by
`squad_metrics.evaluate` (exact match and F1). Serving: the answer text of
a (question, context) pair.
"""

import numpy as np

from thattn import models
from thattn.core import requirements
from thattn.models import heads_and_losses
from thattn.models import wiring
from thattn.tasks import base
from thattn.tasks import finetune
from thattn.tasks import serving
from thattn.tasks import squad_metrics

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import errors
  from thattn.data import squad as squad_data
  from thattn.models import front_end
  from thattn.models import heads

_MAX_ANSWER_TOKENS = 30


def answer_mask(features):
  """Positions that may start or end an answer: [CLS] and the context."""
  return heads_and_losses.answer_mask(front_end.TF_KERAS_OPS, features)


def span_loss(start_positions, end_positions, start_logits, end_logits):
  """Mean over the batch of (CE(start) + CE(end)) / 2, in nats."""
  total, count = heads_and_losses.span_loss(
      front_end.TF_KERAS_OPS, start_positions, end_positions, start_logits,
      end_logits)
  return total / count


def predict(examples, infos, start_logits, end_logits, *,
            max_answer_length=30, n_best=20):
  """{question id: answer text}: the best span per question over windows."""
  best = {}
  for info, starts, ends in zip(infos, np.asarray(start_logits),
                                np.asarray(end_logits)):
    count = len(info.token_starts)
    window = slice(info.context_offset, info.context_offset + count)
    start_scores, end_scores = starts[window], ends[window]
    for i in np.argsort(-start_scores)[:n_best]:
      for j in np.argsort(-end_scores)[:n_best]:
        if i <= j < i + max_answer_length:
          score = start_scores[i] + end_scores[j]
          if score > best.get(info.example_index, (-np.inf,))[0]:
            best[info.example_index] = (score, info.token_starts[i],
                                        info.token_ends[j])
  answers = {}
  for index, example in enumerate(examples):
    if index in best:
      _, begin, end = best[index]
      answers[example.question_id] = example.context.encode(
          "utf-8")[begin:end].decode("utf-8", "replace")
  return answers


@base.register
class Squad(finetune.FinetuneTask):
  """SQuAD v1.1 span labeling: [CLS] question [SEP] context [SEP]."""

  name = "squad"
  default_sequence_length = 256

  def _read(self, path, is_training):
    report = errors.DropReport()
    examples = squad_data.read_squad(path, report=report)
    features, infos = squad_data.encode(
        examples, self.tokenizer, self.sequence_length, is_training=True,
        on_overflow=self.data.on_overflow, report=report)
    if report.total_dropped:
      self.log(f"{path}: {report}.")
    if not is_training:
      self.eval_examples = examples
    return features, infos

  def build(self):
    self.backbone = models.build_model(self.model_config)
    self.head = heads.SpanHead(name="span_head")
    self.head(self.backbone.output["sequence_output"])

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, self.head,
                        batch, training, pad_id=self.tokenizer.special.pad)

  def metric_outputs(self, batch):
    """(start logits, end logits), each [batch, length]."""
    return self.metric_outputs_of(front_end.TF_KERAS_OPS, self.backbone,
                                  self.head, batch)

  @classmethod
  def keras3_parts(cls, config, head_config):
    del head_config
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    from thattn.keras3.models import heads  # pylint: disable=g-import-not-at-top
    head = heads.SpanHead(name="span_head")
    head.build((None, None, config.d_model))
    return keras3_models.build_model(config), head

  @classmethod
  def input_dtypes(cls, config, head):
    del config, head
    return {key: "int32" for key in wiring.BERT_INPUTS + (
        "start_positions", "end_positions")}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    del pad_id
    return heads_and_losses.squad_loss(task_ops, backbone, head, batch,
                                       training)

  @classmethod
  def metric_outputs_of(cls, task_ops, backbone, head, batch):
    return tuple(heads_and_losses.span_logits(task_ops, backbone, head,
                                              batch, False))

  def metrics_of(self, predict_logits, num_steps):
    """Exact match and F1 of the best spans of every held-out question."""
    del num_steps  # every question once
    starts, ends = self._eval_outputs(predict_logits)
    predictions = predict(self.eval_examples, self.eval_info, starts, ends)
    return squad_metrics.evaluate(
        squad_data.gold_answers(self.eval_examples), predictions)

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir):
    backbone, tokenizer, files = cls.serving_backbone(config, tokenizer_dir)
    head = heads.SpanHead(name="span_head")
    head(backbone.output["sequence_output"])
    serving.restore(checkpoint, backbone=backbone, head=head)
    return SquadServing({"backbone": backbone, "head": head}, tokenizer,
                        config["sequence_length"], files)


class SquadServing(serving.BertServing):
  """squad: the best answer span (at most 30 tokens) of question, context."""

  def _logits(self, features):
    sequence = self._encode(features)["sequence_output"]
    start, end = self._keras.head(sequence, mask=answer_mask(features))
    return tf.cast(start, tf.float32), tf.cast(end, tf.float32)

  @serving.signature(serving.TEXT, serving.TEXT)
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

  @serving.signature(serving.IDS, serving.IDS, serving.IDS)
  def serve_token_ids(self, input_word_ids, input_mask, input_type_ids):
    start, end = self._logits(serving.bert_features(
        input_word_ids, input_mask, input_type_ids))
    return {"start_logits": start, "end_logits": end}
