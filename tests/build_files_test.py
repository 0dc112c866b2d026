"""The BUILD files cover the package: every module and every test file.

Bazel only sees what the BUILD files list, and `bazel query` is not part of
the test run, so this reads them as text: each `thattn/**/*.py` must appear
in its package's BUILD, and each `tests/**/*_test.py` must have a target.
"""

import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

if "TEST_SRCDIR" in os.environ:
  pytest.skip("Under Bazel the runfiles hold only declared files; this test "
              "reads the source tree and runs under plain pytest.",
              allow_module_level=True)


def _listed_files(build_file):
  return set(re.findall(r'"([\w/.-]+\.py)"', build_file.read_text()))


def _python_files(pattern):
  return sorted(path for path in ROOT.glob(pattern)
                if "__pycache__" not in path.parts)


@pytest.mark.parametrize(
    "module", _python_files("thattn/**/*.py"),
    ids=lambda path: str(path.relative_to(ROOT)))
def test_every_module_is_in_its_package_build(module):
  build = module.parent / "BUILD"
  assert build.exists(), f"{build.relative_to(ROOT)} is missing"
  assert module.name in _listed_files(build), (
      f"{module.relative_to(ROOT)} is not in {build.relative_to(ROOT)}")


@pytest.mark.parametrize(
    "test_file", _python_files("tests/**/*_test.py"),
    ids=lambda path: str(path.relative_to(ROOT)))
def test_every_test_file_has_a_target(test_file):
  build = test_file.parent / "BUILD"
  assert build.exists(), f"{build.relative_to(ROOT)} is missing"
  assert test_file.name in _listed_files(build), (
      f"{test_file.relative_to(ROOT)} has no pytest_test in "
      f"{build.relative_to(ROOT)}")
