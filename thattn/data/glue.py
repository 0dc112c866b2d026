"""GLUE-style sentence(-pair) data: TSV files and TFDS `glue/*`.

`read_tsv` reads the files of the GLUE distribution (`train.tsv`,
`dev.tsv`, MNLI's `dev_matched.tsv`, ...) or any TSV laid out alike, into
`Example`s that remember their `path:line`. Fields are split on tabs with no
quote processing (GLUE's files contain unbalanced quotes). Label ids follow
TFDS's label order, so TSV and TFDS data agree.

A row with too few fields, an empty text or an unknown label is a
`DataError` naming the file and line, unless on_error="drop", which counts
it in the `DropReport`. An empty file is always an error.
"""

import dataclasses
import typing

from thattn.data import errors


@dataclasses.dataclass(frozen=True)
class Example:
  text_a: str
  text_b: typing.Optional[str]
  label: typing.Union[int, float, None]
  source: tuple  # (path or dataset name, line or index)


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """Where a GLUE task keeps its texts and label, in TSV and in TFDS.

  TSV columns are header names, or ints when the file has no header.
  label_names=None means regression (a float label).
  """
  name: str
  tsv_text_a: typing.Union[str, int]
  tsv_text_b: typing.Union[str, int, None]
  tsv_label: typing.Union[str, int]
  label_names: typing.Optional[tuple]
  tsv_label_values: typing.Optional[tuple]  # TSV spelling of each label
  tfds_text_a: str
  tfds_text_b: typing.Optional[str]
  metrics: tuple
  has_header: bool = True

  @property
  def num_classes(self):
    return 1 if self.label_names is None else len(self.label_names)

  @property
  def is_regression(self):
    return self.label_names is None


_NLI = ("entailment", "not_entailment")
GLUE_TASKS = {task.name: task for task in (
    GlueTask("cola", 3, None, 1, ("unacceptable", "acceptable"), ("0", "1"),
             "sentence", None, ("matthews_corrcoef",), has_header=False),
    GlueTask("sst2", "sentence", None, "label", ("negative", "positive"),
             ("0", "1"), "sentence", None, ("accuracy",)),
    GlueTask("mrpc", "#1 String", "#2 String", "Quality",
             ("not_equivalent", "equivalent"), ("0", "1"), "sentence1",
             "sentence2", ("accuracy", "f1")),
    GlueTask("qqp", "question1", "question2", "is_duplicate",
             ("not_duplicate", "duplicate"), ("0", "1"), "question1",
             "question2", ("accuracy", "f1")),
    GlueTask("stsb", "sentence1", "sentence2", "score", None, None,
             "sentence1", "sentence2", ("pearson", "spearman")),
    GlueTask("mnli", "sentence1", "sentence2", "gold_label",
             ("entailment", "neutral", "contradiction"),
             ("entailment", "neutral", "contradiction"), "premise",
             "hypothesis", ("accuracy",)),
    GlueTask("qnli", "question", "sentence", "label", _NLI, _NLI, "question",
             "sentence", ("accuracy",)),
    GlueTask("rte", "sentence1", "sentence2", "label", _NLI, _NLI,
             "sentence1", "sentence2", ("accuracy",)),
    GlueTask("wnli", "sentence1", "sentence2", "label",
             ("not_entailment", "entailment"), ("0", "1"), "sentence1",
             "sentence2", ("accuracy",)),
)}


def get_task(name):
  base = name.split("_")[0]  # mnli_matched, mnli_mismatched -> mnli
  if base not in GLUE_TASKS:
    raise ValueError(f"Unknown GLUE task {name!r}; known: "
                     f"{sorted(GLUE_TASKS)}.")
  return GLUE_TASKS[base]


def _column_index(header, column, path):
  if column is None or isinstance(column, int):
    return column
  if column not in header:
    raise errors.DataError(path, 1, f"header has no column {column!r}; "
                                f"it has {header}", kind="bad header")
  return header.index(column)


def read_tsv(path, task, *, labeled=True, on_error="raise", report=None):
  """Examples from a GLUE-style TSV file. task: a name or a GlueTask.

  labeled=False reads test files (no label column needed; label None).
  """
  task = get_task(task) if isinstance(task, str) else task
  errors.check_on_error(on_error)
  lines = errors.read_text(path).split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  if not any(line.strip() for line in lines):
    raise errors.DataError(path, 1, "empty file", kind="empty file")
  first = 0
  header = None
  if task.has_header:
    header, first = lines[0].rstrip("\r").split("\t"), 1
  columns = [_column_index(header, c, path) for c in
             (task.tsv_text_a, task.tsv_text_b,
              task.tsv_label if labeled else None)]
  needed = max(c for c in columns if c is not None) + 1
  numbered = enumerate(lines[first:], start=first + 1)
  return errors.parse_records(
      numbered, lambda item: _parse_row(item[1].rstrip("\r"), columns,
                                        needed, task, path, item[0]),
      on_error=on_error, report=report, source=f"read_tsv({path})")


def _parse_row(line, columns, needed, task, path, number):
  fields = line.split("\t")
  if len(fields) < needed:
    raise errors.DataError(
        path, number, f"expected at least {needed} tab-separated fields, got "
        f"{len(fields)}: {line[:80]!r}", kind="too few fields")
  a_column, b_column, label_column = columns
  text_a = fields[a_column].strip()
  text_b = None if b_column is None else fields[b_column].strip()
  if not text_a or text_b == "":
    raise errors.DataError(path, number, "empty text field",
                                kind="empty text")
  label = None
  if label_column is not None:
    label = _parse_label(fields[label_column].strip(), task, path, number)
  return Example(text_a, text_b, label, (path, number))


def _parse_label(value, task, path, number):
  if task.is_regression:
    try:
      return float(value)
    except ValueError:
      raise errors.DataError(path, number, f"label {value!r} is not a "
                                  "number", kind="bad label") from None
  if value not in task.tsv_label_values:
    raise errors.DataError(
        path, number, f"unknown label {value!r}; expected one of "
        f"{task.tsv_label_values}", kind="bad label")
  return task.tsv_label_values.index(value)


def read_tfds(task, split, *, data_dir=None, download=False, labeled=True):
  """Examples from TFDS `glue/<task>` (needs tensorflow-datasets).

  Test splits carry label -1 in TFDS; pass labeled=False for them.
  """
  from thattn.data import sources  # pylint: disable=g-import-not-at-top
  tfds = sources.import_tfds()
  spec = get_task(task)
  name = f"glue/{task}"
  dataset = tfds.load(name, split=split, data_dir=data_dir, download=download)
  examples = []
  for record in tfds.as_numpy(dataset):
    text_b = (record[spec.tfds_text_b].decode("utf-8") if spec.tfds_text_b
              else None)
    label = None
    if labeled:
      label = (float(record["label"]) if spec.is_regression
               else int(record["label"]))
      if not spec.is_regression and not 0 <= label < spec.num_classes:
        raise errors.DataError(f"{name}[{split}]", int(record["idx"]),
                                    f"label {label} is out of range; test "
                                    "splits need labeled=False")
    examples.append(Example(record[spec.tfds_text_a].decode("utf-8"), text_b,
                            label, (f"{name}[{split}]", int(record["idx"]))))
  return examples
