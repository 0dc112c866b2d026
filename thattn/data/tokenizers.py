"""In-graph tokenizers: WordPiece and SentencePiece through tensorflow-text.

Both are `tf.Module`s whose `tokenize`, `tokenize_with_offsets` and
`detokenize` are `tf.function`s over a batch of strings, so the same object
runs eagerly, inside `tf.data.Dataset.map`, and in an exported SavedModel
(`tf.saved_model.save(tokenizer, path)`). Token ids are int32.

Vocabularies are learned offline:
- `learn_wordpiece` uses tensorflow-text's own vocabulary learner
  (`bert_vocab_from_dataset`) after BERT's basic splitting;
- `train_sentencepiece` uses the `sentencepiece` package (unigram by default,
  with byte fallback so that no text maps to an unknown piece).

Special tokens come first. WordPiece: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3,
[MASK]=4, then `num_sentinels` T5 sentinels `<extra_id_i>`; it has no
end-of-sequence token and uses [SEP] for it. SentencePiece: <pad>=0,
<unk>=1, </s>=2 (end of sequence), then [CLS], [SEP], [MASK] and the
sentinels as control symbols (never produced from text, decoded as "").
T5's own vocabularies (`T5SentencepieceTokenizer`): <pad>=0, </s>=1,
<unk>=2, and 100 sentinels past the model's pieces.
`tokenizer.special` holds the ids.

ALBERT's SentencePiece tokenizer, with its own normalization, is
`thattn.data.albert_tokenizer`'s.

`save(directory)` writes `tokenizer.json` and the vocabulary (`vocab.txt` or
`sentencepiece.model`) beside a checkpoint or an export; `load(directory)`
reads them back.
"""

import dataclasses
import io
import json
import logging
import os

import tensorflow as tf
import tensorflow_text as tf_text

from thattn.io import write_failures
from thattn.data import cache_digest

CONFIG_FILE = "tokenizer.json"
WORDPIECE_VOCAB_FILE = "vocab.txt"
SENTENCEPIECE_MODEL_FILE = "sentencepiece.model"
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_STRINGS = tf.TensorSpec([None], tf.string)
_IDS = tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1)


def sentinel_tokens(num_sentinels):
  return tuple(f"<extra_id_{i}>" for i in range(num_sentinels))


@dataclasses.dataclass(frozen=True)
class SpecialIds:
  """Ids of the special tokens. `eos` is `sep` for WordPiece."""
  pad: int
  unk: int
  cls: int
  sep: int
  mask: int
  eos: int
  sentinels: tuple

  @property
  def never_masked(self):
    """Ids that masked LM must not select."""
    return (self.pad, self.cls, self.sep, self.eos)


class Tokenizer(tf.Module):
  """The shared interface. Subclasses define `_tokenize_with_offsets`."""

  kind = None
  # Whether tokenize and detokenize are TensorFlow ops (so a SavedModel
  # can hold them); thattn.data.hugging_face_tokenizer's calls Python.
  in_graph = True

  def __init__(self, vocab_size, special, name=None, token_count=None):
    super().__init__(name=name)
    # vocab_size: the model's embedding rows. token_count: the ids this
    # tokenizer can produce, [0, token_count); fewer than vocab_size when
    # the rows are padded (Mesh TensorFlow pads them to a multiple of 128),
    # and the padded ids never occur (nor are they drawn as random tokens).
    self.vocab_size = int(vocab_size)
    self.token_count = self.vocab_size if token_count is None else int(
        token_count)
    self.special = special

  @tf.function(input_signature=[_STRINGS], autograph=False)
  def tokenize(self, strings):
    """int32 ids, ragged [batch, (tokens)]."""
    return self._tokenize_with_offsets(strings)[0]

  @tf.function(input_signature=[_STRINGS], autograph=False)
  def tokenize_with_offsets(self, strings):
    """(ids, starts, ends): each token's UTF-8 byte span in its string."""
    return self._tokenize_with_offsets(strings)

  @tf.function(input_signature=[_IDS], autograph=False)
  def detokenize(self, ids):
    """Strings [batch]; padding, [CLS], [SEP] and end-of-sequence dropped."""
    dropped = tf.constant(sorted(set(self.special.never_masked)), tf.int32)
    keep = tf.reduce_all(
        tf.not_equal(tf.expand_dims(ids.flat_values, -1), dropped), -1)
    return self._detokenize(tf.ragged.boolean_mask(ids, ids.with_flat_values(
        keep)))

  def save(self, directory):
    """Writes tokenizer.json and the vocabulary file into directory."""
    tf.io.gfile.makedirs(directory)
    config = dict(self._config(), kind=self.kind)
    with tf.io.gfile.GFile(os.path.join(directory, CONFIG_FILE), "w") as f:
      f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    self._save_vocabulary(directory)


