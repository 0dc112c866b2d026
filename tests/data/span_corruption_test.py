"""T5 span corruption: statistics, uniform segmentation, exact inversion."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from thattn.data import corpus
from thattn.data import sources
from thattn.data import span_corruption
from thattn.data import tokenizers

SENTINELS = tuple(range(10_000, 10_100))
EOS = 1


def _spans(mask):
  lengths, run = [], 0
  for noisy in list(mask) + [False]:
    if noisy:
      run += 1
    elif run:
      lengths.append(run)
      run = 0
  return lengths


def test_noise_density_and_mean_span_length():
  noise, spans = 0, []
  for index in range(200):
    mask = span_corruption.noise_mask(512, tf.constant([7, index])).numpy()
    assert not mask[0] and mask[-1]  # starts with non-noise, ends with noise
    noise += mask.sum()
    spans += _spans(mask)
  assert abs(noise / (200 * 512) - 0.15) < 0.002
  assert abs(np.mean(spans) - 3.0) < 0.1
  assert np.std(spans) > 1.0  # lengths vary: a random segmentation
  assert len(spans) == 200 * span_corruption.span_counts(512)[1]


def test_random_segmentation_is_uniform():
  # 6 items in 3 nonempty parts: C(5, 2) = 10 equally likely segmentations.
  counts = collections.Counter(
      tuple(span_corruption.random_segmentation(
          6, 3, tf.constant([1, i])).numpy()) for i in range(2000))
  assert len(counts) == 10
  assert all(sum(key) == 6 and min(key) >= 1 for key in counts)
  assert max(counts.values()) < 260 and min(counts.values()) > 140


def test_inputs_and_targets_reconstruct_the_tokens():
  for index in range(50):
    tokens = tf.random.stateless_uniform([200], [3, index], 2, 5000,
                                         tf.int32)
    mask = span_corruption.noise_mask(200, tf.constant([5, index]))
    inputs, targets = span_corruption.corrupt(tokens, mask, SENTINELS, EOS)
    num_noise, num_spans = span_corruption.span_counts(200)
    assert len(inputs) == 200 - num_noise + num_spans + 1
    assert len(targets) == num_noise + num_spans + 1
    assert span_corruption.reconstruct(
        inputs.numpy(), targets.numpy(), SENTINELS, EOS) == list(
            tokens.numpy())


def test_t5_lengths():
  assert span_corruption.lengths_for_inputs_length(512) == (568, 114)


def test_dataset_from_text(sentencepiece, corpus_cache):
  documents = sources.text_files(corpus.path("heldout", corpus_cache),
                                 split_blank_lines=True)
  data = span_corruption.span_corruption_dataset(
      documents, sentencepiece, inputs_length=64, batch_size=8, seed=1)
  tokens_length, targets_length = span_corruption.lengths_for_inputs_length(
      64)
  special = sentencepiece.special
  stream = sentencepiece.tokenize(tf.constant(
      corpus.documents("heldout", corpus_cache)[:20])).flat_values.numpy()
  first = next(iter(data))
  assert first["inputs"].shape == (8, 64)
  assert first["targets"].shape == (8, targets_length)
  rebuilt = []
  for inputs, targets in zip(first["inputs"].numpy(),
                             first["targets"].numpy()):
    rebuilt += span_corruption.reconstruct(inputs, targets,
                                           special.sentinels, special.eos)
  np.testing.assert_array_equal(rebuilt, stream[:8 * tokens_length])
  again = next(iter(data))
  np.testing.assert_array_equal(again["inputs"], first["inputs"])


def test_too_few_sentinels():
  vocab = list(tokenizers.BERT_SPECIAL_TOKENS + tokenizers.sentinel_tokens(2))
  tokenizer = tokenizers.WordpieceTokenizer(vocab + ["a"], num_sentinels=2)
  with pytest.raises(ValueError, match="28 noise spans need as many "
                     "sentinels, but the tokenizer has 2"):
    span_corruption.span_corruption_dataset(
        tf.data.Dataset.from_tensor_slices(["a"]), tokenizer,
        inputs_length=512, batch_size=1)
