"""Span corruption's decoding metrics, by hand-counted examples."""

import numpy as np
import pytest

from thattn.tasks import span_corruption


def test_decoding_metrics_count_rows_and_target_tokens():
  # Targets end with 1 (EOS) and are padded with 0 after it.
  targets = np.array([[5, 6, 1, 0],
                      [7, 8, 9, 1],
                      [4, 1, 0, 0]])
  tokens = np.array([[5, 6, 1, 0],     # exact
                     [7, 3, 9, 1],     # 3 of 4 right
                     [4, 4, 1, 0]])    # 1 of 2 right (a token past EOS)
  metrics = span_corruption.decoding_metrics(targets, tokens, pad_id=0)
  assert metrics["greedy_exact_match"] == pytest.approx(1 / 3)
  assert metrics["greedy_token_accuracy"] == pytest.approx((3 + 3 + 1) / 9)


def test_decoding_metrics_refuse_other_shapes():
  with pytest.raises(ValueError, match=r"Decoded tokens \(2, 3\) and "
                     r"targets \(2, 4\) must have one shape"):
    span_corruption.decoding_metrics(np.zeros((2, 4)), np.zeros((2, 3)), 0)
