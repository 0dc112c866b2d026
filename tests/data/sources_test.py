"""Document sources: text files by glob, TFRecords, TFDS (mocked)."""

import sys

import pytest

from thattn.data import errors as data_errors
from thattn.data import sources
from thattn.data import squad as squad_data


def _texts(dataset):
  return [t.decode("utf-8") for t in dataset.as_numpy_iterator()]


def test_one_document_per_file_in_sorted_order(tmp_path):
  (tmp_path / "b.txt").write_text("Second file.\nTwo lines.\n")
  (tmp_path / "a.txt").write_text("First file.\r\n")
  assert _texts(sources.text_files(str(tmp_path / "*.txt"))) == [
      "First file.", "Second file.\nTwo lines."]


def test_blank_line_separated_documents(tmp_path):
  (tmp_path / "corpus.txt").write_text(
      "\n\nDoc one, line one.\nDoc one, line two.\n \t\n\n"
      "Doc two.\r\n\r\nDoc three.\n\n")
  assert _texts(sources.text_files(str(tmp_path / "corpus.txt"),
                                   split_blank_lines=True)) == [
                                       "Doc one, line one.\nDoc one, line two.",
                                       "Doc two.", "Doc three."]


def test_bad_files_name_file_and_line(tmp_path):
  (tmp_path / "good.txt").write_text("Some text.\n")
  (tmp_path / "empty.txt").write_text("")
  with pytest.raises(data_errors.DataError, match=r"empty.txt:1: empty file"):
    sources.text_files(str(tmp_path / "*.txt"))
  (tmp_path / "empty.txt").write_text("  \n\n\t\n")
  with pytest.raises(ValueError, match=r"empty.txt:1: empty file"):
    sources.text_files(str(tmp_path / "*.txt"))
  (tmp_path / "latin1.txt").write_bytes("ok\nline two\ncaf\xe9\n".encode(
      "latin-1"))
  report = data_errors.DropReport()
  documents = sources.text_files(str(tmp_path / "*.txt"), on_error="drop",
                                 report=report)
  assert _texts(documents) == ["Some text."]
  assert report.dropped == {"empty file": 1, "not UTF-8": 1}
  assert any("latin1.txt:3: not UTF-8" in e for e in report.examples)
  with pytest.raises(ValueError, match="No files match"):
    sources.text_files(str(tmp_path / "*.md"))


def test_tfrecords_round_trip(tmp_path):
  documents = ["First document.", "Second, with ünïcode."]
  path = str(tmp_path / "docs.tfrecord")
  sources.write_text_tfrecords(path, documents)
  assert _texts(sources.tfrecord_texts(str(tmp_path / "*.tfrecord"))) == \
      documents


@pytest.mark.parametrize("name", ["c4/en", "lm1b", "wikipedia/20230601.en"])
def test_tfds_text_datasets_with_mock_data(name):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=4):
    texts = list(sources.tfds_texts(name, "train").as_numpy_iterator())
  assert len(texts) == 4 and all(isinstance(t, bytes) for t in texts)


def test_tfds_squad_with_mock_data_reports_bad_answers():
  tfds = pytest.importorskip("tensorflow_datasets")
  report = data_errors.DropReport()
  with tfds.testing.mock_data(num_examples=3):
    # Mock answers are random strings, so none lies in its random context.
    examples = squad_data.read_tfds("train", on_error="drop", report=report)
    with pytest.raises(data_errors.DataError,
                       match=r"squad/v1.1\[train\]:0: question"):
      squad_data.read_tfds("train")
  assert len(examples) + report.total_dropped == 3
  assert report.kept == len(examples)


def test_missing_tfds_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(ImportError, match=r"pip install 'thattn\[tfds\]'"):
    sources.tfds_texts("lm1b")
