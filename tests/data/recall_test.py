"""The associative-recall task's examples."""

import numpy as np
import pytest

from thattn.data import recall


def test_examples_are_well_formed_and_answerable():
  config = recall.RecallConfig(num_pairs=6, num_queries=3, num_keys=10,
                               num_values=7)
  for index in range(20):
    tokens, targets, weights = (t.numpy() for t in
                                recall.make_example(config, 5, index))
    keys, values = tokens[:, 0], tokens[:, 1]
    assert tokens.shape == (9, 2)
    assert len(set(keys[:6])) == 6 and keys.max() < 10
    assert (values[:6] < 7).all() and (values[6:] == 7).all()
    np.testing.assert_array_equal(weights, [0] * 6 + [1] * 3)
    for position in range(6, 9):  # each query's answer is its key's value
      (source,) = np.flatnonzero(keys[:6] == keys[position])
      assert targets[position] == values[source]


def test_examples_depend_only_on_seed_and_index():
  config = recall.RecallConfig.for_sequence_length(16)
  first = recall.make_example(config, 3, 7)[0].numpy()
  np.testing.assert_array_equal(first, recall.make_example(config, 3, 7)[0])
  assert not np.array_equal(first, recall.make_example(config, 3, 8)[0])
  batches = list(recall.dataset(config, batch_size=4, seed=3).take(3))
  resumed = next(iter(recall.dataset(config, batch_size=4, seed=3,
                                     start_index=8)))
  np.testing.assert_array_equal(batches[2][0], resumed[0])


@pytest.mark.parametrize("kwargs,message", [
    ({"num_pairs": 9, "num_keys": 8}, "num_pairs=9 needs as many distinct"),
    ({"num_queries": 9}, "num_queries=9 must not exceed num_pairs=8"),
    ({"num_values": 0}, "num_values must be positive, got 0"),
])
def test_bad_configs(kwargs, message):
  with pytest.raises(ValueError, match=message):
    recall.RecallConfig(**kwargs)


def test_difficulty_knobs():
  config = recall.RecallConfig.for_sequence_length(64, keys_per_pair=8)
  assert (config.num_pairs, config.num_queries) == (48, 16)
  assert config.num_keys == 8 * 48 and config.num_values == 4 * 48
  assert recall.RecallConfig.for_sequence_length(64) == recall.RecallConfig(
      48, 16, num_keys=192, num_values=192)
