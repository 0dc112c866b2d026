"""SQuAD v1.1 data: reading the JSON files and encoding BERT features.

`read_squad` reads the official JSON layout and checks every answer against
its context: an answer whose `answer_start` does not point at its text is a
`DataError` naming the file, the line of the question id, and the id.

`encode` builds [CLS] question [SEP] context [SEP] features with the answer's
first and last context token (`start_positions`, `end_positions`), mapping
characters to tokens through the tokenizer's byte offsets. A question and
context longer than sequence_length is an error by default; on_overflow=
"drop" skips it (counted), and "window" cuts the context into windows that
start every doc_stride tokens, as BERT does; a training window that does not
hold the whole answer points at [CLS] (position 0).

The head, loss and answer prediction live with the task,
`thattn.tasks.squad`.
"""

import dataclasses
import json
import logging

import numpy as np
import tensorflow as tf

from thattn.core import validation
from thattn.data import bert_inputs
from thattn.data import errors

OVERFLOW_CHOICES = ("raise", "drop", "window")


@dataclasses.dataclass(frozen=True)
class SquadExample:
  question_id: str
  question: str
  context: str
  answers: tuple  # ((text, answer_start), ...) in characters
  source: tuple  # (path, line)


def _line_of(raw, question_id):
  position = raw.find(json.dumps(question_id))
  return None if position < 0 else raw.count("\n", 0, position) + 1


def read_squad(path, *, on_error="raise", report=None):
  """SquadExamples from a SQuAD v1.1 JSON file, answers checked."""
  errors.check_on_error(on_error)
  raw = errors.read_text(path)
  if not raw.strip():
    raise errors.DataError(path, 1, "empty file", kind="empty file")
  try:
    data = json.loads(raw)["data"]
  except json.JSONDecodeError as e:
    raise errors.DataError(path, e.lineno, f"invalid JSON: {e.msg}",
                                kind="invalid JSON") from None
  except (KeyError, TypeError):
    raise errors.DataError(path, 1, 'no top-level "data" list',
                                kind="bad layout") from None
  questions = [(qa, paragraph["context"]) for article in data
               for paragraph in article["paragraphs"]
               for qa in paragraph["qas"]]
  return errors.parse_records(
      questions, lambda item: _example(*item, path, raw), on_error=on_error,
      report=report, source=f"read_squad({path})")


def read_tfds(split, *, name="squad/v1.1", data_dir=None, download=False,
              on_error="raise", report=None):
  """SquadExamples from TFDS (needs tensorflow-datasets), answers checked.

  Errors name the dataset, split and example index instead of a file line.
  """
  from thattn.data import sources  # pylint: disable=g-import-not-at-top
  tfds = sources.import_tfds()
  errors.check_on_error(on_error)
  dataset = tfds.load(name, split=split, data_dir=data_dir, download=download)

  def parse(item):
    index, record = item
    answers = record["answers"]
    qa = {"id": record["id"].decode("utf-8"),
          "question": record["question"].decode("utf-8"),
          "answers": [{"text": t.decode("utf-8"), "answer_start": int(s)}
                      for t, s in zip(answers["text"],
                                      answers["answer_start"])]}
    return _example(qa, record["context"].decode("utf-8"),
                    f"{name}[{split}]", None, line=index)

  return errors.parse_records(
      enumerate(tfds.as_numpy(dataset)), parse, on_error=on_error,
      report=report, source=f"squad.read_tfds({name}[{split}])")


def _example(qa, context, path, raw, line=None):
  question_id = str(qa.get("id"))
  if raw is not None:
    line = _line_of(raw, question_id)
  answers = []
  for answer in qa.get("answers", []):
    text, start = answer.get("text", ""), answer.get("answer_start", -1)
    if not text.strip() or not isinstance(start, int) or start < 0 or \
        context[start:start + len(text)] != text:
      found = context[start:start + len(text)] if isinstance(start, int) \
          and start >= 0 else ""
      raise errors.DataError(
          path, line, f"question {question_id}: answer {text!r} at "
          f"answer_start={start} is not in its context (found {found!r})",
          kind="answer not in context")
    answers.append((text, start))
  if not qa.get("question", "").strip():
    raise errors.DataError(path, line, f"question {question_id} is "
                                "empty", kind="empty question")
  return SquadExample(question_id, qa["question"], context, tuple(answers),
                      (path, line))


