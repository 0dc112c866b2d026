"""The generators' checks that both front ends share
(`thattn.core.decoding_options`)."""

import pytest

from thattn.core import decoding_options

_PREFIX = "decoder_causal_attention"


@pytest.mark.parametrize("inputs, prefix_lm", [
    (["decoder_input_tokens"], False),
    ([_PREFIX, "decoder_input_tokens"], True),  # in any order
    (("decoder_input_tokens", _PREFIX), True),
])
def test_a_decoder_only_lms_inputs_say_whether_it_is_a_prefix_lm(
    inputs, prefix_lm):
  assert decoding_options.is_prefix_lm("lm", inputs, _PREFIX) is prefix_lm


@pytest.mark.parametrize("inputs, named", [
    (["decoder_input_tokens", "encoder_input_tokens"],
     "['decoder_input_tokens', 'encoder_input_tokens']"),
    ([], "a tensor"),
    ([_PREFIX], f"['{_PREFIX}']"),
])
def test_another_models_inputs_are_refused_by_name(inputs, named):
  with pytest.raises(ValueError) as raised:
    decoding_options.is_prefix_lm("t5", inputs, _PREFIX)
  assert "needs a decoder-only LM" in str(raised.value)
  assert f"'t5' takes {named}." in str(raised.value)


@pytest.mark.parametrize("options, message", [
    (dict(method="nucleus"), "method"),
    (dict(max_length=0), "max_length"),
    (dict(temperature=0.0), "temperature must be positive"),
    (dict(top_p=1.5), "top_p must be in"),
    (dict(beam_size=0), "beam_size"),
])
def test_bad_options_are_named(options, message):
  arguments = dict(max_length=4, method="greedy", temperature=1.0, top_k=0,
                   beam_size=1, top_p=1.0)
  arguments.update(options)
  with pytest.raises(ValueError, match=message):
    decoding_options.check(**arguments)
