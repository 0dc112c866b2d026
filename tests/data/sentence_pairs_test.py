"""NSP and SOP: pairs cut from documents, labels, layout."""

import numpy as np
import pytest
import tensorflow as tf

from thattn.data import sentence_pairs

SENTENCES = [f"Sentence {i} of the corpus says something quite long here. "
             f"Another clause of sentence {i} follows it!" for i in range(40)]


def _documents():
  # Eight documents of five lines each; lines are segments.
  return tf.data.Dataset.from_tensor_slices(
      ["\n".join(SENTENCES[i:i + 5]) for i in range(0, 40, 5)])


def test_pairs_cover_the_document_in_order(wordpiece):
  document = " ".join(f"Sentence number {i} is here." for i in range(30))
  a, b = sentence_pairs.document_pairs(tf.constant(document), wordpiece, 20)
  flat = []
  for first, second in zip(a.to_list(), b.to_list()):
    assert 0 < len(first) <= 20 and 0 < len(second) <= 20
    flat += first + second
  expected = wordpiece.tokenize(tf.constant([document])).flat_values.numpy()
  np.testing.assert_array_equal(flat, expected)  # no token lost or moved


@pytest.mark.parametrize("objective,label", [
    ("nsp", "next_sentence_labels"), ("sop", "sentence_order_labels")])
def test_batches(wordpiece, objective, label):
  tf.random.set_seed(3)
  data = sentence_pairs.pair_dataset(
      _documents(), wordpiece, objective=objective, sequence_length=48,
      batch_size=16, shuffle_buffer=64, seed=3, repeat=True)
  labels, special = [], wordpiece.special
  for features in data.take(12):
    features = {k: v.numpy() for k, v in features.items()}
    ids = features["input_word_ids"].copy()
    real = features["masked_lm_weights"] > 0
    ids[np.nonzero(real)[0], features["masked_lm_positions"][real]] = (
        features["masked_lm_ids"][real])  # undo the masking
    assert ids.shape == (16, 48)
    for row, type_row, mask_row in zip(ids, features["input_type_ids"],
                                       features["input_mask"]):
      length = mask_row.sum()
      assert mask_row[:length].all() and not mask_row[length:].any()
      first_b = np.flatnonzero(type_row)[0]
      # [CLS] A [SEP] B [SEP], both segments nonempty, then padding.
      assert row[0] == special.cls
      np.testing.assert_array_equal(
          np.flatnonzero(np.isin(row[:length], [special.cls, special.sep])),
          [0, first_b - 1, length - 1])
      assert 1 < first_b - 1 and first_b < length - 1
      assert (type_row[first_b:length] == 1).all()
      assert not type_row[length:].any()
    labels.extend(features[label])
  share = np.mean(labels)
  assert 0.3 < share < 0.6, share


def test_bad_objective(wordpiece):
  with pytest.raises(ValueError, match="objective must be one of"):
    sentence_pairs.pair_dataset(_documents(), wordpiece, objective="xyz",
                                sequence_length=48, batch_size=2)
