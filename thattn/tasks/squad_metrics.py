"""SQuAD v1.1's exact match and F1, as the official evaluation defines them.

Answers are normalized before comparison: lowercased, punctuation
(`string.punctuation`) removed, the articles "a", "an", "the" removed as
whole words, and whitespace collapsed to single spaces, in that order.

- Exact match: the normalized prediction equals a normalized gold answer.
- F1: over the normalized whitespace tokens, with shared tokens counted as a
  multiset intersection; precision = shared / predicted tokens, recall =
  shared / gold tokens, F1 = 2PR / (P + R), and 0 when nothing is shared
  (v1.1 has no special case for empty answers).
- Each question scores the maximum over its gold answers; a dataset scores
  the mean over all questions, as a percentage, and a question without a
  prediction scores 0.
"""

import collections
import re
import string

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text):
  text = text.lower()
  text = "".join(c for c in text if c not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match_score(prediction, gold):
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction, gold):
  predicted = normalize_answer(prediction).split()
  expected = normalize_answer(gold).split()
  shared = sum((collections.Counter(predicted) &
                collections.Counter(expected)).values())
  if shared == 0:
    return 0.0
  precision, recall = shared / len(predicted), shared / len(expected)
  return 2 * precision * recall / (precision + recall)


def max_over_gold(metric, prediction, golds):
  return max(metric(prediction, gold) for gold in golds)


def evaluate(gold_answers, predictions):
  """{"exact_match": %, "f1": %} over questions.

  gold_answers: {question id: [gold answer texts]}.
  predictions: {question id: predicted text}; missing ids score 0.
  """
  if not gold_answers:
    raise ValueError("No questions to evaluate.")
  exact = f1 = 0.0
  for question_id, golds in gold_answers.items():
    if not golds:
      raise ValueError(f"Question {question_id!r} has no gold answers.")
    if question_id not in predictions:
      continue
    exact += max_over_gold(exact_match_score, predictions[question_id], golds)
    f1 += max_over_gold(f1_score, predictions[question_id], golds)
  count = len(gold_answers)
  return {"exact_match": 100.0 * exact / count, "f1": 100.0 * f1 / count}
