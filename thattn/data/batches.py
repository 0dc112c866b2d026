"""Step-addressed input pipelines: batch k is a pure function of (seed, k).

The trainer resumes by step, not by replaying an iterator: every batch is
computed from its step number and the seed, with stateless random ops, so a
run restarted at step k sees exactly the batches an uninterrupted run sees
from step k on, and nothing but the step needs saving (the "stateless index"
form of data-iterator state). Resuming costs nothing: no batch is replayed.

How a batch is addressed. The data is held in memory as rows (packed token
rows for pretraining, encoded examples for fine-tuning). Example slot
i = k * batch_size + j is pass e = i // R over the R rows, at position
i % R of that pass's permutation, `tf.random.experimental.index_shuffle`
seeded by (seed, e). So every pass visits every row once, in a fresh order.

Pretraining rows come from `token_rows`: documents tokenized in batches
in-graph and packed end to end by `thattn.data.packing` (all of them once,
up front: a 4 MB corpus takes a few seconds). Masked LM then masks each
batch with `masking.mask_batch(seed=...)`, and span corruption draws each row's
noise from (seed, example slot), as `span_corruption` does.
"""

import numpy as np
import tensorflow as tf

from thattn.ops import autograph
from thattn.data import masking
from thattn.data import packing
from thattn.data import span_corruption

_FOREVER = 2**62
# Seeds of the independent random streams drawn from one user seed.
_ORDER_STREAM, _MASK_STREAM, _NOISE_STREAM = 1, 2, 3


def token_rows(documents, tokenizer, width, *, separator=None,
               documents_per_batch=256):
  """int32 numpy [rows, width]: documents (strings) tokenized and packed.

  The tokens left over after the last full row are dropped.
  """
  if not documents:
    raise ValueError("token_rows needs at least one document.")
  texts = tf.data.Dataset.from_tensor_slices(tf.constant(list(documents)))
  rows = packing.pack(packing.tokenized_batches(
      texts, tokenizer, documents_per_batch=documents_per_batch), width,
                      separator=separator)
  chunks = [chunk.numpy() for chunk in rows.batch(8192)]
  if not chunks:
    raise ValueError(f"The {len(documents)} documents hold fewer than "
                     f"width={width} tokens: no row could be packed.")
  return np.concatenate(chunks).astype(np.int32)


def _stream_seed(seed, stream, value):
  """A [2] int64 stateless seed for (seed, stream, value)."""
  return tf.random.experimental.stateless_fold_in(
      tf.stack([tf.constant(seed, tf.int64), tf.constant(stream, tf.int64)]),
      tf.cast(value, tf.int64))


