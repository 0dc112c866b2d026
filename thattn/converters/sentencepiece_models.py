"""ALBERT's SentencePiece vocabulary as the formats keep it.

Google's release and KerasHub keep the SentencePiece model itself
(`30k-clean.model`, `assets/tokenizer/vocabulary.spm`), and so do older
Hugging Face folders (`spiece.model`). transformers 5 saves only its
`tokenizers` form, `tokenizer.json`: a Unigram model (each piece and its
log-probability), the added tokens, and SentencePiece's own normalization
table (the `Precompiled` normalizer's `precompiled_charsmap`, which
SentencePiece's `NormalizerSpec.precompiled_charsmap` holds). Those are
all a SentencePiece model is at tokenizing time, so
`from_tokenizer_json` writes them back as one, for tensorflow-text's
SentencePiece op.
"""

import base64

from sentencepiece import sentencepiece_model_pb2

_PIECE = sentencepiece_model_pb2.ModelProto.SentencePiece


def user_defined_pieces(model):
  """The pieces of a serialized model that SentencePiece always splits
  out of the text (trained with `user_defined_symbols`)."""
  proto = sentencepiece_model_pb2.ModelProto.FromString(bytes(model))
  return tuple(piece.piece for piece in proto.pieces
               if piece.type == _PIECE.USER_DEFINED)


def _charsmap(normalizer):
  """The Precompiled normalizer's table in a tokenizer.json normalizer."""
  if not normalizer:
    return None
  if normalizer.get("type") == "Precompiled":
    return normalizer["precompiled_charsmap"]
  for part in normalizer.get("normalizers", ()):
    found = _charsmap(part)
    if found is not None:
      return found
  return None


def from_tokenizer_json(tokenizer_json, where):
  """A serialized SentencePiece model of a tokenizer.json's Unigram model.

  Added tokens marked special are control pieces (the unknown piece
  `<unk>`), the others user-defined; the rest are normal pieces with
  their scores. ValueError (naming `where`) if the model is not Unigram.
  """
  model = tokenizer_json.get("model") or {}
  if model.get("type") != "Unigram":
    raise ValueError(f"{where}: a {model.get('type')!r} tokenizer; ALBERT's "
                     "is a Unigram (SentencePiece) model.")
  added = {token["id"]: token for token in tokenizer_json.get(
      "added_tokens", ())}
  proto = sentencepiece_model_pb2.ModelProto()
  for index, (piece, score) in enumerate(model["vocab"]):
    kind = _PIECE.NORMAL
    if index == model.get("unk_id"):
      kind = _PIECE.UNKNOWN
    elif index in added:
      kind = _PIECE.CONTROL if added[index]["special"] else (
          _PIECE.USER_DEFINED)
    proto.pieces.add(piece=piece, score=score, type=kind)
  proto.trainer_spec.model_type = (
      sentencepiece_model_pb2.TrainerSpec.UNIGRAM)
  proto.trainer_spec.unk_id = model.get("unk_id") or 0
  proto.trainer_spec.bos_id = proto.trainer_spec.eos_id = -1
  charsmap = _charsmap(tokenizer_json.get("normalizer"))
  spec = proto.normalizer_spec
  spec.name = "precompiled" if charsmap else "identity"
  if charsmap:
    spec.precompiled_charsmap = base64.b64decode(charsmap)
  spec.add_dummy_prefix = True
  spec.remove_extra_whitespaces = True
  spec.escape_whitespaces = True
  return proto.SerializeToString()
