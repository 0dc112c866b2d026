"""Shared by the text pretraining tasks (masked LM, span corruption, causal
LM).

A text task reads documents (the embedded corpus, or `--train_files`:
plain text, documents separated by blank lines, or JSON lines, files ending
in .jsonl, one document a line in its "text" field; every 20th document
held out unless `--eval_files` are given), prepares its
tokenizer once per run, and packs the token ids into rows held in memory
(`thattn.data.batches.token_rows`), from which batches are addressed by step.
"""

import json
import os

from thattn import models
from thattn.core import requirements
from thattn.tasks import base

with requirements.lazy_imports("thattn.tasks"):
  import tensorflow as tf
  from thattn.data import corpus
  from thattn.data import sources
  from thattn.data import tokenizers

TOKENIZER_KINDS = ("sentencepiece", "wordpiece")
# Every HELDOUT_EVERY-th document of --train_files is held out when no
# --eval_files are given.
HELDOUT_EVERY = 20


# Files of this ending hold JSON lines, one document per line in the
# `JSON_TEXT_FIELD` field (what many corpora ship as).
JSON_LINES_SUFFIX = ".jsonl"
JSON_TEXT_FIELD = "text"


def _json_lines(paths):
  """The documents of JSON-lines files: each line's "text" string."""
  documents = []
  for path in paths:
    with tf.io.gfile.GFile(path, "r") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except ValueError as error:
          raise ValueError(f"{path}, line {number}: not JSON ({error}).")
        value = record.get(JSON_TEXT_FIELD) if isinstance(record,
                                                         dict) else None
        if not isinstance(value, str):
          raise ValueError(f"{path}, line {number}: expected an object with "
                           f"a string {JSON_TEXT_FIELD!r} field, got "
                           f"{line.strip()[:80]!r}.")
        if value.strip():
          documents.append(value.strip())
  if not documents:
    raise ValueError(f"{paths} hold no document with text.")
  return documents


def _documents(pattern):
  """Documents of plain-text files (separated by blank lines) or, for
  files ending in .jsonl, of JSON lines (one a line, its "text")."""
  paths = sorted(tf.io.gfile.glob(pattern))
  json_paths = [path for path in paths if path.endswith(JSON_LINES_SUFFIX)]
  if json_paths:
    if len(json_paths) != len(paths):
      raise ValueError(
          f"{pattern!r} matches JSON-lines and plain-text files "
          f"({len(json_paths)} of {len(paths)} end in "
          f"{JSON_LINES_SUFFIX}); give one kind.")
    return _json_lines(json_paths)
  texts = sources.text_files(pattern, split_blank_lines=True)
  return [text.decode("utf-8") for text in texts.as_numpy_iterator()]


def load_documents(data):
  """(train documents, held-out documents) as lists of strings."""
  if data.train_files is None:
    if data.eval_files is not None:
      raise ValueError("--eval_files needs --train_files; the default corpus "
                       "has its own held-out split.")
    return (corpus.documents("train", data.cache_dir),
            corpus.documents("heldout", data.cache_dir))
  documents = _documents(data.train_files)
  if data.eval_files is not None:
    return documents, _documents(data.eval_files)
  if len(documents) < 2:
    raise ValueError(f"--train_files={data.train_files!r} holds "
                     f"{len(documents)} document(s); hold-out needs at least "
                     "2, or pass --eval_files.")
  heldout = documents[::HELDOUT_EVERY]
  train = [d for i, d in enumerate(documents) if i % HELDOUT_EVERY]
  return train, heldout


def has_tokenizer(folder):
  return bool(folder) and tf.io.gfile.exists(
      os.path.join(folder, tokenizers.CONFIG_FILE))


def prepare_tokenizer(data, tokenizer_dir, documents=None, log=print,
                      init_tokenizer_dir=None):
  """The run's tokenizer: resumed, the init run's, given, default, or learned.

  Order: `tokenizer_dir` (a resumed run keeps its tokenizer); the
  tokenizer of the --init_checkpoint run (its backbone was trained on those
  ids: it wins over --tokenizer); a folder named by `data.tokenizer`; for
  the default corpus, the cached default tokenizer of that kind; else one
  learned from `documents`. Saved once, in `tokenizer_dir`.
  """
  if has_tokenizer(tokenizer_dir):
    return tokenizers.load(tokenizer_dir)
  if has_tokenizer(init_tokenizer_dir):
    log(f"Tokenizer: the --init_checkpoint run's, {init_tokenizer_dir}.")
    tokenizer = tokenizers.load(init_tokenizer_dir)
  elif data.tokenizer not in TOKENIZER_KINDS:
    if not tf.io.gfile.isdir(data.tokenizer):
      raise ValueError(f"tokenizer must be one of {TOKENIZER_KINDS} or a "
                       f"folder written by Tokenizer.save, got "
                       f"{data.tokenizer!r}.")
    tokenizer = tokenizers.load(data.tokenizer)
  elif data.train_files is None:
    log(f"Tokenizer: {data.tokenizer}, {data.vocab_size} tokens, learned "
        "from the default corpus (cached after the first run).")
    tokenizer = tokenizers.default_tokenizer(data.tokenizer, data.vocab_size,
                                             data.cache_dir)
  else:
    paragraphs = [line for document in documents
                  for line in document.split("\n") if line.strip()]
    log(f"Tokenizer: learning a {data.tokenizer} vocabulary of "
        f"{data.vocab_size} from {len(paragraphs):,} lines.")
    learn = (tokenizers.train_sentencepiece if data.tokenizer ==
             "sentencepiece" else tokenizers.learn_wordpiece)
    tokenizer = learn(paragraphs, data.vocab_size)
  if tokenizer_dir:
    tokenizer.save(tokenizer_dir)
  return tokenizer


class TextTask(base.Task):
  """Documents, a tokenizer and packed rows; subclasses define `_rows`."""

  def __init__(self, *, data, files, log=print, **kwargs):
    super().__init__(data=data, files=files, log=log, **kwargs)
    self.data = data
    train, heldout = load_documents(data)
    self.tokenizer = prepare_tokenizer(
        data, files.tokenizer_dir, train, log=log,
        init_tokenizer_dir=files.init_tokenizer_dir)
    self.train_rows = self._rows(train)
    self.eval_rows = self._rows(heldout)
    log(f"Data: train {base.sizes(self.train_rows)}; held out "
        f"{base.sizes(self.eval_rows)}.")
    self.overrides = base.backbone_overrides(
        self.model_options, self.tokenizer.vocab_size, self.sequence_length,
        log=log)
    self.model_config = models.model_config(self.model_options.preset,
                                            **self.overrides)

  def _rows(self, documents):
    raise NotImplementedError

  def run_config(self):
    return dict(super().run_config(), overrides=self.overrides)