def row_indices(step, *, batch_size, num_rows, seed, shuffle=True):
  """int64 [batch_size]: the rows of step `step`'s batch (see the module)."""
  slots = (tf.cast(step, tf.int64) * batch_size +
           tf.range(batch_size, dtype=tf.int64))
  position = slots % num_rows
  if not shuffle:
    return position
  epochs = slots // num_rows
  # index_shuffle takes one seed per call here (its batched-seed form
  # rejects [n, 2] seeds in TF 2.21), and a batch spans at most
  # ceil(batch_size / num_rows) + 1 passes: shuffle for each, keep the right one.
  first = epochs[0]
  chosen = position
  for offset in range(-(-batch_size // num_rows) + 1):
    pass_seed = tf.stack([tf.constant(seed, tf.int64),
                          _ORDER_STREAM * 1_000_003 + first + offset])
    shuffled = tf.random.experimental.index_shuffle(
        position, pass_seed, tf.constant(num_rows - 1, tf.int64))
    chosen = tf.where(epochs == first + offset, shuffled, chosen)
  return chosen


def step_dataset(make_batch, *, start_step=0, num_steps=None):
  """A dataset of make_batch(k) for k = start_step, start_step + 1, ...

  num_steps=None: endless. make_batch maps an int64 scalar to a batch.
  """
  end = _FOREVER if num_steps is None else start_step + num_steps
  steps = tf.data.Dataset.range(start_step, end)
  return steps.map(make_batch, num_parallel_calls=tf.data.AUTOTUNE,
                   deterministic=True).prefetch(tf.data.AUTOTUNE)


def mlm_batches(rows, tokenizer, *, batch_size, seed, start_step=0,
                num_steps=None, shuffle=True, config=None):
  """Masked-LM features (see `masking`) of rows [R, L - 2], [CLS] row [SEP]."""
  rows = tf.constant(rows, tf.int32)
  sequence_length = int(rows.shape[1]) + 2
  special = tokenizer.special
  config = config or masking.MaskingConfig.for_sequence_length(sequence_length)

  @autograph.unconverted
  def make_batch(step):
    chosen = tf.gather(rows, row_indices(
        step, batch_size=batch_size, num_rows=rows.shape[0], seed=seed,
        shuffle=shuffle))
    ids = tf.concat([tf.fill([batch_size, 1], special.cls), chosen,
                     tf.fill([batch_size, 1], special.sep)], axis=1)
    ids = tf.RaggedTensor.from_tensor(ids)
    return masking.mask_batch(
        ids, tf.zeros_like(ids), sequence_length=sequence_length,
        vocab_size=tokenizer.token_count, special=special, config=config,
        seed=_stream_seed(seed, _MASK_STREAM, step))

  return step_dataset(make_batch, start_step=start_step, num_steps=num_steps)


def lm_batches(rows, *, batch_size, seed, start_step=0, num_steps=None,
               shuffle=True, start_token=None):
  """Next-token batches of packed rows [R, n + 1]: `inputs` [b, n] each
  row's first n tokens, `targets` [b, n] its last n (position i's target
  is the token after input i). With `start_token` (T5's and Mesh
  TensorFlow's LM convention: 0), the inputs are the targets shifted right
  after it instead, and a row's first token is not read."""
  rows = tf.constant(rows, tf.int32)

  @autograph.unconverted
  def make_batch(step):
    chosen = tf.gather(rows, row_indices(
        step, batch_size=batch_size, num_rows=rows.shape[0], seed=seed,
        shuffle=shuffle))
    targets = chosen[:, 1:]
    if start_token is None:
      return {"inputs": chosen[:, :-1], "targets": targets}
    starts = tf.fill([batch_size, 1], tf.constant(start_token, tf.int32))
    return {"inputs": tf.concat([starts, targets[:, :-1]], axis=1),
            "targets": targets}

  return step_dataset(make_batch, start_step=start_step, num_steps=num_steps)


def prefix_lm_rows(documents, tokenizer, width, *, eos_id, pad_id, seed,
                   documents_per_batch=256):
  """int32 numpy [rows, width]: the T5 paper's prefix LM examples, in
  Mesh TensorFlow's delimited layout [prefix, EOS, target, EOS, padding].

  Each document's tokens are cut into pieces of at most width - 3 tokens
  (so that the example and one padding slot fit), and each piece of two
  tokens or more is split into a prefix and a target at a point drawn
  uniformly from its inner positions, by `seed` (the same rows every run).
  """
  if width < 5:
    raise ValueError(f"A prefix LM example needs width >= 5 (a token of "
                     f"prefix and of target, two end tokens and padding), "
                     f"got {width}.")
  texts = tf.data.Dataset.from_tensor_slices(tf.constant(list(documents)))
  piece = width - 3
  rng = np.random.default_rng(seed)
  rows = []
  for ragged in packing.tokenized_batches(
      texts, tokenizer, documents_per_batch=documents_per_batch):
    for ids in ragged.to_list():
      for start in range(0, len(ids), piece):
        chunk = ids[start:start + piece]
        if len(chunk) < 2:
          continue
        split = int(rng.integers(1, len(chunk)))
        body = chunk[:split] + [eos_id] + chunk[split:] + [eos_id]
        rows.append(body + [pad_id] * (width - len(body)))
  if not rows:
    raise ValueError(f"The {len(documents)} documents hold no piece of two "
                     "tokens or more: no prefix LM example could be made.")
  return np.asarray(rows, np.int32)


def prefix_lm_batches(rows, *, eos_id, batch_size, seed, start_step=0,
                      num_steps=None, shuffle=True, start_token=None):
  """Prefix LM batches of `prefix_lm_rows` [R, n + 1]: `inputs`,
  `targets`, `causal_attention` (t5x's decoder_causal_attention: 1 where
  the inputs attend both ways, the prefix and the position that reads its
  end token) and `loss_weights` (1 on the target's tokens and its end
  token), each [b, n].

  The inputs are a row's first n tokens and the targets its last n, as
  `lm_batches`'s; with `start_token` (T5's LM, as Mesh TensorFlow feeds
  it) the targets are a row's first n tokens and the inputs the targets
  shifted right after it. Where each part ends is read from the end tokens,
  as Mesh TensorFlow's `delimited_lm_inputs_mask` reads it.
  """
  rows = tf.constant(rows, tf.int32)

  @autograph.unconverted
  def make_batch(step):
    chosen = tf.gather(rows, row_indices(
        step, batch_size=batch_size, num_rows=rows.shape[0], seed=seed,
        shuffle=shuffle))
    # The end tokens before each position: 0 in the prefix and at its end
    # token, 1 in the target and at its end token, 2 in the padding.
    ends_before = tf.cumsum(tf.cast(tf.equal(chosen, eos_id), tf.int32),
                            axis=1, exclusive=True)
    if start_token is None:
      inputs, targets = chosen[:, :-1], chosen[:, 1:]
      region = tf.equal(ends_before[:, :-1], 0)
      weights = tf.equal(ends_before[:, 1:], 1)
    else:
      targets = chosen[:, :-1]
      starts = tf.fill([batch_size, 1], tf.constant(start_token, tf.int32))
      inputs = tf.concat([starts, targets[:, :-1]], axis=1)
      region = tf.concat([tf.fill([batch_size, 1], True),
                          tf.equal(ends_before[:, :-2], 0)], axis=1)
      weights = tf.equal(ends_before[:, :-1], 1)
    return {"inputs": inputs, "targets": targets,
            "causal_attention": tf.cast(region, tf.int32),
            "loss_weights": tf.cast(weights, tf.int32)}

  return step_dataset(make_batch, start_step=start_step, num_steps=num_steps)


def span_corruption_lengths(inputs_length, **noise):
  """(raw row length, targets length) whose corrupted inputs fit."""
  return span_corruption.lengths_for_inputs_length(inputs_length, **noise)


def span_corruption_batches(rows, tokenizer, *, inputs_length, batch_size,
                            seed, start_step=0, num_steps=None, shuffle=True,
                            noise_density=0.15, mean_noise_span_length=3.0):
  """{"inputs": [b, inputs_length], "targets": [b, targets_length]}, 0-padded.

  rows: [R, raw length] from `span_corruption_lengths(inputs_length)[0]`.
  """
  rows = tf.constant(rows, tf.int32)
  length = int(rows.shape[1])
  expected, targets_length = span_corruption_lengths(
      inputs_length, noise_density=noise_density,
      mean_noise_span_length=mean_noise_span_length)
  if length != expected:
    raise ValueError(f"Rows of {length} tokens, but inputs_length="
                     f"{inputs_length} needs rows of {expected}.")
  special = tokenizer.special

  def corrupt_one(slot_and_row):
    slot, row = slot_and_row
    mask = span_corruption.noise_mask(
        length, _stream_seed(seed, _NOISE_STREAM, slot), noise_density,
        mean_noise_span_length)
    inputs, targets = span_corruption.corrupt(row, mask, special.sentinels,
                                              special.eos)
    pad = lambda x, n: tf.pad(x, [[0, n - tf.shape(x)[0]]],
                              constant_values=special.pad)
    return pad(inputs, inputs_length), pad(targets, targets_length)

  @autograph.unconverted
  def make_batch(step):
    slots = tf.cast(step, tf.int64) * batch_size + tf.range(
        batch_size, dtype=tf.int64)
    chosen = tf.gather(rows, row_indices(
        step, batch_size=batch_size, num_rows=rows.shape[0], seed=seed,
        shuffle=shuffle))
    inputs, targets = tf.map_fn(
        corrupt_one, (slots, chosen), fn_output_signature=(
            tf.TensorSpec([inputs_length], tf.int32),
            tf.TensorSpec([targets_length], tf.int32)))
    return {"inputs": inputs, "targets": targets}

  return step_dataset(make_batch, start_step=start_step, num_steps=num_steps)


def feature_batches(features, *, batch_size, seed, start_step=0,
                    num_steps=None, shuffle=True):
  """Batches of a dict of equal-length numpy arrays, addressed by step."""
  tensors = {key: tf.constant(value) for key, value in features.items()}
  num_rows = len(next(iter(features.values())))
  if num_rows == 0:
    raise ValueError("feature_batches needs at least one example.")

  @autograph.unconverted
  def make_batch(step):
    chosen = row_indices(step, batch_size=batch_size, num_rows=num_rows,
                         seed=seed, shuffle=shuffle)
    return {key: tf.gather(value, chosen) for key, value in tensors.items()}

  return step_dataset(make_batch, start_step=start_step, num_steps=num_steps)
