"""ALBERT's tokenizer: a SentencePiece model after ALBERT's own normalization.

ALBERT's released vocabulary (`30k-clean.model`) is a SentencePiece model
with <pad>=0, <unk>=1, [CLS]=2, [SEP]=3, [MASK]=4 and no end-of-sequence
piece ([SEP] ends a sequence, as in BERT). The libraries that read it
normalize the text before SentencePiece in three different ways, and a
converted model_dir keeps its source's (`AlbertSentencepieceTokenizer`'s
options):

- google-research/albert (`tokenization.preprocess_text` and
  `encode_pieces`, which Model Garden's `FullSentencePieceTokenizer`
  keeps, less the quotes): `` and '' become ", NFKD with combining marks
  dropped (`strip_accents`), lower-casing (`lower_case`), then
  SentencePiece; a piece that ends in a digit and a comma ("▁1990,") is
  split into the digits' own pieces and "," (`split_digit_comma`).
- Hugging Face's `AlbertTokenizer` (transformers 5, the `tokenizers`
  pipeline): the same normalization (`keep_accents` and `do_lower_case`
  in tokenizer_config.json), no digit-comma split.
- KerasHub's `AlbertTokenizer`: SentencePiece alone.

All of it runs in the graph (tensorflow-text's SentencePiece op, ICU's
NFKD and lower-casing), so the tokenizer exports with a SavedModel like
thattn's others. `tokenize_with_offsets` gives byte spans of the input,
not of the normalized text: each input character's normalized length is
known, so a token's normalized span maps back to the characters that made
it. The pieces a digit-comma split makes share their piece's span, the
comma its last byte.

`lower_case` uses ICU's full lower-casing (`tf.strings.lower` over
UTF-8), as Python's `str.lower` and Rust's `to_lowercase` do; combining
marks are Unicode's category Mn (Python's `unicodedata.combining` tests a
nonzero combining class, which differs only for a few marks outside Mn).
"""

import os
import re

import tensorflow as tf
import tensorflow_text as tf_text

from thattn.data import tokenizers

# SentencePiece's word-boundary mark, U+2581 (three bytes in UTF-8).
WORD_BOUNDARY = "\u2581"
ALBERT_SPECIAL_PIECES = ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
# Stands in for the second character of `` and '', so that replacing each
# pair by " keeps every byte position (it is dropped before SentencePiece).
_PLACEHOLDER = "\x00"