class WordpieceTokenizer(Tokenizer):
  """BERT's tokenizer (`tensorflow_text.BertTokenizer`) over a vocabulary list.

  The vocabulary must contain BERT_SPECIAL_TOKENS and the sentinels.
  `detokenize` joins words with single spaces, so a round trip gives the text
  as BERT's basic tokenizer splits it (lowercased when lower_case).

  `strip_accents`: None, BERT's own rule, strips accents exactly when
  lower-casing (tensorflow-text does both in one step). True or False
  sets it apart, as KerasHub's and some Hugging Face tokenizers do
  (KerasHub's BERT lower-cases and keeps accents): the text is then
  case-folded (`case_fold_utf8`) and accent-stripped (NFD, marks dropped)
  before BERT's splitting, and offsets count bytes of that text, which
  equal the input's wherever folding keeps each character's length (all
  of ASCII).
  """

  kind = "wordpiece"

  def __init__(self, vocab, *, lower_case=True, strip_accents=None,
               num_sentinels=0, name=None):
    vocab = [str(token) for token in vocab]
    index = {token: i for i, token in enumerate(vocab)}
    wanted = BERT_SPECIAL_TOKENS + sentinel_tokens(num_sentinels)
    missing = [token for token in wanted if token not in index]
    if missing:
      raise ValueError(f"The WordPiece vocabulary lacks {missing[:5]} "
                       f"({len(missing)} missing special tokens).")
    pad, unk, cls, sep, mask = (index[t] for t in BERT_SPECIAL_TOKENS)
    special = SpecialIds(pad, unk, cls, sep, mask, eos=sep, sentinels=tuple(
        index[t] for t in sentinel_tokens(num_sentinels)))
    super().__init__(len(vocab), special, name=name)
    self.vocab = vocab
    self.lower_case = lower_case
    self.strip_accents = strip_accents
    self.num_sentinels = num_sentinels
    table = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(
            vocab, tf.range(len(vocab), dtype=tf.int64)), num_oov_buckets=1)
    # BERT's rule in one step; otherwise folded and stripped by _normalize.
    self._together = strip_accents in (None, lower_case)
    self._bert = tf_text.BertTokenizer(
        table, lower_case=lower_case if self._together else False,
        unknown_token="[UNK]")

  def _normalize(self, strings):
    if self._together:
      return strings
    if self.lower_case:
      strings = tf_text.case_fold_utf8(strings)
    if self.strip_accents:
      strings = tf.strings.regex_replace(
          tf_text.normalize_utf8(strings, "NFD"), r"\p{Mn}", "")
    return strings

  def _tokenize_with_offsets(self, strings):
    ids, starts, ends = self._bert.tokenize_with_offsets(
        self._normalize(strings))
    return (tf.cast(ids.merge_dims(-2, -1), tf.int32),
            starts.merge_dims(-2, -1), ends.merge_dims(-2, -1))

  def _detokenize(self, ids):
    words = self._bert.detokenize(tf.cast(ids, tf.int64))
    return tf.strings.reduce_join(words, axis=-1, separator=" ")

  def _config(self):
    config = {"lower_case": self.lower_case,
              "num_sentinels": self.num_sentinels,
              "vocab_file": WORDPIECE_VOCAB_FILE}
    if self.strip_accents is not None:  # folders without it: BERT's rule
      config["strip_accents"] = self.strip_accents
    return config

  def _save_vocabulary(self, directory):
    with tf.io.gfile.GFile(os.path.join(directory, WORDPIECE_VOCAB_FILE),
                           "w") as f:
      f.write("".join(token + "\n" for token in self.vocab))


