"""thattn: talking-heads attention and its relatives for tf-keras.

`import thattn` is cheap (no TensorFlow): the public subpackages load on
first use, so `thattn.models.load(model_dir)`, `thattn.layers....` and
`thattn.optimizers....` work after a plain `import thattn`. Mesh
TensorFlow (`thattn.mtf`) is never loaded this way; import it by name.
"""

import importlib

__version__ = "0.1.0"

# The public contract's subpackages (docs/architecture.md). Loaded lazily
# (PEP 562): thattn's own modules import them by name, never through here.
_PUBLIC = ("layers", "models", "optimizers")


def __getattr__(name):
  if name in _PUBLIC:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_PUBLIC))
