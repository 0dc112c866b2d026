"""What each part of thattn needs installed, and the error that says so.

thattn installs by need (README, "Install"). `pip install thattn` alone
brings only absl-py, NumPy and etils; each framework comes with an extra:

- `[jax]`, `[torch]`: Keras 3 and JAX or PyTorch, for `thattn.keras3`
  (the layers, the models, `layout_map`);
- `[tensorflow]`: TensorFlow, tf-keras, tensorflow-text and Keras 3, for
  `thattn.layers`, the tf_keras models, `thattn-train`, the export, the
  data pipeline, and `thattn.keras3` on TensorFlow;
- `[mtf]`: the same and mesh-tensorflow, for `thattn.mtf`,
  `thattn-train --backend=mtf` and `thattn-convert`'s Mesh TensorFlow
  conversions (its BERT and ALBERT sources need only `[tensorflow]`).

A part that needs a missing package calls `require` before importing it,
or imports it inside `lazy_imports(part)`, which loads it on first use,
so the user reads one line naming the pip command instead of a bare
ModuleNotFoundError from deep inside the part. Plain Python: importing this
module imports no framework, and `require` only looks packages up
(`importlib.util.find_spec`), it does not import them.
"""

import importlib.util

from etils import epy

# Import name -> the extra that installs it.
EXTRA_OF = {
    "tensorflow": "tensorflow",
    "tf_keras": "tensorflow",
    "tensorflow_text": "tensorflow",
    "sentencepiece": "tensorflow",
    "mesh_tensorflow": "mtf",
    "gin": "mtf",
}

# What the TensorFlow side of thattn imports (tensorflow-text: the data
# pipeline's tokenizers and the export's serving signatures).
TENSORFLOW = ("tensorflow", "tf_keras", "tensorflow_text")


def install_command(*extras):
  """The pip command that installs thattn's `extras`, from a checkout first
  (thattn is not on PyPI; README, "Install"), then from a package index:
  "pip install -e '.[mtf]' in a thattn checkout, or pip install
  'thattn[mtf]' from a package index"."""
  names = ",".join(extras)
  return (f"pip install -e '.[{names}]' in a thattn checkout, or pip install "
          f"'thattn[{names}]' from a package index")


def installed(name):
  """Whether the top-level package `name` can be found (None in
  sys.modules, a blocked import, counts as not installed)."""
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):  # a parent that fails, or no __spec__
    return False


def require(part, names=TENSORFLOW):
  """Raises ImportError naming the pip command if any of `names` (import
  names, keys of EXTRA_OF) is not installed; `part` says who needs them
  (`"thattn.layers"`, `"thattn-train"`)."""
  missing = [name for name in names if not installed(name)]
  if not missing:
    return
  command = install_command(*sorted({EXTRA_OF[name] for name in missing}))
  raise ImportError(
      f"{part} needs {', '.join(missing)}, not installed here: {command}. "
      "(thattn.keras3 runs on JAX or PyTorch without TensorFlow: the [jax] "
      "or [torch] extra.)")


def keras3_import_error(error):
  """The ImportError to raise when `import keras` failed with `error`
  (a ModuleNotFoundError): Keras 3 missing, or its backend's framework."""
  if error.name == "keras":
    return ImportError(
        "thattn.keras3 needs Keras 3 and a backend framework, which are not "
        f"installed: {install_command('jax')} (or the [torch] or "
        "[tensorflow] extra in place of [jax]).")
  if error.name in ("tensorflow", "jax", "torch"):
    return ImportError(
        f"Keras 3 is set to its {error.name} backend, and {error.name} is "
        "not installed: choose an installed framework with KERAS_BACKEND="
        "jax, torch or tensorflow before importing Keras (Keras 3 defaults "
        f"to tensorflow), or install it: {install_command(error.name)}.")
  return None


def lazy_imports(part, names=TENSORFLOW):
  """A context in which imports load on first use (`etils.epy.lazy_imports`,
  TensorFlow Datasets' way of importing TensorFlow), so that a module of
  `part` imports without them; if one is missing when it is used, the
  ImportError names the pip command that installs `names`."""
  command = install_command(*sorted({EXTRA_OF[name] for name in names}))
  return epy.lazy_imports(
      error_callback=f"{part} needs {', '.join(names)} here: {command}.")