class _Sentencepiece(Tokenizer):
  """`tensorflow_text.SentencepieceTokenizer` over a serialized model.

  Known pitfall (tensorflow-text 2.21): the SentencePiece resource is owned
  by its op's kernel, and `tf.random.set_seed` or
  `tf_keras.utils.set_random_seed` clear TensorFlow's kernel cache, which
  destroys it. Create this tokenizer after seeding (as `thattn-train` does);
  one created before fails with "Resource ... SentencepieceOp ... does not
  exist"."""

  def __init__(self, model, sp, vocab_size, special, name=None,
               token_count=None):
    super().__init__(vocab_size, special, name=name, token_count=token_count)
    self.model = bytes(model)
    self._sp = sp  # _sentencepiece_op(model)

  def _tokenize_with_offsets(self, strings):
    ids, starts, ends = self._sp.tokenize_with_offsets(strings)
    return ids, tf.cast(starts, tf.int64), tf.cast(ends, tf.int64)

  def _detokenize(self, ids):
    return self._sp.detokenize(ids)

  def _save_vocabulary(self, directory):
    with tf.io.gfile.GFile(os.path.join(directory, SENTENCEPIECE_MODEL_FILE),
                           "wb") as f:
      f.write(self.model)


def _sentencepiece_op(model):
  return tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)


def _piece_ids(sp, pieces):
  return [int(i) for i in sp.string_to_id(tf.constant(pieces)).numpy()]


class SentencepieceTokenizer(_Sentencepiece):
  """thattn's SentencePiece layout (see the module), e.g. from
  `train_sentencepiece`; see `_Sentencepiece` for a pitfall."""

  kind = "sentencepiece"

  def __init__(self, model, *, num_sentinels=0, vocab_size=None, name=None):
    sp = _sentencepiece_op(bytes(model))
    names = ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]", "</s>")
    tokens = names + sentinel_tokens(num_sentinels)
    ids = _piece_ids(sp, tokens)
    unknown = ids[1]
    missing = [t for t, i in zip(tokens, ids) if i == unknown and
               t != "<unk>"]
    if missing:
      raise ValueError(f"The SentencePiece model lacks {missing[:5]} "
                       f"({len(missing)} missing special tokens); train it "
                       "with train_sentencepiece.")
    special = SpecialIds(*ids[:6], sentinels=tuple(ids[6:]))
    pieces = int(sp.vocab_size())
    vocab_size = pieces if vocab_size is None else int(vocab_size)
    if vocab_size < pieces:
      raise ValueError(f"vocab_size={vocab_size} is smaller than the "
                       f"model's {pieces} pieces.")
    super().__init__(model, sp, vocab_size, special, name=name,
                     token_count=pieces)
    self.num_sentinels = num_sentinels

  def _config(self):
    return {"num_sentinels": self.num_sentinels, "vocab_size": self.vocab_size,
            "model_file": SENTENCEPIECE_MODEL_FILE}


# T5's vocabularies: <pad>=0, </s>=1, <unk>=2, and 100 sentinels past the end.
T5_SPECIAL_PIECES = ("<pad>", "</s>", "<unk>")
T5_EXTRA_IDS = 100


class T5SentencepieceTokenizer(_Sentencepiece):
  """T5's vocabulary: a SentencePiece model plus `extra_ids` sentinel ids.

  The layout of T5's public vocabularies (seqio's SentencePieceVocabulary):
  the model's P pieces keep their ids, with <pad>=0, </s>=1 (end of
  sequence) and <unk>=2; the sentinel <extra_id_i> is id P + extra_ids - 1
  - i, past the model's pieces (<extra_id_0> is the last). `vocab_size` may
  be larger than P + extra_ids: it is then the model's embedding rows, which
  Mesh TensorFlow pads to a multiple of 128; those ids never occur.

  T5's vocabulary has no [CLS], [SEP] or [MASK]: </s> stands for [CLS] and
  [SEP], and <extra_id_0> for [MASK]. `detokenize` drops the sentinels, as
  it drops control symbols of thattn's layout (seqio decodes them as
  <unk>). See `_Sentencepiece` for a pitfall.
  """

  kind = "t5_sentencepiece"

  def __init__(self, model, *, extra_ids=T5_EXTRA_IDS, vocab_size=None,
               name=None):
    sp = _sentencepiece_op(bytes(model))
    ids = _piece_ids(sp, T5_SPECIAL_PIECES)
    if ids != [0, 1, 2]:
      raise ValueError(
          f"The SentencePiece model is not in T5's layout: expected "
          f"{dict(zip(T5_SPECIAL_PIECES, (0, 1, 2)))}, got "
          f"{dict(zip(T5_SPECIAL_PIECES, ids))}.")
    pieces = int(sp.vocab_size())
    minimum = pieces + extra_ids
    vocab_size = minimum if vocab_size is None else int(vocab_size)
    if vocab_size < minimum:
      raise ValueError(f"vocab_size={vocab_size} is smaller than the "
                       f"model's {pieces} pieces plus extra_ids={extra_ids}.")
    sentinels = tuple(minimum - 1 - i for i in range(extra_ids))
    special = SpecialIds(pad=0, unk=2, cls=1, sep=1,
                         mask=sentinels[0] if sentinels else 2, eos=1,
                         sentinels=sentinels)
    super().__init__(model, sp, vocab_size, special, name=name,
                     token_count=minimum)
    self.pieces = pieces
    self.extra_ids = extra_ids

  def _detokenize(self, ids):
    pieces = tf.ragged.boolean_mask(ids, ids < self.pieces)
    return self._sp.detokenize(pieces)

  def _config(self):
    return {"extra_ids": self.extra_ids, "vocab_size": self.vocab_size,
            "model_file": SENTENCEPIECE_MODEL_FILE}