class AlbertSentencepieceTokenizer(tokenizers._Sentencepiece):  # pylint: disable=protected-access
  """ALBERT's SentencePiece model with ALBERT's normalization (see module).

  Args:
    model: the serialized SentencePiece model.
    lower_case: lower-case before SentencePiece.
    strip_accents: NFKD, then drop combining marks.
    replace_quotes: `` and '' become ".
    split_digit_comma: google-research/albert's split of pieces ending in
      a digit and a comma.
    split_symbols: pieces found in the input before anything else, each
      stretch of text between them tokenized on its own (Hugging Face
      matches its added tokens so).
  """

  kind = "albert_sentencepiece"

  def __init__(self, model, *, lower_case=True, strip_accents=True,
               replace_quotes=True, split_digit_comma=False,
               split_symbols=(), name=None):
    sp = tokenizers._sentencepiece_op(bytes(model))  # pylint: disable=protected-access
    ids = tokenizers._piece_ids(sp, ALBERT_SPECIAL_PIECES)  # pylint: disable=protected-access
    missing = [piece for piece, i in zip(ALBERT_SPECIAL_PIECES, ids)
               if i == ids[1] and piece != "<unk>"]
    if missing:
      raise ValueError(f"The SentencePiece model lacks {missing}; ALBERT's "
                       f"vocabulary has {list(ALBERT_SPECIAL_PIECES)}.")
    pad, unk, cls, sep, mask = ids
    special = tokenizers.SpecialIds(pad, unk, cls, sep, mask, eos=sep,
                                    sentinels=())
    super().__init__(model, sp, int(sp.vocab_size()), special, name=name)
    self.lower_case = bool(lower_case)
    self.strip_accents = bool(strip_accents)
    self.replace_quotes = bool(replace_quotes)
    self.split_digit_comma = bool(split_digit_comma)
    self.split_symbols = tuple(str(symbol) for symbol in split_symbols)
    self._comma = tokenizers._piece_ids(sp, [","])[0]  # pylint: disable=protected-access

  @property
  def _normalizes(self):
    return self.lower_case or self.strip_accents or self.replace_quotes

  def _normalize_characters(self, strings):
    """(text, forms, starts, ends): the normalized text; each input
    character's normalized form, ragged [batch, (characters)], whose byte
    lengths map offsets back; and each character's input byte span."""
    if self.replace_quotes:
      for pair in ("``", "''"):
        strings = tf.strings.regex_replace(strings, pair, '"' + _PLACEHOLDER)
    chars, starts = tf.strings.unicode_split_with_offsets(strings, "UTF-8")
    ends = starts + tf.strings.length(chars).with_flat_values(
        tf.cast(tf.strings.length(chars.flat_values), tf.int64))
    forms = tf.strings.regex_replace(chars.flat_values, _PLACEHOLDER, "")
    if self.strip_accents:
      forms = tf.strings.regex_replace(
          tf_text.normalize_utf8(forms, "NFKD"), r"\p{Mn}", "")
    if self.lower_case:
      forms = tf.strings.lower(forms, encoding="utf-8")
    forms = chars.with_flat_values(forms)
    text = tf.strings.reduce_join(forms, axis=-1)
    if self.lower_case:
      # Again on the whole text: Greek's final sigma depends on the next
      # character (and has the same length as the other sigma).
      text = tf.strings.lower(text, encoding="utf-8")
    return text, forms, starts, ends

  def _tokenize_with_offsets(self, strings):
    if not self.split_symbols:
      return self._tokenize_text(strings)
    # Hugging Face's way: the symbols are matched in the input first, and
    # each stretch of text between them is tokenized on its own (so gets
    # its own leading "▁").
    pattern = "|".join(re.escape(symbol) for symbol in sorted(
        self.split_symbols, key=len, reverse=True))
    segments, segment_starts, _ = tf_text.regex_split_with_offsets(
        strings, pattern, keep_delim_regex_pattern=pattern)
    flat = segments.flat_values
    ids, starts, ends = self._tokenize_text(flat)
    symbol = tf.strings.regex_full_match(flat, pattern)
    chosen = tf.boolean_mask(flat, symbol)
    ids = _replace_rows(ids, symbol, tf.RaggedTensor.from_tensor(
        self._sp.string_to_id(chosen)[:, None]))
    starts = _replace_rows(starts, symbol, tf.RaggedTensor.from_tensor(
        tf.zeros_like(chosen, tf.int64)[:, None]))
    ends = _replace_rows(ends, symbol, tf.RaggedTensor.from_tensor(
        tf.cast(tf.strings.length(chosen), tf.int64)[:, None]))
    shift = tf.repeat(segment_starts.flat_values, ids.row_lengths())
    return tuple(segments.with_flat_values(rows).merge_dims(1, 2) for rows in (
        ids, starts + ids.with_flat_values(shift),
        ends + ids.with_flat_values(shift)))

  def _tokenize_text(self, strings):
    """(ids, starts, ends) of strings, normalized and split by pieces."""
    if not self._normalizes:
      text = strings
    else:
      text, forms, char_starts, char_ends = self._normalize_characters(
          strings)
    ids, starts, ends = self._sp.tokenize_with_offsets(text)
    starts, ends = tf.cast(starts, tf.int64), tf.cast(ends, tf.int64)
    if self.split_digit_comma:
      ids, starts, ends = self._split_digit_comma(ids, starts, ends)
    if self._normalizes:
      starts, ends = _input_spans(forms, char_starts, char_ends, starts, ends)
    return ids, starts, ends

  def _split_digit_comma(self, ids, starts, ends):
    """google-research/albert's `encode_pieces`: a piece like "▁1990,"
    becomes the pieces of "1990" (without a leading "▁" where the piece
    had none) and ","."""
    pieces = self._sp.id_to_string(ids.flat_values)
    split = tf.strings.regex_full_match(pieces, r".*\p{Nd},")
    chosen = tf.boolean_mask(pieces, split)
    length = tf.strings.length(chosen)
    sub_ids = self._sp.tokenize(tf.strings.regex_replace(
        tf.strings.substr(chosen, tf.zeros_like(length), length - 1),
        WORD_BOUNDARY, ""))
    # Where the piece began inside a word, its digits do too.
    sub_pieces = self._sp.id_to_string(sub_ids.flat_values)
    bare = tf.strings.substr(sub_pieces, len(WORD_BOUNDARY.encode("utf-8")),
                             -1)
    fix = tf.equal(_row_positions(sub_ids), 0) & tf.repeat(
        ~tf.strings.regex_full_match(chosen, WORD_BOUNDARY + ".*"),
        sub_ids.row_lengths()) & tf.strings.regex_full_match(
            sub_pieces, WORD_BOUNDARY + ".*")
    sub_ids = tf.ragged.boolean_mask(
        sub_ids.with_flat_values(tf.where(fix, self._sp.string_to_id(bare),
                                          sub_ids.flat_values)),
        sub_ids.with_flat_values(~(fix & tf.equal(bare, ""))))
    sub_ids = tf.concat([sub_ids, tf.fill([tf.size(chosen), 1], self._comma)],
                        axis=1)
    per_token = _replace_rows(
        tf.RaggedTensor.from_tensor(ids.flat_values[:, None]), split, sub_ids)
    # Spans: the comma its piece's last byte, the digits' pieces the rest.
    lengths = per_token.row_lengths()
    was_split = tf.repeat(split, lengths)
    comma = was_split & tf.equal(_row_positions(per_token),
                                 tf.repeat(lengths - 1, lengths))
    token_starts = tf.repeat(starts.flat_values, lengths)
    token_ends = tf.repeat(ends.flat_values, lengths)
    new_starts = tf.where(comma, token_ends - 1, token_starts)
    new_ends = tf.where(was_split & ~comma, token_ends - 1, token_ends)
    return tuple(ids.with_flat_values(per_token.with_flat_values(values))
                 .merge_dims(1, 2) for values in (per_token.flat_values,
                                                  new_starts, new_ends))

  def _config(self):
    return {"lower_case": self.lower_case,
            "strip_accents": self.strip_accents,
            "replace_quotes": self.replace_quotes,
            "split_digit_comma": self.split_digit_comma,
            "split_symbols": list(self.split_symbols),
            "model_file": tokenizers.SENTENCEPIECE_MODEL_FILE}


