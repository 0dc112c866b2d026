"""Hugging Face BERT and ALBERT folders (what `save_pretrained` writes)
for `thattn-convert`: the config and weight map of
`thattn.models.hugging_face_encoders`, and the folder's tokenizer: BERT's
`vocab.txt` (WordPiece, cased or not as `tokenizer_config.json`'s
`do_lower_case` says) or ALBERT's `spiece.model` (SentencePiece;
transformers 5 saves either as `tokenizer.json`).
"""

import dataclasses
import json
import os

from thattn.converters import sentencepiece_models
from thattn.data import albert_tokenizer
from thattn.data import tokenizers
from thattn.io import hugging_face_files
from thattn.models import hugging_face_encoders

VOCAB_FILE = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"
FAST_TOKENIZER = "tokenizer.json"
SENTENCEPIECE_FILE = "spiece.model"


def _read_json(path, name):
  file_path = os.path.join(path, name)
  if not os.path.isfile(file_path):
    return {}
  with open(file_path, encoding="utf-8") as f:
    return json.load(f)


def _wordpiece_vocab(path):
  """The WordPiece vocabulary in id order, from vocab.txt or from the fast
  tokenizer's tokenizer.json (what transformers 5 saves); None if neither."""
  if os.path.isfile(os.path.join(path, VOCAB_FILE)):
    with open(os.path.join(path, VOCAB_FILE), encoding="utf-8") as f:
      return f.read().splitlines()
  model = _read_json(path, FAST_TOKENIZER).get("model")
  if not model:
    return None
  if model.get("type") != "WordPiece":
    raise ValueError(f"{os.path.join(path, FAST_TOKENIZER)}: a "
                     f"{model.get('type')!r} tokenizer; BERT's is WordPiece.")
  by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
  if [index for _, index in by_id] != list(range(len(by_id))):
    raise ValueError(f"{os.path.join(path, FAST_TOKENIZER)}: the "
                     "vocabulary's ids are not 0..n-1.")
  return [token for token, _ in by_id]


def _casing(path):
  """(lower_case, strip_accents) of BERT's tokenizer: tokenizer_config.json's
  do_lower_case and strip_accents, else the fast tokenizer's normalizer
  (strip_accents None: stripped exactly when lower-casing, BERT's rule)."""
  settings = _read_json(path, TOKENIZER_CONFIG)
  normalizer = _read_json(path, FAST_TOKENIZER).get("normalizer") or {}
  lower = settings.get("do_lower_case", normalizer.get("lowercase", True))
  return lower, settings.get("strip_accents",
                             normalizer.get("strip_accents"))


def _albert_tokenizer(path):
  """ALBERT's SentencePiece tokenizer as transformers 5 runs it, or None
  where the folder has no tokenizer files: the model from spiece.model,
  else rebuilt from tokenizer.json; `` and '' as ", accents stripped and
  lower-cased as tokenizer_config.json says; and the added tokens (the
  special ones and SentencePiece's user-defined pieces) found in the text
  first, as transformers does, so the text after each starts a new word."""
  fast = _read_json(path, FAST_TOKENIZER)
  model_path = os.path.join(path, SENTENCEPIECE_FILE)
  if os.path.isfile(model_path):
    with open(model_path, "rb") as f:
      model = f.read()
  elif fast:
    model = sentencepiece_models.from_tokenizer_json(
        fast, os.path.join(path, FAST_TOKENIZER))
  else:
    return None
  if fast:
    symbols = [token["content"] for token in fast.get("added_tokens", ())]
  else:  # what transformers adds when it converts spiece.model
    symbols = list(albert_tokenizer.ALBERT_SPECIAL_PIECES) + list(
        sentencepiece_models.user_defined_pieces(model))
  settings = _read_json(path, TOKENIZER_CONFIG)
  return albert_tokenizer.AlbertSentencepieceTokenizer(
      model, lower_case=settings.get("do_lower_case", True),
      strip_accents=not settings.get("keep_accents", False),
      replace_quotes=True, split_digit_comma=False, split_symbols=symbols)


def tokenizer(path, hf_config):
  """The folder's tokenizer: BERT's WordPiece (its [PAD], [UNK], [CLS],
  [SEP] and [MASK] ids from the vocabulary) or ALBERT's SentencePiece;
  None where the folder has no tokenizer files."""
  if hf_config["model_type"] == "albert":
    return _albert_tokenizer(path)
  vocab = _wordpiece_vocab(path)
  if vocab is None:
    return None
  lower_case, strip_accents = _casing(path)
  return tokenizers.WordpieceTokenizer(vocab, lower_case=lower_case,
                                       strip_accents=strip_accents)


def read(path, attention):
  """The folder as a `weight_maps.Source`, with its tokenizer."""
  source = hugging_face_encoders.read(path, attention)
  return dataclasses.replace(
      source, tokenizer=tokenizer(path, hugging_face_files.read_config(path)))
