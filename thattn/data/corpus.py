"""The embedded default corpus: English prose from installed software's docs.

So that pretraining runs on a fresh machine with no network, thattn assembles
a corpus from text that is already installed beside it, and ships none:

- Python's reference topics (`pydoc_data.topics`, the text behind `help()`);
- the docstrings of the Python standard library, NumPy, TensorFlow and
  tf-keras, read from their source files (nothing is imported).

Docstrings are split into paragraphs, and only paragraphs that read as English
prose are kept (at least 8 words, capitalized, ending in a full stop, mostly
letters, few code-like words, some English function words). Markup is removed
(reST roles, backquotes, emphasis), whitespace is collapsed, and a paragraph
seen before (case-insensitively) is dropped, so the corpus holds each paragraph
once. One document is one source file (or one reference topic), its paragraphs
in source order; documents are ordered by source, then path.

Files: `train.txt` and `heldout.txt`, one paragraph per line and a blank line
between documents (the format of `sources.text_files(..., split_blank_lines=
True)`), and `manifest.json` with the sources, their versions, the counts and
the SHA-256 of the two files. A document goes to `heldout` when the SHA-256 of
its name is 0 modulo 20 (about 5% of documents), so the split does not move
when other documents come or go. The build is deterministic: the same
installed versions give the same bytes. With Python 3.11, NumPy 2.4 and
TensorFlow 2.21 it gives 4.4 MB of training text (about 1,700 documents,
33,000 paragraphs) and 0.19 MB held out. It takes about 4 s and is cached under
`$THATTN_CACHE_DIR` (default `~/.cache/thattn`), in a folder named by the
builder version and the versions of the sources.

What it is good for: a smoke test of the whole pipeline (tokenizer learning,
MLM/SOP/span-corruption pretraining, perplexity on held-out text) on a laptop,
and comparing attention variants against each other on the same text. But
4.4 MB is about a million tokens, so a bert_tiny-sized model sees it many
times over and can overfit it. What it is not good for: absolute numbers to
compare with the papers (which used C4, Wikipedia and books), or
general-domain language: it is technical English about programming, heavy
with words like "array", "tensor" and "function", with little narrative,
dialogue or world knowledge. Code examples are removed, but inline
identifiers remain inside sentences.
"""

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import sysconfig
import unicodedata

from thattn.io import paths
from thattn.io import write_failures

_LOG = logging.getLogger("thattn")
# Corpus folders this process has checked against their manifests.
_VERIFIED = set()

BUILDER_VERSION = 1  # Bump when a change to this file changes the output.
HELDOUT_MODULUS = 20
SPLITS = ("train", "heldout")

# Python packages whose docstrings are read: (name, distribution).
_PACKAGES = (("numpy", "numpy"), ("tensorflow", "tensorflow"),
             ("tf_keras", "tf-keras"))
# Standard-library folders that hold tests, demos or tools rather than docs.
_SKIPPED_DIRS = frozenset({
    "test", "tests", "testing", "idlelib", "lib2to3", "tkinter", "turtledemo",
    "ensurepip", "site-packages", "dist-packages", "__pycache__", "encodings",
    "pydoc_data", "include", "_api"})

_FUNCTION_WORDS = frozenset(
    "the a an of to is are and in for that this it be with as by on or not "
    "if when which from can will".split())
_UNDERLINE = re.compile(r"^\s*([-=~^*#+])\1{2,}\s*$")
_FIELD = re.compile(r"^\s*[\w*]+\s*(\([^)]*\))?\s*:(\s+|$)")
_ROLE = re.compile(r":[\w:.-]+:`~?([^`<]*?)(\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_{1,2}")
_BACKQUOTES = re.compile(r"`{1,2}([^`]+)`{1,2}_{0,2}")
_EMPHASIS = re.compile(r"(\*{1,2})(\w[^*]*?)\1")
_DOCSTRING = re.compile(
    rb"(?:\A|:[ \t]*(?:#[^\n]*)?\n)(?:[ \t]*#[^\n]*\n|\s*\n)*"
    rb"[ \t]*[rRuU]?(\"\"\"|\'\'\')(.*?)\1", re.S)
_NOT_LETTERS = re.compile(r"[\W\d_]+")
# Words holding an identifier's or an expression's characters.
_CODE_WORDS = re.compile(r"\S*(?:[_=()\[\]{}<>/\\|#@$]|\w\.\w)\S*")


