"""Packs a stream of tokenized documents into fixed-width rows, vectorized.

Documents are tokenized a batch at a time, concatenated (optionally with a
separator after each), and cut into rows of `width` tokens. The tokens left
over at the end of one batch carry into the next through `Dataset.scan`, so
no token is lost except the final partial row when the data ends. This keeps
every op batched: there is no per-token or per-document Python work.
"""

import tensorflow as tf

from thattn.ops import autograph


def tokenized_batches(documents, tokenizer, *, documents_per_batch=64):
  """Ragged int32 token ids [documents, (tokens)], tokenized in batches."""
  return documents.batch(documents_per_batch).map(
      tokenizer.tokenize, num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True)


def pack(token_batches, width, *, separator=None):
  """Rows of exactly `width` tokens, one int32 vector per element.

  token_batches: a dataset of ragged [documents, (tokens)] int32 ids.
  separator: an id appended after every document (e.g. [SEP]), or None.
  """
  if width <= 0:
    raise ValueError(f"width must be positive, got {width}.")

  @autograph.unconverted
  def flatten(ids):
    if separator is not None:
      ends = tf.fill([ids.nrows(), 1], tf.constant(separator, tf.int32))
      ids = tf.concat([ids, ends], axis=1)
    return ids.flat_values

  @autograph.unconverted
  def cut(leftover, tokens):
    tokens = tf.concat([leftover, tokens], 0)
    num_rows = tf.size(tokens) // width
    rows = tf.reshape(tokens[:num_rows * width], [num_rows, width])
    return tokens[num_rows * width:], rows

  streams = token_batches.map(flatten, num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True)
  rows = streams.scan(tf.zeros([0], tf.int32), cut)
  return rows.unbatch()
