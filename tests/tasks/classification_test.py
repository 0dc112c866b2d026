"""GLUE-style TSV and TFDS reading, encoding, head, losses and metrics."""

import numpy as np
import pytest
import tensorflow as tf

from thattn.data import bert_inputs
from thattn.data import errors as data_errors
from thattn.data import glue
from thattn.models import heads
from thattn.tasks import classification

MRPC = ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t1\t2\tThe cat sat on the mat.\tA cat was sitting on the mat.\n"
        "0\t3\t4\tStocks fell sharply.\tThe weather was sunny.\n")


def _write(tmp_path, text, name="train.tsv"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_read_pairs_with_header(tmp_path):
  examples = glue.read_tsv(_write(tmp_path, MRPC), "mrpc")
  assert [e.label for e in examples] == [1, 0]
  assert examples[0].text_b == "A cat was sitting on the mat."
  assert examples[1].source[1] == 3


def test_read_single_sentences_without_header_and_regression(tmp_path):
  cola = _write(tmp_path, "gj04\t1\t\tOur friends like it.\n"
                "gj04\t0\t*\tLike it our friends.\n", "cola.tsv")
  assert [(e.text_a, e.label) for e in glue.read_tsv(cola, "cola")] == [
      ("Our friends like it.", 1), ("Like it our friends.", 0)]
  stsb = _write(tmp_path, "index\tgenre\tfilename\tyear\told_index\tsource1"
                "\tsource2\tsentence1\tsentence2\tscore\n"
                "0\tx\tx\tx\tx\tx\tx\tA plane takes off.\tA jet departs.\t"
                "4.2\n", "stsb.tsv")
  (example,) = glue.read_tsv(stsb, "stsb")
  assert example.label == pytest.approx(4.2)
  mnli = _write(tmp_path, "sentence1\tsentence2\tgold_label\n"
                "P.\tH.\tneutral\n", "mnli.tsv")
  assert glue.read_tsv(mnli, "mnli_matched")[0].label == 1  # TFDS's order


@pytest.mark.parametrize("text,message", [
    ("", r"train.tsv:1: empty file"),
    ("\n\n", r"train.tsv:1: empty file"),
    (MRPC + "1\tonly two fields\n",
     r"train.tsv:4: expected at least 5 tab-separated fields, got 2"),
    (MRPC + "maybe\t5\t6\tA.\tB.\n", r"train.tsv:4: unknown label 'maybe'"),
    (MRPC + "1\t5\t6\t \tB.\n", r"train.tsv:4: empty text field"),
    ("Quality\tX\n1\t2\n", r"train.tsv:1: header has no column '#1 String'"),
])
def test_bad_rows_name_file_and_line(tmp_path, text, message):
  with pytest.raises(data_errors.DataError, match=message):
    glue.read_tsv(_write(tmp_path, text), "mrpc")


def test_bad_utf8_names_file_and_line(tmp_path):
  path = tmp_path / "train.tsv"
  path.write_bytes(MRPC.encode() + "1\t5\t6\tCaf\xe9.\tB.\n".encode(
      "latin-1"))
  with pytest.raises(data_errors.DataError, match=r"train.tsv:4: not UTF-8"):
    glue.read_tsv(str(path), "mrpc")


def test_drop_counts_bad_rows(tmp_path):
  report = data_errors.DropReport()
  path = _write(tmp_path, MRPC + "1\tonly two fields\nx\t1\t2\tA.\tB.\n")
  examples = glue.read_tsv(path, "mrpc", on_error="drop", report=report)
  assert len(examples) == 2
  assert report.kept == 2 and report.total_dropped == 2
  assert report.dropped == {"too few fields": 1, "bad label": 1}
  assert "dropped 2" in str(report)
  assert report.examples[0].startswith(f"{path}:4:")


def test_encode_pairs_and_overflow(wordpiece, tmp_path):
  examples = glue.read_tsv(_write(tmp_path, MRPC), "mrpc")
  features = bert_inputs.encode(examples, wordpiece, 32)
  ids, types, mask = (features[k] for k in ("input_word_ids",
                                            "input_type_ids", "input_mask"))
  special = wordpiece.special
  length = mask[0].sum()
  assert ids[0, 0] == special.cls and ids[0, length - 1] == special.sep
  first_b = np.flatnonzero(types[0])[0]
  assert ids[0, first_b - 1] == special.sep
  assert (ids[0, length:] == special.pad).all()
  np.testing.assert_array_equal(features["labels"], [1, 0])
  with pytest.raises(data_errors.DataError,
                     match=r"train.tsv:2: \d+ tokens, but sequence_length=8"):
    bert_inputs.encode(examples, wordpiece, 8)
  report = data_errors.DropReport()
  dropped = bert_inputs.encode(examples, wordpiece, 12,
                                   on_overflow="drop", report=report)
  assert report.kept + report.total_dropped == 2
  assert len(dropped["input_word_ids"]) == report.kept
  truncated = bert_inputs.encode(examples, wordpiece, 8,
                                    on_overflow="truncate")
  assert (truncated["input_mask"].sum(1) == 8).all()
  data = bert_inputs.dataset(features, batch_size=2)
  inputs, labels = next(iter(data))
  assert inputs["input_word_ids"].shape == (2, 32) and labels.shape == (2,)


def test_head_losses_and_metrics():
  head = heads.ClassificationHead(3, inner_dim=16)
  logits = head(tf.random.normal([4, 8]))
  assert logits.shape == (4, 3)
  assert float(classification.classification_loss(
      tf.constant([0, 1, 2, 0]), logits)) > 0
  regression = heads.ClassificationHead(1)
  assert regression(tf.random.normal([4, 8])).shape == (4,)
  assert float(classification.regression_loss(
      tf.constant([1.0, 2.0]), tf.constant([1.0, 4.0]))) == 2.0
  config = head.get_config()
  assert heads.ClassificationHead.from_config(config).inner_dim == 16

  labels, predictions = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
  assert classification.accuracy(labels, predictions) == 0.6
  assert classification.f1(labels, predictions) == pytest.approx(2 / 3)
  # TP=2 TN=1 FP=1 FN=1: (2 - 1) / sqrt(3 * 3 * 2 * 2) = 1/6.
  assert classification.matthews_corrcoef(labels, predictions) == \
      pytest.approx(1 / 6)
  assert classification.spearman([1, 2, 3, 4], [10, 20, 30, 100]) == \
      pytest.approx(1.0)
  assert classification.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
  assert classification.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == \
      pytest.approx(0.9486833)  # ties take their average rank
  metrics = classification.glue_metrics(glue.get_task("mrpc"), labels,
                                        np.eye(2)[predictions])
  assert metrics == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})


def test_tfds_glue_with_mock_data():
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=5):
    examples = glue.read_tfds("mrpc", "train")
    stsb = glue.read_tfds("stsb", "validation")
  assert len(examples) == 5
  assert all(e.text_b is not None and e.label in (0, 1) for e in examples)
  assert examples[0].source[0] == "glue/mrpc[train]"
  assert all(isinstance(e.label, float) for e in stsb)
