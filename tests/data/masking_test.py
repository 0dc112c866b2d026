"""Masked LM: BERT's 15% and 80/10/10 over a large batch, and the features."""

import numpy as np
import pytest
import tensorflow as tf

from thattn.data import corpus
from thattn.data import masking
from thattn.data import sources


def _first_batch(tokenizer, cache, seed):
  documents = sources.text_files(corpus.path("heldout", cache),
                                 split_blank_lines=True)
  return next(iter(masking.mlm_dataset(documents, tokenizer, sequence_length=128,
                                   batch_size=1024, repeat=True, seed=seed)))


# Stateful masking (seed None) and the stateless masking a trainer resumes.
@pytest.fixture(scope="module", params=[None, 7], ids=["stateful", "stateless"])
def batch(request, wordpiece, corpus_cache):
  """One batch of 1024 x 128 from the held-out corpus, with the originals."""
  tf.random.set_seed(1)
  features = _first_batch(wordpiece, corpus_cache, request.param)
  features = {k: v.numpy() for k, v in features.items()}
  original = features["input_word_ids"].copy()
  for row, positions, ids, weights in zip(
      original, features["masked_lm_positions"], features["masked_lm_ids"],
      features["masked_lm_weights"]):
    real = weights > 0
    row[positions[real]] = ids[real]
  return features, original


def test_shapes_and_dtypes(batch):
  features, _ = batch
  assert features["input_word_ids"].shape == (1024, 128)
  assert features["masked_lm_positions"].shape == (1024, 20)
  assert features["input_word_ids"].dtype == np.int32
  assert features["masked_lm_weights"].dtype == np.float32
  assert (features["input_mask"] == 1).all()  # packed: no padding
  assert (features["input_type_ids"] == 0).all()


def test_fifteen_percent_of_selectable_tokens_are_selected(batch, wordpiece):
  features, original = batch
  special = wordpiece.special
  selectable = ~np.isin(original, [special.cls, special.sep, special.pad])
  selected = features["masked_lm_weights"].sum()
  assert abs(selected / selectable.sum() - 0.15) < 0.005
  positions = features["masked_lm_positions"][features["masked_lm_weights"]
                                              > 0]
  rows = np.nonzero(features["masked_lm_weights"] > 0)[0]
  assert selectable[rows, positions].all()  # never [CLS], [SEP] or padding


def test_eighty_ten_ten(batch, wordpiece):
  features, original = batch
  real = features["masked_lm_weights"] > 0
  rows = np.nonzero(real)[0]
  positions = features["masked_lm_positions"][real]
  now = features["input_word_ids"][rows, positions]
  before = original[rows, positions]
  mask_share = np.mean(now == wordpiece.special.mask)
  changed_share = np.mean((now != wordpiece.special.mask) & (now != before))
  kept_share = np.mean(now == before)
  # 19,456 predictions: one standard error of a 10% share is 0.2%.
  assert abs(mask_share - 0.8) < 0.015
  assert abs(changed_share - 0.1) < 0.01
  assert abs(kept_share - 0.1) < 0.01
  np.testing.assert_array_equal(features["masked_lm_ids"][real], before)


def test_stateless_masking_is_a_function_of_the_seed(wordpiece,
                                                    corpus_cache):
  first = _first_batch(wordpiece, corpus_cache, seed=3)
  tf.random.set_seed(99)  # no effect on the stateless path
  again = _first_batch(wordpiece, corpus_cache, seed=3)
  other = _first_batch(wordpiece, corpus_cache, seed=4)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert not np.array_equal(first["masked_lm_positions"],
                            other["masked_lm_positions"])
  # Rows get different masks: no two rows of one batch select alike.
  positions = first["masked_lm_positions"].numpy()
  assert len({tuple(row) for row in positions}) == len(positions)


def test_config_checks():
  assert masking.MaskingConfig.for_sequence_length(128).max_predictions_per_seq \
      == 20
  assert masking.MaskingConfig.for_sequence_length(512).max_predictions_per_seq \
      == 77
  with pytest.raises(ValueError, match="exceeds 1"):
    masking.MaskingConfig(mask_token_rate=0.95, random_token_rate=0.1)


def _unmasked(features):
  ids = features["input_word_ids"].numpy().copy()
  real = features["masked_lm_weights"].numpy() > 0
  ids[np.nonzero(real)[0], features["masked_lm_positions"].numpy()[real]] = (
      features["masked_lm_ids"].numpy()[real])
  return ids, features["masked_lm_positions"].numpy()


def test_cached_passes_repeat_the_rows_and_redraw_the_masks(wordpiece,
                                                           corpus_cache):
  documents = tf.data.Dataset.from_tensor_slices(
      corpus.documents("heldout", corpus_cache)[:3])
  # batch_size=1, so that no batch straddles two passes.
  one_pass = list(masking.mlm_dataset(documents, wordpiece, sequence_length=64,
                                  batch_size=1))
  assert one_pass
  looped = masking.mlm_dataset(documents, wordpiece, sequence_length=64,
                           batch_size=1, repeat=True, cache=True)
  batches = list(looped.take(2 * len(one_pass)))
  first = [_unmasked(b) for b in batches[:len(one_pass)]]
  second = [_unmasked(b) for b in batches[len(one_pass):]]
  for (ids_1, positions_1), (ids_2, positions_2), plain in zip(
      first, second, one_pass):
    np.testing.assert_array_equal(ids_1, ids_2)
    np.testing.assert_array_equal(ids_1, _unmasked(plain)[0])
  assert any(not np.array_equal(a[1], b[1]) for a, b in zip(first, second))
