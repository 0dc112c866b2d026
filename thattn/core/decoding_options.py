"""The generators' options, checked once for both front ends
(`thattn.models.generation`, `thattn.keras3.models.generation`)."""

from thattn.core import validation

METHODS = ("greedy", "sample", "beam")
# Scores of impossible tokens and beams: far below any real
# log-probability, but finite so that sums of them never produce NaN.
IMPOSSIBLE = -1e9


def check(max_length, method, temperature, top_k, beam_size, top_p=1.0):
  """Raises ValueError naming a bad option."""
  validation.one_of("method", method, METHODS)
  validation.positive_int("max_length", max_length)
  validation.non_negative_int("top_k", top_k)
  validation.positive_int("beam_size", beam_size)
  if not temperature > 0:
    raise ValueError(f"temperature must be positive, got {temperature!r}.")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")


def is_prefix_lm(model_name, inputs, prefix_lm_input):
  """Whether a decoder-only LM with these model inputs is a prefix LM
  (whose prompt, its prefix, attends both ways), checking that they are a
  decoder-only LM's: `decoder_input_tokens`, and a prefix LM's
  `prefix_lm_input` (t5x's name, `thattn.models.config.PREFIX_LM_INPUT`).

  Raises:
    ValueError naming the model's inputs when they are another model's.
  """
  inputs = sorted(inputs)
  if inputs not in (["decoder_input_tokens"],
                    sorted(["decoder_input_tokens", prefix_lm_input])):
    raise ValueError(
        f"DecoderLMGenerator needs a decoder-only LM (input "
        f"decoder_input_tokens, and a prefix LM's {prefix_lm_input}); "
        f"{model_name!r} takes {inputs or 'a tensor'}.")
  return prefix_lm_input in inputs
