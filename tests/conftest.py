"""Shared fixtures: a small built corpus and tokenizers learned from it."""

import pytest

from thattn.data import corpus
from thattn.data import tokenizers


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