def _normalize(text):
  text = _ROLE.sub(r"\1", text)
  text = _LINK.sub(r"\1", text)
  text = _BACKQUOTES.sub(r"\1", text)
  text = _EMPHASIS.sub(r"\2", text)
  if not text.isascii():
    text = unicodedata.normalize("NFC", text)
  return " ".join(text.split())


def _is_prose(paragraph):
  words = paragraph.split()
  if len(words) < 8 or not paragraph[0].isupper():
    return False
  if paragraph[-1] not in ".!?:":
    return False
  visible = len(paragraph) - paragraph.count(" ")  # whitespace is collapsed
  if len(_NOT_LETTERS.sub("", paragraph)) < 0.8 * visible:
    return False
  if len(_CODE_WORDS.findall(paragraph)) > 0.15 * len(words):
    return False
  lowered = [w.lower().strip(",.;:!?") for w in words]
  return sum(w in _FUNCTION_WORDS for w in lowered) >= 2


def _blocks(text):
  """Candidate paragraphs of a docstring: runs of lines at one indentation.

  Blank lines and heading underlines end a block. A field line (Google's
  `name: text`, NumPy's `name : type`) starts one, and the lines indented
  under it continue it; NumPy's type is dropped. Blocks holding doctest
  prompts or reST directives are code or markup and yield nothing.
  """
  block, indent, hanging = [], None, False
  for line in text.expandtabs().splitlines() + [""]:
    stripped = line.strip()
    this_indent = len(line) - len(line.lstrip())
    field = _FIELD.match(line)
    if (block and stripped and not _UNDERLINE.match(line) and not field and
        (this_indent == indent or (hanging and this_indent > indent))):
      block.append(stripped)
      continue
    if block and not any(l.startswith((">>>", "...", ".. ", "$ "))
                         for l in block):
      yield " ".join(block)
    block, indent, hanging = [], this_indent, False
    if not stripped or _UNDERLINE.match(line):
      continue
    if field:
      rest = line[field.end():].strip()
      numpy_type = " :" in field.group(0)
      block, hanging = ([rest] if rest and not numpy_type else []), True
    else:
      block = [stripped]


def _docstrings(source):
  """Docstrings in a module's source bytes, in source order.

  A docstring is taken to be a triple-quoted string that opens the file or
  follows a line ending in a colon (a def, class, or, rarely, a compound
  statement). A regular expression finds them ten times faster than `ast`.
  """
  for match in _DOCSTRING.finditer(source):
    yield inspect.cleandoc(match.group(2).decode("utf-8", "replace"))


def _python_files(root):
  """Relative paths of the .py files under root, sorted, minus tests."""
  found = []
  for directory, subdirs, files in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in _SKIPPED_DIRS)
    for name in files:
      if name.endswith(".py") and not (name.startswith("test_") or
                                       name.endswith("_test.py")):
        found.append(os.path.relpath(os.path.join(directory, name), root))
  return sorted(found)


def _sources():
  """(source name, version, [(document name, [raw texts])]) per source."""
  sources = []
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
    documents = [(f"python-topics/{name}", [topics.topics[name]])
                 for name in sorted(topics.topics)]
    sources.append(("python-topics", sys.version.split()[0], documents))
  except ImportError:
    pass  # Some distributions ship Python without pydoc_data.
  roots = [("python-stdlib", sys.version.split()[0],
            sysconfig.get_paths()["stdlib"])]
  for module, distribution in _PACKAGES:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
      continue
    roots.append((module, importlib.metadata.version(distribution),
                  list(spec.submodule_search_locations)[0]))
  for name, version, root in roots:
    documents = []
    for relative in _python_files(root):
      with open(os.path.join(root, relative), "rb") as f:
        source = f.read()
      documents.append((f"{name}/{relative}", list(_docstrings(source))))
    sources.append((name, version, documents))
  return sources


def fingerprint():
  """Names this build: the builder version and the sources' versions."""
  parts = [f"builder={BUILDER_VERSION}", f"python={sys.version.split()[0]}"]
  for module, distribution in _PACKAGES:
    try:
      parts.append(f"{module}={importlib.metadata.version(distribution)}")
    except importlib.metadata.PackageNotFoundError:
      parts.append(f"{module}=absent")
  return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


