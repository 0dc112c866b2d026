"""Shared fixtures: a small built corpus and tokenizers learned from it;
`unchanged` (a folder byte-identical across a refused command) and
`killed_staging` (a staging folder of a really SIGKILLed write)."""

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

# TensorFlow turns oneDNN on by default only on some x86 CPUs; without it,
# its CPU allocator keeps no memory statistics (reset_memory_stats("CPU:0")
# fails), which the peak-memory measurements need
# (tests/layers/chunked_test.py, the benchmark smoke test), and TensorFlow's
# start-up note differs (tests/bin/newcomer_test.py). Pin it on, before
# TensorFlow is imported, so every machine measures the same way.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# TensorFlow's thread pools keep their defaults. One intra-op thread per
# process (10% faster on tests/models' files) was tried: in one of two
# clean-clone runs with it, Mesh TensorFlow's training was not
# reproducible (tests/mtf/train_backend_test.py: a killed and resumed run
# ended 1.4e-6 away from the straight one, the Keras and mtf backends 0.03
# apart after 8 Adafactor steps), which it has always been with the
# defaults. Not diagnosed further.

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import forkserver
from thattn.data import albert_tokenizer
from thattn.data import corpus
from thattn.data import tokenizers

# The files that take longest (over 35 s of one worker each, averaged over
# two timed runs of the whole suite at b9883f0 and 676ac67, longest
# first). `.ci/run`
# hands whole files to two pytest-xdist workers in this order
# (--no-loadscope-reorder: xdist would otherwise start with the files of
# most tests, leaving these few-test long files for last, one worker busy
# and the other idle).
LONGEST_FILES = (
    "tests/training/keras3_backend_test.py", "tests/readme_test.py",
    "tests/keras3/backends_test.py", "tests/mtf/train_backend_test.py",
    "tests/pallas_compile_test.py", "tests/benchmarks_smoke_test.py",
    "tests/training/keras3_tasks_test.py", "tests/mtf/processes_test.py",
    "tests/install_test.py", "tests/training/keras3_processes_test.py",
    "tests/training/multi_worker_test.py",
    "tests/training/dtensor_train_test.py", "tests/keras3/decoding_test.py",
    "tests/docs_test.py", "tests/training/model_dir_test.py",
    "tests/training/multi_client_dtensor_test.py", "tests/export_test.py",
    "tests/keras3/pallas_test.py", "tests/models/parameter_count_test.py",
    "tests/converters/hugging_face_test.py", "tests/training/trainer_test.py",
    "tests/models/generation_test.py", "tests/kernels/build_test.py",
    "tests/sharding/dtensor_test.py", "tests/keras3/models_test.py")


def pytest_collection_modifyitems(items):
  rank = {path: index for index, path in enumerate(LONGEST_FILES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0],
                                       len(rank)))


# JAX's persistent compilation cache, one folder for the whole test session
# (made by pytest-xdist's controller before it starts its workers, which
# inherit the environment), removed when the session ends: the JAX
# processes the tests start (thattn-train --backend=keras3, the Keras 3
# checks) compile many of the same programs (a tiny BERT's train step, the
# same layers' ops), and each compiled each afresh. The cache's key holds
# the program, the compile options, the device and JAX's version, so a hit
# runs the executable a compile would have built (gpu_paths_checks.py:
# 25 s with no cache, 24 s filling an empty one, 9 s from a full one).
# Thresholds 0: on CPU the tiny programs compile in under JAX's default
# 1 s floor. No size cap: with one, JAX locks the folder for each read and
# write, but each write then lists the whole folder to evict (the same
# checks: 29 s from an empty folder, 72 s beside the entries one run of
# backend_checks.py leaves). Unlocked, a read that races another
# process's write of the same entry can find it half-written; JAX then
# warns and compiles, so no result changes. A user's own cache setting is
# kept.
_JAX_CACHE = None


