"""Model Garden's checkpoint-converter scripts, importable side by side.

`official.nlp.tools.tf2_bert_encoder_checkpoint_converter` and its ALBERT
twin each define the same absl flags when imported, so the second import
in one process (pytest-xdist runs several test files in one worker) raises
DuplicateFlagError. `script(name)` imports one and removes the flags it
defined; the converter functions the tests call take arguments and read no
flag. Without Model Garden, the calling test file is skipped.
"""

import importlib
import sys

from absl import flags
import pytest


def script(module_name):
  if module_name in sys.modules:
    return sys.modules[module_name]
  before = set(flags.FLAGS)
  try:
    module = importlib.import_module(module_name)
  except ImportError as error:
    pytest.skip(f"Model Garden is not installed ({error}); see "
                "benchmarks/README.md", allow_module_level=True)
  for name in set(flags.FLAGS) - before:
    delattr(flags.FLAGS, name)
  return module