def from_sentencepiece_model(model, *, vocab_size=None):
  """The tokenizer of a serialized SentencePiece model, in either layout.

  A model with thattn's control symbols ([CLS], [SEP], [MASK], as
  `train_sentencepiece` makes) is a `SentencepieceTokenizer` with as many
  sentinels as it has; any other is read as T5's vocabulary
  (`T5SentencepieceTokenizer`, 100 extra ids). Either has `vocab_size`
  rows (default: the ids it produces).
  """
  sp = _sentencepiece_op(bytes(model))
  unknown, mask = _piece_ids(sp, ["<unk>", "[MASK]"])
  if mask == unknown:
    return T5SentencepieceTokenizer(model, vocab_size=vocab_size)
  count = 0
  while _piece_ids(sp, [f"<extra_id_{count}>"])[0] != unknown:
    count += 1
  return SentencepieceTokenizer(model, num_sentinels=count,
                                vocab_size=vocab_size)


def load(directory, *, vocab_size=None):
  """The tokenizer that `save(directory)` wrote.

  `vocab_size` (SentencePiece kinds only) replaces the saved embedding row
  count, e.g. with a checkpoint's padded rows.
  """
  config_path = os.path.join(directory, CONFIG_FILE)
  if not tf.io.gfile.exists(config_path):
    raise ValueError(f"{config_path}: no tokenizer config; expected a folder "
                     "written by Tokenizer.save.")
  with tf.io.gfile.GFile(config_path) as f:
    config = json.load(f)
  if config.get("kind") == WordpieceTokenizer.kind:
    with tf.io.gfile.GFile(os.path.join(directory, config["vocab_file"])) as f:
      vocab = f.read().splitlines()
    if vocab_size not in (None, len(vocab)):
      raise ValueError(f"{directory}: a WordPiece tokenizer has exactly its "
                       f"{len(vocab)} tokens as rows, not vocab_size="
                       f"{vocab_size}.")
    return WordpieceTokenizer(vocab, lower_case=config["lower_case"],
                              strip_accents=config.get("strip_accents"),
                              num_sentinels=config["num_sentinels"])
  vocab_size = vocab_size or config.get("vocab_size")
  if config.get("kind") in (SentencepieceTokenizer.kind,
                            T5SentencepieceTokenizer.kind):
    with tf.io.gfile.GFile(os.path.join(directory, config["model_file"]),
                           "rb") as f:
      model = f.read()
    if config["kind"] == T5SentencepieceTokenizer.kind:
      return T5SentencepieceTokenizer(model, extra_ids=config["extra_ids"],
                                      vocab_size=vocab_size)
    # Folders saved before vocab_size was recorded have no padded rows.
    return SentencepieceTokenizer(model, num_sentinels=config["num_sentinels"],
                                  vocab_size=vocab_size)
  if config.get("kind") == "albert_sentencepiece":
    from thattn.data import albert_tokenizer  # pylint: disable=g-import-not-at-top
    return albert_tokenizer.load(directory, config, vocab_size)
  if config.get("kind") == "hugging_face":
    from thattn.data import hugging_face_tokenizer  # pylint: disable=g-import-not-at-top
    return hugging_face_tokenizer.load(directory, config, vocab_size)
  raise ValueError(f"{config_path}: unknown tokenizer kind "
                   f"{config.get('kind')!r}.")


def _text_dataset(texts):
  if isinstance(texts, tf.data.Dataset):
    return texts
  return tf.data.Dataset.from_tensor_slices(tf.constant(list(texts),
                                                        tf.string))