def pytest_configure():
  global _JAX_CACHE
  # A worker finds the controller's folder in its environment.
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  _JAX_CACHE = tempfile.mkdtemp(prefix="thattn_jax_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_sessionfinish():
  forkserver.close_servers()
  if _JAX_CACHE:
    shutil.rmtree(_JAX_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory):
  """A corpus cache folder, built once per test session."""
  cache = tmp_path_factory.mktemp("thattn_cache")
  corpus.corpus_dir(str(cache))
  return str(cache)


@pytest.fixture(scope="session")
def heldout_paragraphs(corpus_cache):
  """About 190 KB of prose: the corpus's held-out split, one line each."""
  return [line for document in corpus.documents("heldout", corpus_cache)
          for line in document.split("\n")]


@pytest.fixture(scope="session")
def wordpiece(heldout_paragraphs):
  return tokenizers.learn_wordpiece(heldout_paragraphs, 1000,
                                    num_sentinels=100)


@pytest.fixture(scope="session")
def sentencepiece_model(heldout_paragraphs):
  """The serialized model, trained once per session."""
  return tokenizers.train_sentencepiece(heldout_paragraphs, 1000,
                                        num_sentinels=100).model


@pytest.fixture
def sentencepiece(sentencepiece_model):
  # A fresh tokenizer per test: tensorflow-text's SentencePiece resource is
  # owned by its kernel, and tf.random.set_seed (which other tests call)
  # clears TensorFlow's kernel cache, destroying it; a session-wide
  # tokenizer then fails later with "Resource ... does not exist".
  return tokenizers.SentencepieceTokenizer(sentencepiece_model,
                                           num_sentinels=100)


@pytest.fixture(scope="session")
def albert_sentencepiece_model():
  """A SentencePiece model trained as ALBERT's 30k-clean.model was."""
  from tests.converters import checks  # pylint: disable=g-import-not-at-top
  return checks.albert_sentencepiece(200)


@pytest.fixture
def albert(albert_sentencepiece_model):
  """ALBERT's tokenizer with every step of normalization and splitting on
  (fresh per test, as `sentencepiece`)."""
  return albert_tokenizer.AlbertSentencepieceTokenizer(
      albert_sentencepiece_model, split_digit_comma=True,
      split_symbols=("[MASK]", "(", ")", "-"))


@pytest.fixture(scope="session")
def tiny_bert_flags(tmp_path_factory, corpus_cache, sentencepiece_model):
  """thattn-train flags for a tiny masked-LM run on a small text file.

  A 16-wide, one-layer bert_tiny, the tokenizer given (nothing learned),
  batch 4 of 16 tokens, no export; tests add what they need.
  """
  folder = tmp_path_factory.mktemp("tiny_bert_data")
  documents = corpus.documents("heldout", corpus_cache)[:30]
  (folder / "train.txt").write_text("\n\n".join(documents))
  tokenizers.SentencepieceTokenizer(
      sentencepiece_model, num_sentinels=100).save(str(folder / "tokenizer"))
  return [f"--train_files={folder / 'train.txt'}",
          f"--tokenizer={folder / 'tokenizer'}", "--preset=bert_tiny",
          "--d_model=16", "--d_ff=32", "--num_layers=1", "--batch_size=4",
          "--sequence_length=16", "--eval_steps=1", "--warmup_steps=1",
          "--log_every=1", "--noexport"]


def snapshot(folder, ignore=(".thattn.lock",)):
  """{relative path: (size, sha256)} of every file, {path: "dir"} of every
  folder under folder (None if it does not exist). The run lock is left
  out: each run writes who holds it, and it holds nothing of the run's."""
  if not os.path.exists(folder):
    return None
  entries = {}
  for root, folders, files in os.walk(folder):
    for name in folders:
      entries[os.path.relpath(os.path.join(root, name), folder)] = "dir"
    for name in files:
      if name in ignore:
        continue
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        data = f.read()
      entries[os.path.relpath(path, folder)] = (
          len(data), hashlib.sha256(data).hexdigest())
  return entries


@pytest.fixture
def unchanged():
  """`with unchanged(folder, ...):` asserts every folder is as it was
  (names, sizes, hashes) after the block: for refused commands."""

  @contextlib.contextmanager
  def check(*folders):
    before = [snapshot(str(folder)) for folder in folders]
    yield
    for folder, was in zip(folders, before):
      assert snapshot(str(folder)) == was, f"{folder} changed"

  return check


# What `thattn.io.staged_writes.staged` makes (after its clean-up of earlier
# leftovers, left out so that several killed writes can pile up), then a
# SIGKILL while a file is being written.
_KILLED_WRITE = """
import os, signal, sys
from thattn.io import staged_writes
target, program, suffix = sys.argv[1:]
folder = staged_writes.staging_path(target, suffix)
os.makedirs(folder)
staged_writes.mark(folder, program=program, target=target)
with open(os.path.join(folder, "partial.data"), "wb") as f:
  f.write(b"half of a checkpoint")
  f.flush()
  os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture
def killed_staging():
  """`killed_staging(target, program, suffix="")`: the staging folder a
  thattn write into target left when it was SIGKILLed mid-write (a real
  process, `thattn.io.staged_writes` as the binaries use it, killed while writing a
  file)."""

  def kill(target, program, suffix=""):
    parent, name = os.path.split(os.path.abspath(target))
    before = set(os.listdir(parent)) if os.path.isdir(parent) else set()
    result = subprocess.run([sys.executable, "-c", _KILLED_WRITE,
                             str(target), program, suffix], check=False,
                            capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    left = [entry for entry in set(os.listdir(parent)) - before
            if entry.startswith(f".{name}.incomplete-")]
    assert len(left) == 1, left
    return os.path.join(parent, left[0])

  return kill
