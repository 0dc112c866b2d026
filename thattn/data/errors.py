"""Errors that name the offending file and line, and counts of what was dropped.

Readers in `thattn.data` never skip bad data quietly: by default they raise
`DataError`, a `ValueError` whose message starts with `path:line:`. Where a
reader takes `on_error="drop"`, each dropped record is counted in a
`DropReport`, which the reader returns or logs, so the loss is visible.
`parse_records` is that loop, written once for every reader.
"""

import collections
import dataclasses
import logging

from thattn.core import validation

ON_ERROR_CHOICES = ("raise", "drop")


class DataError(ValueError):
  """Bad input data, located as `path:line: message`."""

  def __init__(self, path, line, message, kind="bad record"):
    self.path = str(path)
    self.line = line
    self.reason = message
    self.kind = kind  # a short category, the key of DropReport.dropped
    location = self.path if line is None else f"{self.path}:{line}"
    super().__init__(f"{location}: {message}")


def read_text(path):
  """A whole file as str; bad UTF-8 is a DataError naming its line."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError(path, data.count(b"\n", 0, e.start) + 1,
                    f"not UTF-8: {e.reason}", kind="not UTF-8") from None


def check_on_error(on_error):
  validation.one_of("on_error", on_error, ON_ERROR_CHOICES)


@dataclasses.dataclass
class DropReport:
  """What a reader dropped under `on_error="drop"`: counts and first examples.

  `kept` counts records that made it through; `dropped` maps a reason to a
  count; `examples` keeps the first few `path:line: reason` strings.
  """
  kept: int = 0
  dropped: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  examples: list = dataclasses.field(default_factory=list)
  max_examples: int = 5

  def handle(self, error, on_error):
    """Raises `error` or records it as dropped, as `on_error` says."""
    check_on_error(on_error)
    if on_error == "raise":
      raise error
    self.dropped[error.kind] += 1
    if len(self.examples) < self.max_examples:
      self.examples.append(str(error))

  @property
  def total_dropped(self):
    return sum(self.dropped.values())

  def __str__(self):
    if not self.total_dropped:
      return f"kept {self.kept}, dropped 0"
    reasons = ", ".join(f"{count} {reason}"
                        for reason, count in sorted(self.dropped.items()))
    return f"kept {self.kept}, dropped {self.total_dropped} ({reasons})"


def parse_records(records, parse, *, on_error="raise", report=None,
                  source="records"):
  """[parse(record) for record in records], bad ones raised or dropped.

  A record whose `parse` raises `DataError` is raised (on_error="raise") or
  counted in `report` (on_error="drop"). The kept records are counted too,
  and a warning naming `source` says what was dropped, so nothing is lost
  without a trace.

  Returns:
    The parsed records that were kept, in order.
  """
  check_on_error(on_error)
  report = report if report is not None else DropReport()
  parsed = []
  for record in records:
    try:
      parsed.append(parse(record))
    except DataError as error:
      report.handle(error, on_error)
  report.kept += len(parsed)
  if report.total_dropped:
    logging.warning("%s: %s. First: %s", source, report, report.examples[0])
  return parsed