def _split_of(document_name):
  digest = hashlib.sha256(document_name.encode()).digest()
  return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0 \
      else "train"


def build(output_dir):
  """Builds the corpus into output_dir and returns its manifest (a dict)."""
  seen = set()
  splits = {split: [] for split in SPLITS}
  counts = {"documents": 0, "paragraphs": 0, "duplicate_paragraphs": 0}
  source_versions = {}
  for source, version, documents in _sources():
    source_versions[source] = version
    for name, texts in documents:
      kept = []
      for text in texts:
        for block in _blocks(text):
          if block[-1] not in ".!?:" or block.count(" ") < 7:
            continue  # Cheap checks first: _is_prose would say no.
          paragraph = _normalize(block)
          if not _is_prose(paragraph):
            continue
          key = paragraph.casefold()
          if key in seen:
            counts["duplicate_paragraphs"] += 1
            continue
          seen.add(key)
          kept.append(paragraph)
      if kept:
        splits[_split_of(name)].append("\n".join(kept))
        counts["documents"] += 1
        counts["paragraphs"] += len(kept)
  os.makedirs(output_dir, exist_ok=True)
  manifest = {"builder_version": BUILDER_VERSION, "sources": source_versions,
              "counts": counts, "files": {}}
  for split, documents in splits.items():
    data = ("\n\n".join(documents) + "\n").encode("utf-8")
    _write_atomically(os.path.join(output_dir, f"{split}.txt"), data)
    manifest["files"][f"{split}.txt"] = {
        "bytes": len(data), "documents": len(documents),
        "sha256": hashlib.sha256(data).hexdigest()}
  manifest["sha256"] = hashlib.sha256(json.dumps(
      manifest["files"], sort_keys=True).encode()).hexdigest()
  _write_atomically(os.path.join(output_dir, "manifest.json"),
                    json.dumps(manifest, indent=2, sort_keys=True).encode())
  return manifest


def _write_atomically(path, data):
  """Writes `path` whole (a temporary file renamed into place); a write
  that fails (a full disk) leaves no temporary file behind."""
  temporary = f"{path}.tmp{os.getpid()}"
  try:
    with open(temporary, "wb") as f:
      f.write(data)
    os.replace(temporary, path)
  except OSError:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise


def corpus_dir(cache=None):
  """The cached corpus folder, built on first use (manifest written last).

  A cached corpus whose files do not match its manifest (cut short by a
  full disk, edited, a manifest that is not one) is built again, with a
  warning naming what was wrong; two processes building at once write the
  same bytes, each file renamed into place whole.
  """
  directory = os.path.join(cache or paths.cache_dir(),
                           f"corpus-{fingerprint()}")
  if directory in _VERIFIED:
    return directory
  damage = (_damage(directory) if os.path.exists(
      os.path.join(directory, "manifest.json")) else "absent")
  if damage:
    if damage != "absent":
      _LOG.warning("thattn's cached corpus in %s is damaged (%s); building "
                   "it again", directory, damage)
    with write_failures.cache_writes(directory):  # a full disk, named
      build(directory)
  _VERIFIED.add(directory)
  return directory


def _damage(directory):
  """What does not match the corpus's manifest, or None."""
  try:
    with open(os.path.join(directory, "manifest.json"), "rb") as f:
      files = json.loads(f.read().decode("utf-8"))["files"]
    for split in SPLITS:
      expected = files[f"{split}.txt"]
      with open(os.path.join(directory, f"{split}.txt"), "rb") as f:
        data = f.read()
      if (len(data) != expected["bytes"] or
          hashlib.sha256(data).hexdigest() != expected["sha256"]):
        return (f"{split}.txt has {len(data)} bytes and not the "
                f"{expected['bytes']} its manifest records, or other bytes")
  except (OSError, ValueError, KeyError, TypeError) as error:
    return f"{type(error).__name__}: {error}"
  return None


def path(split="train", cache=None):
  """The path of one split's text file, building the corpus if needed."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
  return os.path.join(corpus_dir(cache), f"{split}.txt")


def documents(split="train", cache=None):
  """One split as a list of documents, each a string of paragraph lines."""
  with open(path(split, cache), encoding="utf-8") as f:
    return [d.strip() for d in f.read().split("\n\n") if d.strip()]


def manifest(cache=None):
  with open(os.path.join(corpus_dir(cache), "manifest.json")) as f:
    return json.load(f)
