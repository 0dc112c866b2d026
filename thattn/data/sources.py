"""Where documents come from: text files, TFRecords and TFDS.

Each function returns a `tf.data.Dataset` of documents, one string scalar per
element, which the pipelines (`masking`, `sentence_pairs`, `span_corruption`)
consume. A document's lines are its segments (sentences or paragraphs).

TFDS is optional: `tfds_texts` imports `tensorflow_datasets` only when called
and says how to install it when it is missing.
"""

import logging

import tensorflow as tf

from thattn.core import requirements
from thattn.ops import autograph
from thattn.data import errors

# TFDS text datasets and the feature that holds their text.
TFDS_TEXT_FEATURES = {"c4": "text", "lm1b": "text", "wikipedia": "text"}
_VALIDATE_CHUNK = 1 << 20


def _glob(pattern):
  paths = sorted(tf.io.gfile.glob(pattern))
  if not paths:
    raise ValueError(f"No files match {pattern!r}.")
  return paths


def validate_text_file(path):
  """Raises DataError for an empty or whitespace-only file, or bad UTF-8.

  Reads the file once, streaming, so the cost is one pass over the bytes.
  """
  has_text = False
  with tf.io.gfile.GFile(path, "rb") as f:
    line_number, carry = 1, b""
    while True:
      chunk = f.read(_VALIDATE_CHUNK)
      if not chunk and not carry:
        break
      data = carry + chunk
      # Decode whole lines only, so a UTF-8 sequence is never cut in two.
      cut = data.rfind(b"\n") + 1 if chunk else len(data)
      lines, carry = data[:cut], data[cut:]
      try:
        text = lines.decode("utf-8")
      except UnicodeDecodeError as e:
        bad_line = line_number + lines.count(b"\n", 0, e.start)
        raise errors.DataError(path, bad_line, f"not UTF-8: {e.reason} "
                                    f"at byte {e.start} of this read",
                                    kind="not UTF-8") from None
      has_text = has_text or bool(text.strip())
      line_number += lines.count(b"\n")
      if not chunk:
        break
  if not has_text:
    raise errors.DataError(path, 1, "empty file (no text)",
                                kind="empty file")


def text_files(pattern, *, split_blank_lines=False, validate=True,
               on_error="raise", report=None):
  """Documents from the text files matching a glob pattern, in sorted order.

  split_blank_lines=False: one document per file. True: documents are
  separated by one or more blank lines. Windows line ends become "\\n", and
  each document is stripped of surrounding whitespace.

  validate: first check every file (empty, whitespace-only or not UTF-8 is a
  DataError naming the file and line). on_error="drop" skips such files
  instead, counting them in `report` (a DropReport) and in a log line.
  """
  errors.check_on_error(on_error)
  report = report if report is not None else errors.DropReport()
  paths = []
  for path in _glob(pattern):
    if validate:
      try:
        validate_text_file(path)
      except errors.DataError as e:
        report.handle(e, on_error)
        continue
    paths.append(path)
    report.kept += 1
  if report.total_dropped:
    logging.warning("text_files(%r): %s. First: %s", pattern, report,
                    report.examples[0])
  if not paths:
    raise ValueError(f"No usable files match {pattern!r}: {report}.")
  files = tf.data.Dataset.from_tensor_slices(paths)
  texts = files.map(_read_text, num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
  if not split_blank_lines:
    return texts
  return texts.flat_map(autograph.unconverted(
      lambda text: tf.data.Dataset.from_tensor_slices(
          _split_blank_lines(text))))


@autograph.unconverted
def _read_text(path):
  text = tf.strings.regex_replace(tf.io.read_file(path), "\r\n?", "\n")
  return tf.strings.strip(text)


def _split_blank_lines(text):
  """Splits on runs of blank lines (lines holding only spaces or tabs)."""
  text = tf.strings.regex_replace(text, r"\n[ \t]*\n(?:[ \t]*\n)*", "\n\n")
  documents = tf.strings.strip(tf.strings.split(text, "\n\n"))
  return tf.boolean_mask(documents, tf.strings.length(documents) > 0)


def write_text_tfrecords(path, documents, *, feature="text"):
  """Writes documents as tf.train.Examples with one bytes feature."""
  with tf.io.TFRecordWriter(path) as writer:
    for document in documents:
      value = document.encode("utf-8") if isinstance(document, str) \
          else document
      example = tf.train.Example(features=tf.train.Features(feature={
          feature: tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[value]))}))
      writer.write(example.SerializeToString())


def tfrecord_texts(pattern, *, feature="text", compression_type=None):
  """Documents from a bytes feature of tf.train.Examples in TFRecord files."""
  paths = _glob(pattern)
  records = tf.data.TFRecordDataset(paths, compression_type=compression_type,
                                    num_parallel_reads=tf.data.AUTOTUNE)
  spec = {feature: tf.io.FixedLenFeature([], tf.string)}
  return records.map(autograph.unconverted(
      lambda record: tf.io.parse_single_example(record, spec)[feature]),
                     num_parallel_calls=tf.data.AUTOTUNE)


def import_tfds():
  """tensorflow_datasets, or an ImportError that says what to install."""
  try:
    import tensorflow_datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "TFDS sources need tensorflow-datasets: "
        f"{requirements.install_command('tfds')} (or pip install "
        "tensorflow-datasets).") from e
  return tensorflow_datasets


def tfds_texts(name, split="train", *, feature=None, data_dir=None,
               shuffle_files=False, download=False):
  """Documents from a TFDS text dataset: "c4/en", "lm1b", "wikipedia/...".

  feature defaults to TFDS_TEXT_FEATURES for the dataset's base name.
  download=False: the data must already be prepared in data_dir.
  """
  tfds = import_tfds()
  base = name.split("/")[0]
  feature = feature or TFDS_TEXT_FEATURES.get(base)
  if feature is None:
    raise ValueError(f"No text feature known for TFDS dataset {name!r}; pass "
                     f"feature=. Known: {sorted(TFDS_TEXT_FEATURES)}.")
  dataset = tfds.load(name, split=split, data_dir=data_dir,
                      shuffle_files=shuffle_files, download=download)
  return dataset.map(autograph.unconverted(lambda example: example[feature]),
                     num_parallel_calls=tf.data.AUTOTUNE)