def learn_wordpiece(texts, vocab_size, *, lower_case=True, num_sentinels=100,
                    learn_params=None):
  """A WordpieceTokenizer whose vocabulary is learned from texts.

  texts: an iterable of strings or a tf.data.Dataset of string scalars or
  vectors. vocab_size is an upper bound: the learner may stop short of it.
  """
  # Imported here: the learner pulls in modules that tokenizing doesn't need.
  from tensorflow_text.tools.wordpiece_vocab import (  # pylint: disable=g-import-not-at-top
      bert_vocab_from_dataset)
  reserved = list(BERT_SPECIAL_TOKENS + sentinel_tokens(num_sentinels))
  dataset = _text_dataset(texts)
  if dataset.element_spec.shape.rank == 0:
    dataset = dataset.batch(1024)
  vocab = bert_vocab_from_dataset.bert_vocab_from_dataset(
      dataset, vocab_size=vocab_size, reserved_tokens=reserved,
      bert_tokenizer_params={"lower_case": lower_case},
      learn_params=learn_params or {})
  return WordpieceTokenizer(vocab, lower_case=lower_case,
                            num_sentinels=num_sentinels)


def train_sentencepiece(texts, vocab_size, *, model_type="unigram",
                        num_sentinels=100, normalization_rule_name="nmt_nfkc",
                        **trainer_options):
  """A SentencepieceTokenizer trained by the `sentencepiece` package.

  texts: an iterable of strings (one sentence or paragraph each). Training is
  single-threaded with no sampling of the input, so the same texts give the
  same model. trainer_options go to `SentencePieceTrainer.train`.
  """
  try:
    import sentencepiece  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("Training a SentencePiece model needs the sentencepiece "
                      "package: pip install sentencepiece") from e
  model = io.BytesIO()
  options = dict(
      model_type=model_type, vocab_size=vocab_size, pad_id=0, unk_id=1,
      eos_id=2, bos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]",
                       *sentinel_tokens(num_sentinels)],
      byte_fallback=True, normalization_rule_name=normalization_rule_name,
      num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
      minloglevel=2)
  options.update(trainer_options)
  sentences = (text for text in texts if text.strip())
  sentencepiece.SentencePieceTrainer.train(sentence_iterator=sentences,
                                           model_writer=model, **options)
  return SentencepieceTokenizer(model.getvalue(), num_sentinels=num_sentinels)


def default_tokenizer(kind="wordpiece", vocab_size=8000, cache=None):
  """A tokenizer learned from the default corpus's train split, cached.

  The first call learns it (SentencePiece: seconds; WordPiece: about a
  minute) and saves it under the corpus cache; later calls load it.
  """
  from thattn.data import corpus  # pylint: disable=g-import-not-at-top
  if kind not in ("wordpiece", "sentencepiece"):
    raise ValueError(f"kind must be 'wordpiece' or 'sentencepiece', got "
                     f"{kind!r}.")
  directory = os.path.join(corpus.corpus_dir(cache),
                           f"tokenizer-{kind}-{vocab_size}")
  if tf.io.gfile.exists(directory):
    damage = cache_digest.damage(directory)
    if damage is None:
      return load(directory)
    # thattn's own cache entry, named by kind and size: learned again.
    logging.getLogger("thattn").warning(
        "thattn's cached tokenizer %s is damaged (%s); learning it again",
        directory, damage)
    tf.io.gfile.rmtree(directory)
  paragraphs = [line for document in corpus.documents("train", cache)
                for line in document.split("\n")]
  if kind == "wordpiece":
    tokenizer = learn_wordpiece(paragraphs, vocab_size)
  else:
    tokenizer = train_sentencepiece(paragraphs, vocab_size)
  _cache(tokenizer, directory)
  return tokenizer


def _cache(tokenizer, directory):
  """Saves a learned tokenizer as the cache entry `directory`, whole: in a
  staging folder of this process, renamed into place (a full disk is named,
  and leaves no staging folder)."""
  staging = f"{directory}.tmp{os.getpid()}"
  try:
    with write_failures.cache_writes(os.path.dirname(directory)):
      tokenizer.save(staging)
      cache_digest.write(staging)
  except write_failures.WriteFailed:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)
    raise
  try:
    tf.io.gfile.rename(staging, directory, overwrite=True)
  except (tf.errors.OpError, OSError):
    # Another process put its (identical) tokenizer there first.
    tf.io.gfile.rmtree(staging)
    if cache_digest.damage(directory) is not None:
      raise
