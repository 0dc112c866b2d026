"""Sentence-pair pretraining: next-sentence (BERT) and sentence-order (ALBERT).

Each example is [CLS] A [SEP] B [SEP] with masked LM on top (`mlm`), where A
and B are consecutive spans of one document:

- NSP (Devlin et al., 2019): half the time B is replaced by a span of another
  document; `next_sentence_labels` is 1 when B is such a random span, else 0.
- SOP (Lan et al., 2020): half the time A and B are swapped;
  `sentence_order_labels` is 1 when swapped, else 0.

How A and B are cut, per document, all in the graph:
1. The document's lines are its segments; each line is further split into
   sentences after ".", "!" or "?" followed by a space and a capital letter.
2. Sentences are tokenized; one longer than half the budget (budget =
   sequence_length - 3) is cut into pieces of at most half the budget, so
   no token is lost.
3. Pieces are grouped greedily, in order, into chunks of at most half the
   budget; chunks 0 and 1 make a pair, 2 and 3 the next, and so on. An odd
   last chunk is split in the middle into its own pair (a one-token leftover
   makes no pair).
Departure from BERT/ALBERT: they draw a random target length and split point
per pair; here A and B each fill up to half the budget, which keeps the code
vectorized and the pairs deterministic.

Random B (NSP) and swapping (SOP) are decided per batch, after a shuffle of
the pairs: a random B is the B of the next row in the batch; where that row
comes from the same document the pair stays a true next pair, so the label
is always right and the random fraction is just under one half.
"""

import tensorflow as tf

from thattn.ops import autograph
from thattn.data import masking

OBJECTIVES = ("nsp", "sop")
_LABEL_NAMES = {"nsp": "next_sentence_labels", "sop": "sentence_order_labels"}


def _sentences(document):
  text = tf.strings.regex_replace(document, r"([.!?])[ \t]+([A-Z])",
                                  "\\1\n\\2")
  parts = tf.strings.strip(tf.strings.split(text, "\n"))
  return tf.boolean_mask(parts, tf.strings.length(parts) > 0)


def _split_long_rows(ids, limit):
  """Cuts every row of ragged ids into pieces of at most `limit` tokens."""
  lengths = ids.row_lengths()
  pieces = tf.maximum((lengths + limit - 1) // limit, 1)
  first_piece = tf.cumsum(pieces, exclusive=True)
  rows = ids.value_rowids()
  position = tf.range(tf.size(rows, tf.int64)) - tf.gather(ids.row_starts(),
                                                            rows)
  new_rows = tf.gather(first_piece, rows) + position // limit
  return tf.RaggedTensor.from_value_rowids(ids.flat_values, new_rows,
                                           nrows=tf.reduce_sum(pieces))


def _chunk_ids(lengths, limit):
  """Greedy grouping: the chunk of each piece, chunks at most `limit` long."""
  def step(state, length):
    chunk, used = state
    start_new = tf.logical_and(used > 0, used + length > limit)
    return (chunk + tf.cast(start_new, tf.int64),
            tf.where(start_new, length, used + length))
  zero = tf.constant(0, tf.int64)
  return tf.scan(step, lengths, initializer=(zero, zero))[0]


def document_pairs(document, tokenizer, half_budget):
  """(A, B) ragged [pairs, (tokens)] for one document string."""
  ids = tokenizer.tokenize(_sentences(document))
  ids = _split_long_rows(ids, half_budget)
  ids = tf.ragged.boolean_mask(ids, ids.row_lengths() > 0)
  chunks = tf.RaggedTensor.from_value_rowids(
      ids.flat_values, tf.gather(_chunk_ids(ids.row_lengths(), half_budget),
                                 ids.value_rowids()))
  num_chunks = chunks.nrows()
  num_even = num_chunks // 2 * 2
  firsts, seconds = chunks[0:num_even:2], chunks[1:num_even:2]
  last = chunks[num_even:]  # the odd chunk out, or nothing
  middle = last.row_lengths() // 2
  last_first = tf.ragged.boolean_mask(
      last, tf.ragged.range(last.row_lengths()) < tf.expand_dims(middle, 1))
  last_second = tf.ragged.boolean_mask(
      last, tf.ragged.range(last.row_lengths()) >= tf.expand_dims(middle, 1))
  firsts = tf.concat([firsts, last_first], 0)
  seconds = tf.concat([seconds, last_second], 0)
  keep = tf.logical_and(firsts.row_lengths() > 0, seconds.row_lengths() > 0)
  return (tf.ragged.boolean_mask(firsts, keep),
          tf.ragged.boolean_mask(seconds, keep))


def _relabel(a, b, document_ids, objective, rate=0.5):
  """Random B (NSP) or swapped order (SOP) for about `rate` of the rows."""
  batch = a.nrows()
  index = tf.range(batch)
  coin = tf.random.uniform([batch]) < rate
  if objective == "nsp":
    rolled = tf.roll(index, -1, axis=0)
    use_other = tf.logical_and(
        coin, tf.not_equal(tf.gather(document_ids, rolled), document_ids))
    b = tf.gather(b, tf.where(use_other, rolled, index))
    return a, b, tf.cast(use_other, tf.int32)
  both = tf.concat([a, b], 0)
  first = tf.gather(both, tf.where(coin, index + batch, index))
  second = tf.gather(both, tf.where(coin, index, index + batch))
  return first, second, tf.cast(coin, tf.int32)


def pair_dataset(documents, tokenizer, *, objective, sequence_length,
                 batch_size, config=None, shuffle_buffer=1000, seed=None,
                 repeat=False):
  """Batches of masked-LM features plus the objective's labels.

  documents: a dataset of document strings (lines = segments).
  objective: "nsp" or "sop".
  """
  if objective not in OBJECTIVES:
    raise ValueError(f"objective must be one of {OBJECTIVES}, got "
                     f"{objective!r}.")
  if sequence_length < 5:
    raise ValueError(f"sequence_length must be at least 5 for [CLS] A [SEP] "
                     f"B [SEP], got {sequence_length}.")
  half_budget = (sequence_length - 3) // 2
  config = config or masking.MaskingConfig.for_sequence_length(sequence_length)
  special = tokenizer.special
  if repeat:
    documents = documents.repeat()

  def pairs_of(index, document):
    a, b = document_pairs(document, tokenizer, half_budget)
    ids = tf.fill([a.nrows()], index)
    return tf.data.Dataset.from_tensor_slices((a, b, ids))

  pairs = documents.enumerate().interleave(
      pairs_of, cycle_length=tf.data.AUTOTUNE, block_length=1,
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if shuffle_buffer:
    pairs = pairs.shuffle(shuffle_buffer, seed=seed)
  batches = pairs.ragged_batch(batch_size, drop_remainder=True)

  @autograph.unconverted
  def to_features(a, b, document_ids):
    a, b, labels = _relabel(a, b, document_ids, objective)
    column = lambda token: tf.fill([batch_size, 1], tf.constant(token,
                                                                tf.int32))
    ids = tf.concat([column(special.cls), a, column(special.sep), b,
                     column(special.sep)], axis=1)
    type_ids = tf.concat([tf.zeros_like(column(0)), tf.zeros_like(a),
                          tf.zeros_like(column(0)), tf.ones_like(b),
                          tf.ones_like(column(0))], axis=1)
    features = masking.mask_batch(ids, type_ids, sequence_length=sequence_length,
                              vocab_size=tokenizer.token_count,
                              special=special, config=config)
    features[_LABEL_NAMES[objective]] = labels
    return features

  return batches.map(to_features, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(tf.data.AUTOTUNE)
