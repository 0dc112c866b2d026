"""The embedded default corpus: size, determinism, splits, cache."""

import hashlib
import logging
import os
import shutil

import pytest

from thattn.data import corpus


def _file_hash(directory, name):
  with open(os.path.join(directory, name), "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_two_builds_are_identical_and_large_enough(tmp_path):
  first = corpus.build(str(tmp_path / "one"))
  second = corpus.build(str(tmp_path / "two"))
  assert first["sha256"] == second["sha256"]
  for split in corpus.SPLITS:
    name = f"{split}.txt"
    assert (_file_hash(tmp_path / "one", name) ==
            _file_hash(tmp_path / "two", name) ==
            first["files"][name]["sha256"])
  assert first["files"]["train.txt"]["bytes"] >= 2 * 2**20
  heldout = first["files"]["heldout.txt"]["bytes"]
  assert 0.01 < heldout / first["files"]["train.txt"]["bytes"] < 0.15
  assert {"python-topics", "python-stdlib", "numpy"} <= set(first["sources"])


def test_documents_are_clean_distinct_prose(corpus_cache):
  train = corpus.documents("train", corpus_cache)
  heldout = corpus.documents("heldout", corpus_cache)
  paragraphs = [p for d in train + heldout for p in d.split("\n")]
  assert len(paragraphs) == len({p.casefold() for p in paragraphs})
  assert not set(train) & set(heldout)
  for paragraph in paragraphs[::97]:
    assert paragraph == " ".join(paragraph.split())
    assert not paragraph.startswith(">>>")
    assert paragraph[0].isupper() and paragraph[-1] in ".!?:"
    assert "``" not in paragraph and ":func:" not in paragraph


def test_cached_after_first_use(corpus_cache):
  directory = corpus.corpus_dir(corpus_cache)
  manifest_path = os.path.join(directory, "manifest.json")
  before = os.stat(manifest_path).st_mtime_ns
  assert corpus.corpus_dir(corpus_cache) == directory
  assert os.stat(manifest_path).st_mtime_ns == before  # not rebuilt
  assert corpus.path("train", corpus_cache).startswith(directory)
  assert corpus.manifest(corpus_cache)["counts"]["documents"] > 1000


def test_markup_and_code_are_removed():
  docstring = (
      "Return the sum of :func:`numpy.add` over ``axis``, as described in\n"
      "the *reference* guide for `arrays <https://example.org>`_.\n\n"
      ">>> np.sum([1, 2])\n3\n\n"
      "Parameters\n----------\n"
      "axis : int\n    The axis along which the sum is taken, if it is "
      "given by the caller.\n")
  # pylint: disable=protected-access
  paragraphs = [corpus._normalize(b) for b in corpus._blocks(docstring)]
  prose = [p for p in paragraphs if corpus._is_prose(p)]
  assert prose == [
      "Return the sum of numpy.add over axis, as described in the reference "
      "guide for arrays.",
      "The axis along which the sum is taken, if it is given by the caller."]


@pytest.mark.parametrize("damage", ["truncated", "empty", "foreign_manifest"])
def test_a_damaged_cached_corpus_is_built_again(corpus_cache, tmp_path,
                                                damage, caplog):
  """Issue 33: a cut-short, emptied or foreign file in the corpus cache is
  detected against the manifest and rebuilt, never read as the corpus."""
  good = corpus.corpus_dir(corpus_cache)
  cache = tmp_path / "cache"
  shutil.copytree(good, cache / os.path.basename(good))
  folder = cache / os.path.basename(good)
  want = corpus.documents("train", corpus_cache)
  if damage == "truncated":
    with open(folder / "train.txt", "r+b") as f:
      f.truncate(1000)
  elif damage == "empty":
    (folder / "heldout.txt").write_bytes(b"")
  else:
    (folder / "manifest.json").write_bytes(b"\x00\x01 not json")
  with caplog.at_level(logging.WARNING, logger="thattn"):
    got = corpus.documents("train", str(cache))
  assert got == want
  assert f"thattn's cached corpus in {folder} is damaged" in caplog.text
  assert corpus.manifest(str(cache)) == corpus.manifest(corpus_cache)
