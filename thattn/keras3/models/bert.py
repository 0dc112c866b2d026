"""BERT and ALBERT encoders as Keras 3 functional models.

`thattn.models.bert` in `keras.ops` on any Keras 3 backend, from the same
`thattn.models.BertConfig` and with the same weights (names, shapes,
order). Inputs (dict): `input_word_ids`, `input_mask` (1 = real token),
`input_type_ids`, int32 [batch, length]. Outputs (dict):
`sequence_output` [batch, length, d_model], `pooled_output` [batch,
d_model]. The computation is the one in thattn.models.bert's docstring.
"""

from thattn.keras3.models import front_end
from thattn.models import wiring


def build_bert(config, name=None):
  """The BERT or ALBERT encoder with its pooler, for a `BertConfig`: the
  wiring of `thattn.models.wiring.build_bert`, in Keras 3 layers."""
  return wiring.build_bert(config, front_end.KERAS3, name)