@dataclasses.dataclass(frozen=True)
class FeatureInfo:
  """How one feature maps back to its example's context."""
  example_index: int
  context_offset: int  # sequence position of the window's first token
  token_starts: np.ndarray  # byte offsets in the context, per window token
  token_ends: np.ndarray


def _answer_tokens(example, starts, ends):
  if not example.answers:
    raise errors.DataError(*example.source, f"question "
                                f"{example.question_id} has no answer to "
                                "train on", kind="no answer")
  text, start = example.answers[0]
  byte_start = len(example.context[:start].encode("utf-8"))
  byte_end = byte_start + len(text.encode("utf-8"))
  inside = np.flatnonzero((ends > byte_start) & (starts < byte_end))
  if not inside.size:
    raise errors.DataError(*example.source, f"question "
                                f"{example.question_id}: answer {text!r} "
                                "covers no token", kind="answer not in context")
  return int(inside[0]), int(inside[-1])


def _windows(num_tokens, size, stride):
  starts = list(range(0, max(num_tokens - size, 0) + stride, stride))
  return [s for s in starts if s < num_tokens or s == 0]


def encode(examples, tokenizer, sequence_length, *, is_training,
           on_overflow="raise", doc_stride=128, report=None):
  """(features dict of numpy arrays, [FeatureInfo]) for SquadExamples."""
  validation.one_of("on_overflow", on_overflow, OVERFLOW_CHOICES)
  if doc_stride <= 0:
    raise ValueError(f"doc_stride must be positive, got {doc_stride}.")
  report = report if report is not None else errors.DropReport()
  special = tokenizer.special
  questions = bert_inputs.tokenize_texts(tokenizer,
                                            [e.question for e in examples])
  contexts = sorted({e.context for e in examples})
  offsets = tokenizer.tokenize_with_offsets(tf.constant(contexts))
  tokenized = dict(zip(contexts, zip(*(t.to_list() for t in offsets))))
  rows, types, starts, ends, infos = [], [], [], [], []
  for index, (example, question) in enumerate(zip(examples, questions)):
    ids, byte_starts, byte_ends = tokenized[example.context]
    byte_starts, byte_ends = np.asarray(byte_starts), np.asarray(byte_ends)
    budget = sequence_length - len(question) - 3
    if budget < 1 or (len(ids) > budget and on_overflow != "window"):
      error = errors.DataError(
          *example.source, f"question {example.question_id}: "
          f"{len(question) + len(ids)} tokens, but sequence_length="
          f"{sequence_length} leaves room for {sequence_length - 3}; pass "
          "on_overflow='window' or 'drop'", kind="too long")
      report.handle(error, "drop" if on_overflow == "drop" else "raise")
      continue
    answer = (_answer_tokens(example, byte_starts, byte_ends) if is_training
              else None)
    for window in _windows(len(ids), budget, doc_stride):
      window_ids = ids[window:window + budget]
      offset = len(question) + 2
      rows.append([special.cls] + question + [special.sep] + window_ids +
                  [special.sep])
      types.append([0] * offset + [1] * (len(window_ids) + 1))
      if answer is not None:
        first, last = answer[0] - window, answer[1] - window
        inside = first >= 0 and last < len(window_ids)
        starts.append(first + offset if inside else 0)
        ends.append(last + offset if inside else 0)
      infos.append(FeatureInfo(index, offset,
                               byte_starts[window:window + budget],
                               byte_ends[window:window + budget]))
  report.kept += len({info.example_index for info in infos})
  if report.total_dropped:
    logging.warning("squad.encode: %s. First: %s", report, report.examples[0])
  features = {
      "input_word_ids": bert_inputs.pad_rows(rows, sequence_length,
                                            special.pad),
      "input_type_ids": bert_inputs.pad_rows(types, sequence_length, 0),
      "input_mask": bert_inputs.pad_rows([[1] * len(r) for r in rows],
                                        sequence_length, 0),
  }
  if is_training:
    features["start_positions"] = np.asarray(starts, np.int32)
    features["end_positions"] = np.asarray(ends, np.int32)
  return features, infos


def gold_answers(examples):
  """{question id: [gold texts]} for squad_metrics.evaluate."""
  return {e.question_id: [text for text, _ in e.answers] for e in examples}
