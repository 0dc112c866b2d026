"""Tokenizers: offline vocabularies, round trips, tf.function, SavedModel."""

import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_text.python.ops import bert_tokenizer

from thattn.data import corpus
from thattn.data import tokenizers

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Tensors flow through graphs; arrays hold numbers!",
         "Héllo, wörld: naïve café and ünïcode."]


@pytest.fixture(params=["wordpiece", "sentencepiece", "albert"])
def tokenizer(request):
  return request.getfixturevalue(request.param)


def _basic_words(texts, lower_case=True):
  words = bert_tokenizer.BasicTokenizer(lower_case=lower_case).tokenize(texts)
  return [b" ".join(row).decode() for row in words.to_list()]


def test_vocabularies_are_learned_offline_with_special_tokens(wordpiece,
                                                               sentencepiece):
  for tokenizer in (wordpiece, sentencepiece):
    special = tokenizer.special
    ids = {special.pad, special.unk, special.cls, special.sep, special.mask,
           special.eos, *special.sentinels}
    assert special.pad == 0
    assert len(special.sentinels) == 100
    assert len(ids) == 105 + (tokenizer.kind == "sentencepiece")
    assert max(ids) < tokenizer.vocab_size
  assert 300 < wordpiece.vocab_size <= 1000
  assert sentencepiece.vocab_size == 1000


def test_sentencepiece_round_trips_exactly(sentencepiece, heldout_paragraphs):
  texts = heldout_paragraphs[:200] + TEXTS
  ids = sentencepiece.tokenize(tf.constant(texts))
  assert not np.any(ids.flat_values.numpy() == sentencepiece.special.unk)
  decoded = [t.decode() for t in sentencepiece.detokenize(ids).numpy()]
  assert decoded == texts


def test_wordpiece_round_trips_to_basic_tokens(wordpiece, heldout_paragraphs):
  texts = heldout_paragraphs[:200] + TEXTS[:2]
  ids = wordpiece.tokenize(tf.constant(texts))
  assert not np.any(ids.flat_values.numpy() == wordpiece.special.unk)
  decoded = [t.decode() for t in wordpiece.detokenize(ids).numpy()]
  assert decoded == _basic_words(texts)


def test_offsets_point_at_the_tokens_text(tokenizer):
  ids, starts, ends = tokenizer.tokenize_with_offsets(tf.constant(TEXTS[:2]))
  for text, row_starts, row_ends in zip(TEXTS[:2], starts.to_list(),
                                        ends.to_list()):
    pieces = [text.encode()[s:e].decode() for s, e in zip(row_starts,
                                                            row_ends)]
    assert "".join(p.strip() for p in pieces).lower() == "".join(
        text.split()).lower()
  assert ids.shape[0] == 2


def test_runs_in_tf_function_and_tf_data(tokenizer):
  @tf.function
  def count(strings):
    return tokenizer.tokenize(strings).row_lengths()
  expected = tokenizer.tokenize(tf.constant(TEXTS)).row_lengths().numpy()
  np.testing.assert_array_equal(count(tf.constant(TEXTS)), expected)
  data = tf.data.Dataset.from_tensor_slices(TEXTS).batch(2).map(
      tokenizer.tokenize)
  lengths = np.concatenate([b.row_lengths().numpy() for b in data])
  np.testing.assert_array_equal(lengths, expected)


def test_save_load_and_saved_model(tokenizer, tmp_path):
  strings = tf.constant(TEXTS)
  expected = tokenizer.tokenize(strings)
  tokenizer.save(str(tmp_path / "assets"))
  loaded = tokenizers.load(str(tmp_path / "assets"))
  assert loaded.special == tokenizer.special
  np.testing.assert_array_equal(loaded.tokenize(strings).flat_values,
                                expected.flat_values)
  tf.saved_model.save(tokenizer, str(tmp_path / "saved_model"))
  restored = tf.saved_model.load(str(tmp_path / "saved_model"))
  np.testing.assert_array_equal(restored.tokenize(strings).flat_values,
                                expected.flat_values)
  np.testing.assert_array_equal(restored.detokenize(expected),
                                tokenizer.detokenize(expected))


def test_load_errors(tmp_path):
  with pytest.raises(ValueError, match="no tokenizer config"):
    tokenizers.load(str(tmp_path))
  with pytest.raises(ValueError, match=r"lacks \['\[MASK\]'\]"):
    tokenizers.WordpieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])


def test_training_is_deterministic(heldout_paragraphs, sentencepiece):
  again = tokenizers.train_sentencepiece(heldout_paragraphs, 1000,
                                         num_sentinels=100)
  assert again.model == sentencepiece.model


def test_default_tokenizer_is_learned_once_then_loaded(corpus_cache):
  first = tokenizers.default_tokenizer("sentencepiece", 8000,
                                       cache=corpus_cache)
  second = tokenizers.default_tokenizer("sentencepiece", 8000,
                                        cache=corpus_cache)
  assert second.model == first.model and second.vocab_size == 8000
  with pytest.raises(ValueError, match="kind must be"):
    tokenizers.default_tokenizer("bpe", cache=corpus_cache)


@pytest.mark.parametrize("damage", ["truncated_model", "no_digest"])
def test_a_damaged_cached_tokenizer_is_learned_again(corpus_cache, tmp_path,
                                                     damage, caplog):
  """Issue 33: a cut-short vocabulary in the tokenizer cache is detected
  against the folder's digest and learned again, never loaded."""
  want = tokenizers.default_tokenizer("sentencepiece", 8000,
                                      cache=corpus_cache)
  good = corpus.corpus_dir(corpus_cache)
  cache = tmp_path / "cache"
  shutil.copytree(good, cache / os.path.basename(good))
  folder = (cache / os.path.basename(good) /
            "tokenizer-sentencepiece-8000")
  if damage == "truncated_model":
    (model,) = [p for p in folder.iterdir() if p.suffix == ".model"]
    with open(model, "r+b") as f:
      f.truncate(1000)
  else:
    (folder / "cache_digest.json").unlink()
  with caplog.at_level(logging.WARNING, logger="thattn"):
    got = tokenizers.default_tokenizer("sentencepiece", 8000,
                                       cache=str(cache))
  assert f"thattn's cached tokenizer {folder} is damaged" in caplog.text
  assert got.model == want.model
  assert tokenizers.load(str(folder)).model == want.model
  assert sorted(p.name for p in folder.parent.iterdir()
                if ".tmp" in p.name) == []