def _row_positions(rows):
  """Each value's position in its row, of a ragged [n, (k)]."""
  return tf.range(tf.size(rows.flat_values, out_type=tf.int64)) - tf.repeat(
      rows.row_starts(), rows.row_lengths())


def _replace_rows(rows, chosen, replacements):
  """rows (ragged [n, (k)]) with the rows where `chosen` ([n] bool) is true
  replaced, in order, by those of `replacements` (ragged [m, (k')])."""
  count = tf.shape(chosen, out_type=tf.int64)[0]
  order = tf.where(chosen, count + tf.cumsum(tf.cast(chosen, tf.int64)) - 1,
                   tf.range(count))
  return tf.gather(tf.concat([rows, replacements], axis=0), order)


def _input_spans(forms, char_starts, char_ends, starts, ends):
  """Token spans in the normalized text -> spans in the input.

  forms: each input character's normalized form, ragged [batch, (chars)];
  char_starts, char_ends: the characters' input byte spans; starts, ends:
  the tokens' normalized byte spans, ragged [batch, (tokens)].
  """
  lengths = tf.cast(tf.strings.length(forms.flat_values), tf.int64)
  # Where each character's normalized form ends, counted over the batch.
  form_ends = tf.cumsum(lengths)
  row_base = tf.gather(tf.concat([tf.zeros([1], tf.int64), form_ends], 0),
                       forms.row_starts())
  token_base = tf.repeat(row_base, starts.row_lengths())
  row_last = tf.repeat(forms.row_limits() - 1, starts.row_lengths())

  def after(position):  # the first character whose form ends past it
    return tf.searchsorted(form_ends, token_base + position, side="right",
                           out_type=tf.int64)

  first = tf.minimum(after(starts.flat_values), row_last)
  # The last character whose form ends by the token's end, with those that
  # normalize to nothing right after it (a combining mark, the second
  # character of ``): they belong to the token.
  last = tf.clip_by_value(after(ends.flat_values) - 1, first, row_last)
  input_starts = tf.gather(char_starts.flat_values, first)
  input_ends = tf.where(ends.flat_values > starts.flat_values,
                        tf.gather(char_ends.flat_values, last), input_starts)
  return (starts.with_flat_values(input_starts),
          ends.with_flat_values(input_ends))


def load(directory, config, vocab_size=None):
  """The tokenizer `save(directory)` wrote, from its tokenizer.json
  `config` (`thattn.data.tokenizers.load` dispatches here)."""
  with tf.io.gfile.GFile(os.path.join(directory, config["model_file"]),
                         "rb") as f:
    tokenizer = AlbertSentencepieceTokenizer(f.read(), **{
        name: config[name] for name in ("lower_case", "strip_accents",
                                        "replace_quotes",
                                        "split_digit_comma")},
        split_symbols=config.get("split_symbols", ()))
  if vocab_size not in (None, tokenizer.vocab_size):
    raise ValueError(f"{directory}: ALBERT's tokenizer has exactly its "
                     f"{tokenizer.vocab_size} pieces as rows, not "
                     f"vocab_size={vocab_size}.")
  return tokenizer
