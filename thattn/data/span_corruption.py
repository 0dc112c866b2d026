"""T5 span corruption (Raffel et al., 2020, Section 3.1.4 and 3.3.4).

Of a sequence of `length` tokens, round(length * noise_density) tokens are
noise (at least 1, at most length - 1), in round(num_noise /
mean_noise_span_length) spans (at least 1). The paper segments the noise
tokens into that many nonempty spans uniformly at random, and the other
tokens likewise, then interleaves them, non-noise first:

    non-noise_0, noise_0, non-noise_1, noise_1, ..., non-noise_k, noise_k

A random segmentation of n items into k nonempty parts picks the k - 1 cut
points among the n - 1 gaps uniformly at random: every segmentation is
equally likely.

The inputs keep the non-noise tokens and put one sentinel in place of each
noise span; the targets list each sentinel followed by its span; both end
with EOS:

    inputs:  non-noise_0 S_0 non-noise_1 S_1 ... non-noise_k S_k EOS
    targets: S_0 noise_0 S_1 noise_1 ... S_k noise_k EOS

Sentinel i is `tokenizer.special.sentinels[i]` (T5 counts them down from
the end of its vocabulary; here they are named `<extra_id_i>` in the
tokenizer's vocabulary). `reconstruct` inverts the corruption exactly.

All randomness is stateless, from (seed, example index), so the examples are
a pure function of the data and the seed.
"""

import tensorflow as tf

from thattn.ops import autograph
from thattn.data import packing


def span_counts(length, noise_density=0.15, mean_noise_span_length=3.0):
  """(num_noise_tokens, num_noise_spans) for a sequence of `length` tokens."""
  if length < 2:
    raise ValueError(f"length must be at least 2, got {length}.")
  num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
  num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
  return num_noise, num_spans


def lengths_for_inputs_length(inputs_length, noise_density=0.15,
                              mean_noise_span_length=3.0):
  """(tokens_length, targets_length): the longest raw length whose inputs fit.

  inputs = non-noise + spans + EOS; targets = noise + spans + EOS.
  """
  def sizes(length):
    noise, spans = span_counts(length, noise_density, mean_noise_span_length)
    return length - noise + spans + 1, noise + spans + 1
  length = 2
  while sizes(length + 1)[0] <= inputs_length:
    length += 1
  if sizes(length)[0] > inputs_length:
    raise ValueError(f"inputs_length={inputs_length} is too short.")
  return length, sizes(length)[1]


def random_segmentation(num_items, num_segments, seed):
  """Lengths [num_segments] of a uniformly random split of num_items items.

  Every part is nonempty; the cut points are a uniformly random subset of
  size num_segments - 1 of the num_items - 1 gaps between items.
  """
  gaps = tf.range(1, num_items)
  order = tf.argsort(tf.random.stateless_uniform([num_items - 1], seed))
  cuts = tf.sort(tf.gather(gaps, order[:num_segments - 1]))
  bounds = tf.concat([[0], cuts, [num_items]], 0)
  return bounds[1:] - bounds[:-1]


def noise_mask(length, seed, noise_density=0.15, mean_noise_span_length=3.0):
  """bool [length]: True for noise tokens, spans as in the module docstring."""
  num_noise, num_spans = span_counts(length, noise_density,
                                     mean_noise_span_length)
  seeds = tf.random.experimental.stateless_split(seed, 2)
  noise_lengths = random_segmentation(num_noise, num_spans, seeds[0])
  kept_lengths = random_segmentation(length - num_noise, num_spans, seeds[1])
  lengths = tf.reshape(tf.stack([kept_lengths, noise_lengths], 1), [-1])
  is_noise = tf.tile([False, True], [num_spans])
  return tf.repeat(is_noise, lengths)


def corrupt(tokens, mask, sentinels, eos):
  """(inputs, targets) int32 vectors for 1-D tokens and their noise mask."""
  tokens = tf.convert_to_tensor(tokens, tf.int32)
  previous = tf.concat([[False], mask[:-1]], 0)
  span_start = tf.logical_and(mask, tf.logical_not(previous))
  span_index = tf.maximum(tf.cumsum(tf.cast(span_start, tf.int32)) - 1, 0)
  sentinel = tf.gather(tf.constant(sentinels, tf.int32), span_index)

  def interleave(keep_token):
    # Per position: the span's sentinel (where a span starts), then the
    # token (where keep_token); flattened in that order.
    values = tf.reshape(tf.stack([sentinel, tokens], 1), [-1])
    valid = tf.reshape(tf.stack([span_start, keep_token], 1), [-1])
    return tf.concat([tf.boolean_mask(values, valid), [eos]], 0)

  return interleave(tf.logical_not(mask)), interleave(mask)


def reconstruct(inputs, targets, sentinels, eos):
  """The original tokens from (inputs, targets): Python lists of ints.

  Padding after EOS is ignored.
  """
  inputs = list(inputs)[:list(inputs).index(eos)]
  targets = list(targets)[:list(targets).index(eos)]
  spans, current = {}, None
  for token in targets:
    if token in sentinels:
      current = spans.setdefault(token, [])
    else:
      current.append(token)
  original = []
  for token in inputs:
    original.extend(spans[token] if token in sentinels else [token])
  return original


def span_corruption_dataset(documents, tokenizer, *, inputs_length,
                            batch_size, noise_density=0.15,
                            mean_noise_span_length=3.0, seed=0,
                            documents_per_batch=64, repeat=False):
  """Batches {"inputs": [b, inputs_length], "targets": [b, targets_length]}.

  Documents are tokenized, concatenated (T5 joins them with no separator)
  and cut into rows of the raw length whose corrupted inputs fit
  inputs_length; targets_length follows from it. Padding is 0.
  """
  special = tokenizer.special
  tokens_length, targets_length = lengths_for_inputs_length(
      inputs_length, noise_density, mean_noise_span_length)
  _, num_spans = span_counts(tokens_length, noise_density,
                             mean_noise_span_length)
  if num_spans > len(special.sentinels):
    raise ValueError(f"{num_spans} noise spans need as many sentinels, but "
                     f"the tokenizer has {len(special.sentinels)}.")
  if repeat:
    documents = documents.repeat()
  rows = packing.pack(packing.tokenized_batches(
      documents, tokenizer, documents_per_batch=documents_per_batch),
                      tokens_length)

  @autograph.unconverted
  def to_example(index, row):
    mask = noise_mask(tokens_length, tf.stack([tf.cast(seed, tf.int64),
                                               index]),
                      noise_density, mean_noise_span_length)
    inputs, targets = corrupt(row, mask, special.sentinels, special.eos)
    return {"inputs": inputs, "targets": targets}

  examples = rows.enumerate().map(to_example,
                                  num_parallel_calls=tf.data.AUTOTUNE,
                                  deterministic=True)
  return examples.padded_batch(
      batch_size, padded_shapes={"inputs": [inputs_length],
                                 "targets": [targets_length]},
      padding_values=special.pad, drop_remainder=True).prefetch(
          tf.data.AUTOTUNE)
