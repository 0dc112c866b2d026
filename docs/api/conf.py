"""Sphinx configuration of thattn's API reference (autodoc + napoleon).

Build it (with the `docs` extra installed) from the repository root into
build/api (ignored by git; open build/api/index.html):

    python -m sphinx -W --keep-going -b html docs/api build/api

tests/api_docs_test.py builds it the same way: every warning is an error.
The pages import the packages they document: TensorFlow and tf_keras (for
thattn.layers, thattn.models, the training entry points) and Keras 3 on
JAX; never Mesh TensorFlow.
"""

import os
import pathlib
import sys

from sphinx.util import inspect as sphinx_inspect

# Keras 3 needs a backend before anything imports it: JAX, as the Keras 3
# side of thattn needs no TensorFlow there. A reader's own choice is kept.
os.environ.setdefault("KERAS_BACKEND", "jax")

# The package documented is the one in this tree, installed or not.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

project = "thattn"
author = "thattn developers"
copyright = "thattn developers; Apache-2.0"  # pylint: disable=redefined-builtin

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build"]
# Docstrings name flags and code: "--backend" stays two hyphens.
smartquotes = False
# Literal blocks are mostly the paper's notation, not Python.
highlight_language = "none"

# Docstrings are Google style (Args:, Returns:, Raises:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# thattn's Returns: and Raises: sections are prose ("ValueError naming the
# rule, if ...", "The run's summary, with "export" added: ..."), not
# napoleon's "Type: description" entries, which would cut them at their
# first colon or line: shown as written, under their heading.
napoleon_custom_sections = ["Returns", "Raises"]
# `text` in a docstring is code, as in Markdown (not a cross-reference,
# whose "title <target>" syntax would eat `t5_base_<variant>_<h>`).
default_role = "code"

autodoc_member_order = "bysource"
# Defaults as written in the source (`log=print`, not a function's repr).
autodoc_preserve_defaults = True
# Only thattn's own docstrings: a method that overrides Keras's without a
# docstring of its own is not documented with Keras's text.
autodoc_inherit_docstrings = False

html_theme = "alabaster"
html_title = "thattn API reference"


def _drop_type_docstrings(app, what, name, obj, options, lines):
  """A constant (a tuple, a dict, a string) has no docstring of its own:
  autodoc would show its type's ("Built-in immutable sequence...")."""
  del app, name, options  # unused
  if what in ("data", "attribute") and lines and (
      getattr(obj, "__doc__", None) == getattr(type(obj), "__doc__", None)):
    lines.clear()


_PASS_ON = "(*args, **kwargs)"


def _constructor_signature(app, what, name, obj, options, signature,
                           return_annotation):
  """Keras layers' constructors, not "(*args, **kwargs)": the Keras base
  classes define `__new__`, which autodoc reads before `__init__`, and a
  layer whose `__init__` only passes its arguments on (to a mixin of
  thattn's wiring) is shown with the first `__init__` that names them."""
  del app, name, options  # unused
  if what != "class" or signature != _PASS_ON:
    return signature, return_annotation
  for cls in obj.__mro__:
    if "__init__" in vars(cls):
      init = sphinx_inspect.signature(vars(cls)["__init__"], bound_method=True)
      if sphinx_inspect.stringify_signature(init) != _PASS_ON:
        return sphinx_inspect.stringify_signature(init), return_annotation
  return signature, return_annotation


def setup(app):
  app.connect("autodoc-process-docstring", _drop_type_docstrings)
  app.connect("autodoc-process-signature", _constructor_signature)
