"""T5 (Raffel et al., 2019) as a Keras 3 functional model.

`thattn.models.t5` in `keras.ops` on any Keras 3 backend, from the same
`thattn.models.T5Config` and with the same weights (names, shapes, order):
inputs `encoder_input_tokens` and/or `decoder_input_tokens` (by
`config.stacks`), int32 [batch, length], token 0 padding the encoder input
and starting the decoder's; output float32 logits [batch, length, vocab].
The computation, the dropout placement and the initializers are the ones in
thattn.models.t5's docstring; the decoder is `thattn.models.wiring.
run_decoder`, shared with it, and `generation.T5Generator` decodes with it.
"""

from thattn.keras3.models import front_end
from thattn.models import wiring


def build_t5(config, name=None):
  """The T5 model with its LM head for a `T5Config`, by `config.stacks`
  (see `thattn.models.wiring.build_t5`), in Keras 3 layers."""
  return wiring.build_t5(config, front_end.KERAS3, name)
