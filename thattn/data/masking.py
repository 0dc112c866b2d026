"""Masked language modeling (BERT) as tf.data transformations.

BERT (Devlin et al., 2019, Section 3.1 and Appendix A.1) selects 15% of the
tokens for prediction; of those, 80% become [MASK], 10% a random token and
10% stay unchanged. Selection and replacement use tensorflow-text's ops:
`RandomItemSelector` picks ceil(15% of the selectable tokens) per sequence,
capped at `max_predictions_per_seq`, never [CLS], [SEP] or padding;
`MaskValuesChooser` draws the 80/10/10 replacement (random tokens uniformly
from the whole vocabulary, as BERT does); `mask_language_model` applies them.

Features (Model Garden's names):
    input_word_ids [b, L] int32     masked ids, 0-padded
    input_mask     [b, L] int32     1 for real tokens
    input_type_ids [b, L] int32     segment A = 0, B = 1
    masked_lm_positions [b, P] int32, masked_lm_ids [b, P] int32 (the
    original ids), masked_lm_weights [b, P] float32 (1 for real predictions)
where P = max_predictions_per_seq.

`mlm_dataset` is the pipeline without sentence pairs: documents are packed
end to end, a [SEP] after each, into rows [CLS] t_1 ... t_{L-2} [SEP] (as
RoBERTa's "full sentences" inputs). Everything after tokenization works on
whole batches. `sentence_pairs` builds the NSP and SOP inputs and then calls
`mask_batch`.

Randomness. By default selection and replacement draw from TensorFlow's
stateful random ops (seeded by `tf.random.set_seed`). With `seed=` (an int32
or int64 tensor of shape [2]) `mask_batch` is stateless instead: the masks
are a pure function of (seed, ids), so a trainer that derives the seed from
its step can resume mid-run and see exactly the batches an uninterrupted run
would. The stateless path plugs into tensorflow-text's own extension points
(RandomItemSelector's `shuffle_fn`, and `MaskValuesChooser.get_mask_values`
overridden with the same 80/10/10 rule) and keeps the same statistics.
"""

import dataclasses
import math

import tensorflow as tf
import tensorflow_text as tf_text

from thattn.ops import autograph
from thattn.data import packing


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """BERT's masking rates."""
  selection_rate: float = 0.15
  mask_token_rate: float = 0.8
  random_token_rate: float = 0.1
  max_predictions_per_seq: int = 20

  def __post_init__(self):
    for name in ("selection_rate", "mask_token_rate", "random_token_rate"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got "
                         f"{getattr(self, name)}.")
    if self.mask_token_rate + self.random_token_rate > 1.0:
      raise ValueError(
          f"mask_token_rate + random_token_rate = {self.mask_token_rate} + "
          f"{self.random_token_rate} exceeds 1.")
    if self.max_predictions_per_seq <= 0:
      raise ValueError("max_predictions_per_seq must be positive, got "
                       f"{self.max_predictions_per_seq}.")

  @classmethod
  def for_sequence_length(cls, sequence_length, **kwargs):
    """max_predictions_per_seq = ceil(selection_rate * sequence_length)."""
    rate = kwargs.get("selection_rate", cls.selection_rate)
    return cls(max_predictions_per_seq=math.ceil(round(
        rate * sequence_length, 6)), **kwargs)


class _StatelessMaskValuesChooser(tf_text.MaskValuesChooser):
  """BERT's 80/10/10 replacement drawn from stateless random ops."""

  def __init__(self, vocab_size, mask_token, seed, *, mask_token_rate,
               random_token_rate):
    super().__init__(vocab_size, mask_token, mask_token_rate=mask_token_rate,
                     random_token_rate=random_token_rate)
    self._seed = seed
    self._rates = (mask_token_rate, random_token_rate)

  def get_mask_values(self, masked_lm_ids):
    flat = masked_lm_ids.flat_values
    seeds = tf.random.experimental.stateless_split(self._seed, 2)
    draw = tf.random.stateless_uniform(tf.shape(flat), seeds[0])
    random_ids = tf.random.stateless_uniform(
        tf.shape(flat), seeds[1], 0, self.vocab_size, flat.dtype)
    mask_rate, random_rate = self._rates
    values = tf.where(draw < mask_rate,
                      tf.cast(self.mask_token, flat.dtype), flat)
    values = tf.where((draw > mask_rate) & (draw < mask_rate + random_rate),
                      random_ids, values)
    return masked_lm_ids.with_flat_values(values)


