"""thattn: talking-heads attention and its relatives, for Keras 3 and tf_keras.

`import thattn` is cheap (no framework is imported): the public subpackages
load on first use, so after a plain `import thattn`

- `thattn.keras3`: the attention layers for Keras 3 (JAX, PyTorch,
  TensorFlow); `thattn.keras3.models` builds BERT, ALBERT and T5 with them;
- `thattn.layers`: the same layers for tf_keras (Keras 2);
- `thattn.models`: the configs and presets, the tf_keras BERT, ALBERT and
  T5 builders and `load(model_dir)`;
- `thattn.optimizers`: Adafactor and the inverse-square-root schedule
  (tf_keras; Keras 3's are `thattn.keras3.optimizers`);
- `thattn.sharding`: the one rules table from logical axes to mesh axes.

What each needs installed is in `thattn.core.requirements`; a missing framework is an
ImportError naming the pip command. Mesh TensorFlow (`thattn.mtf`) is never
loaded this way; import it by name.
"""

import importlib

__version__ = "0.2.0"

# The public subpackages (docs/architecture.md). Loaded lazily (PEP 562):
# thattn's own modules import them by name, never through here.
_PUBLIC = ("keras3", "layers", "models", "optimizers", "sharding")


def __getattr__(name):
  if name in _PUBLIC:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_PUBLIC))
