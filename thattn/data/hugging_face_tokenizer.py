"""A Hugging Face `tokenizers` tokenizer (a folder's tokenizer.json) as a
thattn tokenizer: the source's own library, so the source's own ids.

`HuggingFaceTokenizer` is a `thattn.data.tokenizers.Tokenizer` whose
`tokenize` and `detokenize` call the `tokenizers` library through
`tf.numpy_function`: they run eagerly and inside `tf.data` pipelines
(thattn-train's batches), but not in a SavedModel, which cannot hold
Python. So it is not `in_graph`, and an export of a model with it serves
token ids alone (`thattn.tasks.serving`). Why not an in-graph reader:
KerasHub's `BytePairTokenizer`, the one in TensorFlow ops, splits runs of
spaces otherwise than GPT-2's byte-level pre-tokenizer (measured
2026-12-03: "  x" is one "ĠĠ" piece there, "Ġ" and "Ġx" here and in
transformers), so its ids are not the source's.

Ids of the text only: the tokenizer.json's post-processor (a BOS that
Llama 3 adds, say) is not applied, as thattn's tasks place their own
special tokens (the causal LM ends each document with the end token).
A source without a padding token pads with its end token, as
transformers' `generate` does; [CLS], [SEP] and [MASK], which a
decoder-only LM has none of, are the end token too.
"""

import json
import os

import numpy as np
import tensorflow as tf

from thattn.core import requirements
from thattn.data import tokenizers

# Saved beside thattn's own tokenizer.json (tokenizers.CONFIG_FILE).
TOKENIZER_FILE = "hugging_face_tokenizer.json"


def _library():
  try:
    import tokenizers as hugging_face_tokenizers  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError(
        "A Hugging Face tokenizer.json is read by the `tokenizers` "
        f"package: {requirements.install_command('tensorflow')}") from None
  return hugging_face_tokenizers


def _utf8_offsets(text):
  """byte offset of each character position of `text` (and its end)."""
  lengths = [len(character.encode("utf-8")) for character in text]
  return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


class HuggingFaceTokenizer(tokenizers.Tokenizer):
  """The tokenizer of a tokenizer.json (see the module).

  Args:
    tokenizer_json: the file's text.
    eos_token: the end token's string (config.json's eos_token_id names
      its id; `from_folder` reads it).
    pad_token: the padding token's string, or None: the end token.
    vocab_size: the model's embedding rows (default: the tokenizer's).
  """

  kind = "hugging_face"
  in_graph = False

  def __init__(self, tokenizer_json, *, eos_token, pad_token=None,
               vocab_size=None, name=None):
    self.tokenizer_json = tokenizer_json
    self._tokenizer = _library().Tokenizer.from_str(tokenizer_json)
    self.eos_token, self.pad_token = eos_token, pad_token
    eos = self._id(eos_token, "eos_token")
    pad = eos if pad_token is None else self._id(pad_token, "pad_token")
    special = tokenizers.SpecialIds(pad=pad, unk=eos, cls=eos, sep=eos,
                                    mask=eos, eos=eos, sentinels=())
    count = self._tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_size = count if vocab_size is None else int(vocab_size)
    if vocab_size < count:
      raise ValueError(f"vocab_size={vocab_size} is smaller than the "
                       f"tokenizer's {count} tokens.")
    super().__init__(vocab_size, special, name=name, token_count=count)

  def _id(self, token, what):
    token_id = self._tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f"{what}={token!r} is not a token of the "
                       "tokenizer.json.")
    return token_id

  def _encode(self, strings):
    texts = [value.decode("utf-8") for value in strings]
    encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
    ids, lengths, starts, ends = [], [], [], []
    for text, encoding in zip(texts, encodings):
      offsets = _utf8_offsets(text)
      ids.extend(encoding.ids)
      lengths.append(len(encoding.ids))
      starts.extend(offsets[start] for start, _ in encoding.offsets)
      ends.extend(offsets[end] for _, end in encoding.offsets)
    return (np.asarray(ids, np.int32), np.asarray(lengths, np.int64),
            np.asarray(starts, np.int64), np.asarray(ends, np.int64))

  def _tokenize_with_offsets(self, strings):
    ids, lengths, starts, ends = tf.numpy_function(
        self._encode, [strings], [tf.int32, tf.int64, tf.int64, tf.int64],
        stateful=False)
    for tensor in (ids, lengths, starts, ends):
      tensor.set_shape([None])
    ragged = lambda values: tf.RaggedTensor.from_row_lengths(values, lengths)
    return ragged(ids), ragged(starts), ragged(ends)

  def _decode(self, ids, lengths):
    rows = np.split(ids, np.cumsum(lengths)[:-1]) if len(lengths) else []
    return np.asarray([text.encode("utf-8") for text in
                       self._tokenizer.decode_batch(
                           [row.tolist() for row in rows])], object)

  def _detokenize(self, ids):
    text = tf.numpy_function(self._decode, [ids.flat_values,
                                            ids.row_lengths()], tf.string,
                             stateful=False)
    text.set_shape([None])
    return text

  def _config(self):
    return {"tokenizer_file": TOKENIZER_FILE, "eos_token": self.eos_token,
            "pad_token": self.pad_token, "vocab_size": self.vocab_size}

  def _save_vocabulary(self, directory):
    with tf.io.gfile.GFile(os.path.join(directory, TOKENIZER_FILE), "w") as f:
      f.write(self.tokenizer_json)


def from_folder(path, hf_config, vocab_size=None):
  """The tokenizer of a Hugging Face folder (its tokenizer.json; the end
  token from config.json's eos_token_id, the padding token from its
  pad_token_id), or None where the folder has no tokenizer.json."""
  file_path = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(file_path):
    return None
  with open(file_path, encoding="utf-8") as f:
    text = f.read()
  library = _library().Tokenizer.from_str(text)

  def token(field):
    token_id = hf_config.get(field)
    if isinstance(token_id, list):  # Llama 3.1's several end tokens
      token_id = token_id[0]
    if token_id is None:
      return None
    name = library.id_to_token(token_id)
    if name is None:
      raise ValueError(f"{path}: config.json's {field}={token_id} is not a "
                       "token of tokenizer.json.")
    return name

  eos = token("eos_token_id")
  if eos is None:
    raise ValueError(f"{path}: config.json has no eos_token_id, which the "
                     "causal LM ends each document with.")
  return HuggingFaceTokenizer(text, eos_token=eos,
                              pad_token=token("pad_token_id"),
                              vocab_size=vocab_size)


def load(directory, config, vocab_size=None):
  """The tokenizer `HuggingFaceTokenizer.save(directory)` wrote; `config`
  is its thattn tokenizer.json."""
  with tf.io.gfile.GFile(os.path.join(directory, config["tokenizer_file"]),
                         "r") as f:
    text = f.read()
  json.loads(text)  # a damaged file fails here, naming JSON
  return HuggingFaceTokenizer(text, eos_token=config["eos_token"],
                              pad_token=config.get("pad_token"),
                              vocab_size=vocab_size or config["vocab_size"])
