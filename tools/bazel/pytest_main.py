"""Entry point of every pytest_test: runs the files named in argv under pytest."""

import os
import sys

import pytest


class _CollectionSkips:
  """Notes whether a whole module was skipped, e.g. by pytest.importorskip."""

  def __init__(self):
    self.skipped = False

  def pytest_collectreport(self, report):
    if report.skipped:
      self.skipped = True


def main():
  # The runfiles tree is no place for a .pytest_cache.
  args = ["-q", "-p", "no:cacheprovider"]
  # Bazel reads test results from this file if the test writes one.
  if os.environ.get("XML_OUTPUT_FILE"):
    args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
  # `bazel test --test_filter=EXPR` arrives here; pytest reads it as -k EXPR.
  if os.environ.get("TESTBRIDGE_TEST_ONLY"):
    args += ["-k", os.environ["TESTBRIDGE_TEST_ONLY"]]
  skips = _CollectionSkips()
  code = pytest.main(args + sys.argv[1:], plugins=[skips])
  # A module that skips itself (an optional dependency is missing) collects
  # no tests, which pytest reports as exit code 5. That is a pass, not an error.
  if code == pytest.ExitCode.NO_TESTS_COLLECTED and skips.skipped:
    return 0
  return code


if __name__ == "__main__":
  sys.exit(main())
