"""SQuAD v1.1: checked reading, features, windows, head, loss, predictions."""

import json

import numpy as np
import pytest
import tensorflow as tf

from thattn.data import errors as data_errors
from thattn.data import squad as squad_data
from thattn.models import heads
from thattn.tasks import squad
from thattn.tasks import squad_metrics

CONTEXT = ("The Normans were the people who in the 10th and 11th centuries "
           "gave their name to Normandy, a region in France. They were "
           "descended from Norse raiders and pirates from Denmark, Iceland "
           "and Norway.")


def _squad(qas, context=CONTEXT):
  return {"version": "1.1", "data": [{"title": "Normans", "paragraphs": [
      {"context": context, "qas": qas}]}]}


def _qa(question_id, question, *answers):
  return {"id": question_id, "question": question, "answers": [
      {"text": text, "answer_start": CONTEXT.index(text)} for text in answers]}


QAS = [_qa("q1", "In what country is Normandy located?", "France"),
       _qa("q2", "When were the Normans in Normandy?",
           "10th and 11th centuries", "in the 10th and 11th centuries"),
       _qa("q3", "From which countries did the Norse originate?",
           "Denmark, Iceland and Norway")]


def _write(tmp_path, data, name="train.json"):
  path = tmp_path / name
  path.write_text(json.dumps(data, indent=1))  # one key per line
  return str(path)


def test_read(tmp_path):
  examples = squad_data.read_squad(_write(tmp_path, _squad(QAS)))
  assert [e.question_id for e in examples] == ["q1", "q2", "q3"]
  assert examples[1].answers[1] == ("in the 10th and 11th centuries", 32)
  assert squad_data.gold_answers(examples)["q1"] == ["France"]


def test_answer_outside_context_names_file_line_and_question(tmp_path):
  bad = _qa("q9", "Who?", "France")
  bad["answers"][0]["answer_start"] += 3
  path = _write(tmp_path, _squad(QAS[:1] + [bad]))
  line = next(i for i, text in enumerate(open(path), 1) if '"q9"' in text)
  with pytest.raises(data_errors.DataError,
                     match=rf"train.json:{line}: question q9: answer "
                     r"'France' at answer_start=\d+ is not in its context"):
    squad_data.read_squad(path)
  report = data_errors.DropReport()
  examples = squad_data.read_squad(path, on_error="drop", report=report)
  assert len(examples) == 1
  assert report.dropped == {"answer not in context": 1} and report.kept == 1


def test_empty_and_invalid_files(tmp_path):
  empty = tmp_path / "empty.json"
  empty.write_text("  \n")
  with pytest.raises(ValueError, match=r"empty.json:1: empty file"):
    squad_data.read_squad(str(empty))
  broken = tmp_path / "broken.json"
  broken.write_text('{"data": [\n  {"title": }\n]}')
  with pytest.raises(ValueError, match=r"broken.json:2: invalid JSON"):
    squad_data.read_squad(str(broken))


def _oracle_logits(features, length):
  """Logits that put all mass on the labeled start and end."""
  starts = tf.one_hot(features["start_positions"], length) * 20.0
  ends = tf.one_hot(features["end_positions"], length) * 20.0
  return starts.numpy(), ends.numpy()


@pytest.mark.parametrize("name", ["wordpiece", "sentencepiece", "albert"])
def test_labels_point_at_the_answers(request, tmp_path, name):
  tokenizer = request.getfixturevalue(name)
  examples = squad_data.read_squad(_write(tmp_path, _squad(QAS)))
  features, infos = squad_data.encode(examples, tokenizer, 160, is_training=True)
  assert len(infos) == 3
  predictions = squad.predict(examples, infos,
                              *_oracle_logits(features, 160))
  assert squad_metrics.evaluate(squad_data.gold_answers(examples), predictions) \
      == {"exact_match": 100.0, "f1": 100.0}


def test_windows_cover_long_contexts(wordpiece, tmp_path):
  examples = squad_data.read_squad(_write(tmp_path, _squad(QAS)))
  with pytest.raises(data_errors.DataError,
                     match=r"train.json:\d+: question q1: \d+ tokens, but "
                     "sequence_length=32"):
    squad_data.encode(examples, wordpiece, 32, is_training=True)
  report = data_errors.DropReport()
  dropped, _ = squad_data.encode(examples, wordpiece, 32, is_training=True,
                            on_overflow="drop", report=report)
  assert len(dropped["input_word_ids"]) == 0 and report.total_dropped == 3
  features, infos = squad_data.encode(examples, wordpiece, 32, is_training=True,
                                 on_overflow="window", doc_stride=8)
  assert len(infos) > 3
  assert features["input_word_ids"].shape[1] == 32
  # Windows without the whole answer point at [CLS]; the others recover it.
  labeled = features["start_positions"] > 0
  assert labeled.any() and (~labeled).any()
  predictions = squad.predict(examples, infos, *_oracle_logits(features, 32))
  assert predictions["q1"] == "France"


def test_head_and_loss():
  head = heads.SpanHead()
  features = {"input_type_ids": tf.constant([[0, 0, 1, 1, 0]]),
              "input_mask": tf.constant([[1, 1, 1, 1, 0]])}
  mask = squad.answer_mask(features)
  np.testing.assert_array_equal(mask, [[True, False, True, True, False]])
  start, end = head(tf.random.normal([1, 5, 8]), mask=mask)
  assert start.shape == end.shape == (1, 5)
  assert start.numpy()[0, 1] < -1e8 and start.numpy()[0, 4] < -1e8
  loss = squad.span_loss(tf.constant([2]), tf.constant([3]), start, end)
  assert loss.shape == () and float(loss) > 0
  assert heads.SpanHead.from_config(head.get_config()).kernel_initializer \
      == "glorot_uniform"
