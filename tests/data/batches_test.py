"""Step-addressed pipelines: batch k depends only on (seed, k)."""

import numpy as np
import pytest

from thattn.data import batches


def _indices(step, **kwargs):
  return batches.row_indices(step, **kwargs).numpy()


@pytest.mark.parametrize("num_rows,batch_size", [(10, 4), (7, 7), (3, 8)])
def test_every_pass_visits_every_row_once(num_rows, batch_size):
  kwargs = dict(batch_size=batch_size, num_rows=num_rows, seed=5)
  slots = np.concatenate([_indices(step, **kwargs) for step in range(12)])
  passes = slots[:len(slots) // num_rows * num_rows].reshape(-1, num_rows)
  for visit in passes:
    assert sorted(visit) == list(range(num_rows))
  assert len({tuple(visit) for visit in passes}) > 1  # a new order per pass


def test_unshuffled_rows_come_in_order():
  np.testing.assert_array_equal(
      _indices(2, batch_size=4, num_rows=10, seed=0, shuffle=False),
      [8, 9, 0, 1])


def test_mlm_batches_resume_at_any_step(sentencepiece):
  rows = np.arange(40 * 14, dtype=np.int32).reshape(40, 14) % 500 + 200
  def take(start, count):
    data = batches.mlm_batches(rows, sentencepiece, batch_size=6, seed=3,
                               start_step=start, num_steps=count)
    return [{k: v.numpy() for k, v in b.items()} for b in data]
  straight = take(0, 5)
  resumed = take(3, 2)
  for one, other in zip(straight[3:], resumed):
    for key in one:
      np.testing.assert_array_equal(one[key], other[key])
  assert straight[0]["input_word_ids"].shape == (6, 16)
  assert (straight[0]["masked_lm_weights"].sum(1) == 3).all()  # 15% of 14


def test_span_corruption_batches_reconstruct_their_rows(sentencepiece):
  special = sentencepiece.special
  raw, targets_length = batches.span_corruption_lengths(20)
  rows = np.arange(9 * raw, dtype=np.int32).reshape(9, raw) + 300
  data = batches.span_corruption_batches(
      rows, sentencepiece, inputs_length=20, batch_size=4, seed=1,
      num_steps=3, shuffle=False)
  seen = []
  for batch in data:
    assert batch["inputs"].shape == (4, 20)
    assert batch["targets"].shape == (4, targets_length)
    for inputs, targets in zip(batch["inputs"].numpy(),
                               batch["targets"].numpy()):
      seen.append(batches.span_corruption.reconstruct(
          inputs, targets, special.sentinels, special.eos))
  for index, original in enumerate(seen):
    assert original == list(rows[index % 9])


def test_token_rows_packs_documents(sentencepiece):
  rows = batches.token_rows(["One two three four.", "Five six seven."],
                            sentencepiece, 4, separator=7)
  assert rows.shape[1] == 4 and rows.dtype == np.int32
  assert (rows == 7).sum() >= 1
  with pytest.raises(ValueError, match="fewer than width=1000"):
    batches.token_rows(["Short."], sentencepiece, 1000)
