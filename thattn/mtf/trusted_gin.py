"""A model_dir's gin text as data: which of its lines thattn lets gin run.

gin runs two kinds of line that reach beyond the text: `import` (and `from
... import`), which imports a module and so runs its code, and `include`,
which reads another file. A downloaded model_dir's operative_config.gin may
hold either; `trusted_text` keeps the imports an mtf model_dir needs and
nothing else.
"""

import importlib
import logging
import re

_IMPORT = re.compile(r"^\s*import\s+([A-Za-z_][\w.]*)(\s+as\s+\w+)?\s*(#.*)?$")
_FROM_IMPORT = re.compile(r"^\s*from\s+([A-Za-z_][\w.]*)\s+import\b")
_INCLUDE = re.compile(r"^\s*include\s*['\"]")
_LOG = logging.getLogger("thattn")


def trusted_text(gin_text):
  """`gin_text` with only the imports an mtf model_dir needs.

  A downloaded model_dir is data: its gin text may name any module in an
  `import` (or `from ... import`) line, and importing one runs its code.
  Only `mesh_tensorflow` modules are imported; every other import line
  (T5's `t5.*`, gin's `__gin__` dynamic registration, anything else) is
  commented out and named in a warning, as is a mesh_tensorflow module
  that fails to import. `include` lines are refused: gin would read the
  file they name, anywhere, and an operative config is self-contained.
  A comment, not a deletion, keeps gin's line numbers.
  """
  lines = gin_text.splitlines()
  dropped = []
  for index, line in enumerate(lines):
    if _INCLUDE.match(line):
      raise ValueError(
          f"the gin config's line {index + 1}, {line.strip()!r}, includes "
          "another file; thattn does not follow gin includes from a "
          "model_dir (an operative_config.gin is self-contained): paste the "
          "included bindings in its place.")
    match = _IMPORT.match(line) or _FROM_IMPORT.match(line)
    if not match:
      continue
    module = match.group(1)
    if module == "mesh_tensorflow" or module.startswith("mesh_tensorflow."):
      try:
        importlib.import_module(module)
        continue
      except Exception:  # pylint: disable=broad-except
        reason = "not importable"  # as gin would fail to import it
    else:
      reason = "not a mesh_tensorflow module"
    lines[index] = f"# thattn dropped ({reason}): {line.strip()}"
    dropped.append(module)
  if dropped:
    _LOG.warning("thattn did not import these modules named in the gin "
                 "config (only mesh_tensorflow modules are imported from a "
                 "model_dir): %s", ", ".join(dropped))
  return "\n".join(lines)