def _stateless_shuffle(seed):
  """A shuffle_fn for RandomItemSelector that draws from (seed, its input).

  The selector shuffles each row's candidate positions separately; those are
  flat positions in the batch, distinct per row, so folding the first one
  into the seed gives every row its own permutation.
  """
  def shuffle(positions):
    row_seed = tf.random.experimental.stateless_fold_in(
        seed, tf.cast(tf.reduce_sum(positions[:1]), tf.int64))
    keys = tf.random.stateless_uniform(tf.shape(positions), row_seed)
    return tf.gather(positions, tf.argsort(keys))
  return shuffle


def mask_batch(ids, type_ids, *, sequence_length, vocab_size, special,
               config=MaskingConfig(), seed=None):
  """Masks a batch of ragged token ids and pads it to features (see module).

  ids, type_ids: ragged int32 [b, (tokens)], rows at most sequence_length.
  special: the tokenizer's SpecialIds.
  seed: None (stateful random ops) or a [2] tensor for stateless masking.
  """
  selector_options = {}
  rates = dict(mask_token_rate=config.mask_token_rate,
               random_token_rate=config.random_token_rate)
  if seed is None:
    chooser = tf_text.MaskValuesChooser(vocab_size, special.mask, **rates)
  else:
    seed = tf.cast(seed, tf.int64)
    selection_seed, value_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 2))
    selector_options["shuffle_fn"] = _stateless_shuffle(selection_seed)
    chooser = _StatelessMaskValuesChooser(vocab_size, special.mask,
                                          value_seed, **rates)
  selector = tf_text.RandomItemSelector(
      max_selections_per_batch=config.max_predictions_per_seq,
      selection_rate=config.selection_rate,
      unselectable_ids=list(sorted(set(special.never_masked))),
      **selector_options)
  masked, positions, originals = tf_text.mask_language_model(
      ids, selector, chooser)
  batch = ids.nrows()
  predictions = [batch, config.max_predictions_per_seq]
  return {
      "input_word_ids": masked.to_tensor(0, shape=[batch, sequence_length]),
      "input_mask": tf.ones_like(ids).to_tensor(
          0, shape=[batch, sequence_length]),
      "input_type_ids": type_ids.to_tensor(0, shape=[batch,
                                                     sequence_length]),
      "masked_lm_positions": tf.cast(positions, tf.int32).to_tensor(
          0, shape=predictions),
      "masked_lm_ids": tf.cast(originals, tf.int32).to_tensor(
          0, shape=predictions),
      "masked_lm_weights": tf.ones_like(positions, tf.float32).to_tensor(
          0.0, shape=predictions),
  }


def mlm_dataset(documents, tokenizer, *, sequence_length, batch_size,
                config=None, documents_per_batch=64, repeat=False,
                cache=False, seed=None):
  """Masked-LM batches from a dataset of document strings.

  Rows are packed to exactly sequence_length, so nothing is padded. With
  repeat=True the data loops forever (pretraining); the last partial row of
  each pass and the last partial batch are left out.

  cache=True keeps the tokenized, packed rows in memory after the first
  pass (a string: in files with that prefix), so later passes only mask:
  tokenizing is most of the pipeline's cost, masking is redrawn every pass.

  seed: None masks with stateful random ops; an int makes batch i's masks a
  pure function of (seed, i) (see the module's "Randomness").
  """
  if sequence_length < 3:
    raise ValueError(f"sequence_length must be at least 3, got "
                     f"{sequence_length}.")
  config = config or MaskingConfig.for_sequence_length(sequence_length)
  special = tokenizer.special
  rows = packing.pack(
      packing.tokenized_batches(documents, tokenizer,
                                documents_per_batch=documents_per_batch),
      sequence_length - 2, separator=special.sep)
  if cache:
    rows = rows.cache("" if cache is True else cache)
  if repeat:
    rows = rows.repeat()
  batches = rows.batch(batch_size, drop_remainder=True)

  @autograph.unconverted
  def to_features(index, rows):
    edge = tf.fill([batch_size, 1], tf.constant(special.cls, tf.int32))
    end = tf.fill([batch_size, 1], tf.constant(special.sep, tf.int32))
    ids = tf.RaggedTensor.from_tensor(tf.concat([edge, rows, end], 1))
    batch_seed = None if seed is None else tf.stack(
        [tf.constant(seed, tf.int64), index])
    return mask_batch(ids, tf.zeros_like(ids), sequence_length=sequence_length,
                      vocab_size=tokenizer.token_count, special=special,
                      config=config, seed=batch_seed)

  return batches.enumerate().map(to_features, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(tf.data.AUTOTUNE)
