"""BERT and ALBERT encoders as functional tf_keras models.

Inputs (dict): `input_word_ids`, `input_mask` (1 = real token) and
`input_type_ids`, each int32 [batch, length].
Outputs (dict): `sequence_output` [batch, length, d_model] and
`pooled_output` [batch, d_model].

    E      = word_embeddings[ids] (+ position_embedding[:n])
             + type_embeddings[type_ids]     width E (d_model, or ALBERT's E)
    X      = dropout(LayerNorm(E))
    X      = X W_E + b_E                     ALBERT only: E -> d_model
    X      = block_l(X, mask, bias)          l = 1..L; ALBERT shares one block
    pooled = tanh(X[:, 0] W_p + b_p)

Notes:
- As everywhere in thattn, 1/sqrt(d_k) is folded into P_q's initializer
  instead of being applied to the logits (numerically the same model); a
  converted BERT checkpoint needs its query kernel and bias multiplied by
  1/sqrt(d_k).
- With `position_embedding="relative"` there is no position table; T5's
  bidirectional relative position bias, one for the whole stack, is added
  to every layer's logits (the paper's Section 7.3).
"""

from thattn.models import front_end
from thattn.models import wiring


def build_bert(config, name=None):
  """The BERT or ALBERT encoder with its pooler, for a `BertConfig`: the
  wiring of `thattn.models.wiring.build_bert`, in tf_keras layers."""
  return wiring.build_bert(config, front_end.TF_KERAS, name)
