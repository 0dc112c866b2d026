"""SQuAD v1.1 EM and F1 on crafted cases, worked out by hand."""

import pytest

from thattn.tasks import squad_metrics as m


@pytest.mark.parametrize("text,normalized", [
    ("The Cat", "cat"),
    ("  an   apple\tpie\n", "apple pie"),
    ("A.B.C.", "abc"),                 # punctuation goes before articles
    ("the-end", "theend"),
    ("Theatre of the absurd", "theatre of absurd"),  # whole words only
    ("the.", ""),                      # "the." -> "the" -> removed
    ("Éclair, à la carte!", "éclair à la carte"),
    ("$1,000 (approx.)", "1000 approx"),
])
def test_normalize_answer(text, normalized):
  assert m.normalize_answer(text) == normalized


def test_exact_match():
  assert m.exact_match_score("the  Eiffel Tower.", "Eiffel tower") == 1.0
  assert m.exact_match_score("Eiffel", "Eiffel Tower") == 0.0
  # v1.1 quirk: an empty prediction matches a gold that is only an article.
  assert m.exact_match_score("", "The") == 1.0


@pytest.mark.parametrize("prediction,gold,f1", [
    ("the cat sat on the mat", "cat sat", 2 * 0.5 * 1.0 / 1.5),
    ("dog dog cat", "dog cat cat", 2 / 3),  # multiset overlap: 2 shared
    ("Paris", "paris!", 1.0),
    ("London", "Paris", 0.0),
    ("", "The", 0.0),                        # no shared token: 0, not 1
    ("in 1889, the tower", "1889", 2 * (1 / 3) * 1.0 / (1 / 3 + 1.0)),
])
def test_f1(prediction, gold, f1):
  assert m.f1_score(prediction, gold) == pytest.approx(f1)


def test_max_over_several_gold_answers():
  golds = ["Denver Broncos", "the Broncos", "Broncos team"]
  assert m.max_over_gold(m.exact_match_score, "Broncos", golds) == 1.0
  assert m.max_over_gold(m.f1_score, "Denver team", golds) == pytest.approx(
      0.5)


def test_evaluate_averages_and_counts_missing_as_zero():
  gold = {"q1": ["Denver Broncos", "Broncos"], "q2": ["Santa Clara"],
          "q3": ["Levi's Stadium"], "q4": ["February 7"]}
  predictions = {"q1": "the Broncos", "q2": "Santa Clara, California",
                 "q3": "Levis Stadium"}
  result = m.evaluate(gold, predictions)
  # q1 EM 1, F1 1; q2 EM 0, F1 2*(2/3)*1/(5/3) = 0.8; q3 EM 1 ("levis
  # stadium"), F1 1; q4 unanswered: 0.
  assert result["exact_match"] == pytest.approx(50.0)
  assert result["f1"] == pytest.approx(100 * (1 + 0.8 + 1 + 0) / 4)


def test_evaluate_errors():
  with pytest.raises(ValueError, match="No questions"):
    m.evaluate({}, {})
  with pytest.raises(ValueError, match="'q1' has no gold answers"):
    m.evaluate({"q1": []}, {"q1": "x"})
