"""The sampling distribution of temperature, top-k and top-p, transcribed
in NumPy from their definitions (transformers' order): the reference both
front ends' samplers are held to (tests/models/lm_generation_test.py,
tests/keras3/decoding_checks.py)."""

import numpy as np


def filtered_distribution(log_probs, temperature, top_k, top_p):
  """Probabilities [vocab] of one row of log-probabilities: logits over
  the temperature; the top_k largest kept; then the fewest largest whose
  probabilities reach top_p."""
  logits = log_probs / temperature
  order = np.argsort(-logits)
  keep = np.zeros(logits.shape, bool)
  keep[order[:top_k]] = True
  probs = np.exp(logits - logits.max()) * keep
  probs /= probs.sum()
  mass = 0.0
  nucleus = np.zeros(logits.shape, bool)
  for token in order:
    if not keep[token] or mass >= top_p:
      break
    nucleus[token] = True
    mass += probs[token]
  final = np.where(nucleus, probs, 0.0)
  return final / final.sum()


def assert_frequencies_match(tokens, want):
  """Draws `tokens` [n] stay in `want`'s support, and each token's
  frequency within five standard errors of its probability."""
  draws = len(tokens)
  seen = np.bincount(tokens, minlength=want.size) / draws
  assert set(np.flatnonzero(seen)) <= set(np.flatnonzero(want))
  bound = 5 * np.sqrt(want * (1 - want) / draws) + 2 / draws
  assert np.all(np.abs(seen - want) <= bound), np.abs(seen - want) - bound
