"""T5's vocabulary layout: a SentencePiece model plus 100 sentinels past it.

The model is trained here as T5's public vocabularies were laid out
(<pad>=0, </s>=1, <unk>=2, no other control symbols) and checked against
the `sentencepiece` package itself.
"""

import io

import pytest
import sentencepiece
import tensorflow as tf

from thattn.data import tokenizers

_PIECES = 300


@pytest.fixture(scope="module")
def t5_model(heldout_paragraphs):
  """Serialized SentencePiece model in T5's layout."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(heldout_paragraphs[:2000]), model_writer=model,
      vocab_size=_PIECES, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
      bos_id=-1, num_threads=1, minloglevel=2)
  return model.getvalue()


_TEXTS = ["Return the list of names in the directory.",
          "A dictionary maps keys to values; tuples are immutable."]


def test_ids_are_the_sentencepiece_models_and_sentinels_follow(t5_model):
  tokenizer = tokenizers.T5SentencepieceTokenizer(t5_model)
  reference = sentencepiece.SentencePieceProcessor(model_proto=t5_model)
  ids = tokenizer.tokenize(tf.constant(_TEXTS))
  assert ids.to_list() == [reference.encode(text) for text in _TEXTS]
  assert tokenizer.vocab_size == _PIECES + 100
  special = tokenizer.special
  assert (special.pad, special.eos, special.unk) == (0, 1, 2)
  # <extra_id_0> is the last id, <extra_id_99> the first past the pieces.
  assert special.sentinels[0] == _PIECES + 99
  assert special.sentinels[99] == _PIECES
  assert len(set(special.sentinels)) == 100
  assert special.mask == special.sentinels[0]


def test_detokenize_drops_sentinels_end_and_padding(t5_model):
  tokenizer = tokenizers.T5SentencepieceTokenizer(t5_model, vocab_size=512)
  ids = tokenizer.tokenize(tf.constant(_TEXTS)).to_list()
  sentinel = tokenizer.special.sentinels[0]
  rows = [[sentinel] + ids[0] + [sentinel - 1, 1, 0, 0], ids[1] + [1]]
  text = tokenizer.detokenize(tf.ragged.constant(rows, tf.int32))
  reference = sentencepiece.SentencePieceProcessor(model_proto=t5_model)
  assert [t.decode() for t in text.numpy()] == [
      reference.decode(row) for row in ids]


def test_save_and_load_keep_the_layout(t5_model, tmp_path):
  tokenizer = tokenizers.T5SentencepieceTokenizer(t5_model, vocab_size=512)
  tokenizer.save(str(tmp_path))
  loaded = tokenizers.load(str(tmp_path))
  assert isinstance(loaded, tokenizers.T5SentencepieceTokenizer)
  assert loaded.vocab_size == 512
  assert loaded.special == tokenizer.special
  assert (loaded.tokenize(tf.constant(_TEXTS)).to_list() ==
          tokenizer.tokenize(tf.constant(_TEXTS)).to_list())


def test_the_layout_is_recognized(t5_model, sentencepiece_model):
  t5 = tokenizers.from_sentencepiece_model(t5_model, vocab_size=512)
  assert isinstance(t5, tokenizers.T5SentencepieceTokenizer)
  assert t5.vocab_size == 512
  thattn = tokenizers.from_sentencepiece_model(sentencepiece_model)
  assert isinstance(thattn, tokenizers.SentencepieceTokenizer)
  assert len(thattn.special.sentinels) == 100  # counted from the model


def test_bad_layouts_are_refused(t5_model, sentencepiece_model):
  with pytest.raises(ValueError, match=r"not in T5's layout.*'</s>': 1.*"
                     r"'</s>': 2"):
    tokenizers.T5SentencepieceTokenizer(sentencepiece_model)
  with pytest.raises(ValueError, match="vocab_size=350 is smaller than the "
                     "model's 300 pieces plus extra_ids=100"):
    tokenizers.T5SentencepieceTokenizer(t5_model, vocab_size=350)
