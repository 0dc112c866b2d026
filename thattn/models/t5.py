"""T5 (Raffel et al., 2019) as a functional tf_keras model.

Inputs (dict): `encoder_input_tokens` and `decoder_input_tokens`, int32
[batch, length]; token 0 pads the encoder input and starts the decoder input
(the targets shifted right). Output: float32 logits [batch, length, vocab].

    X = dropout(E[encoder tokens])
    B_enc = bidirectional relative position bias, shared by the stack
    X = encoder_block_l(X, padding mask, B_enc)    pre-norm, l = 1..L
    M = dropout(RMSNorm(X))                        the encoder output
    Y = dropout(E[decoder tokens])
    B_dec = unidirectional relative position bias, shared by the stack
    Y = decoder_block_l(Y, M, B_dec)               causal self-attention
    logits = einsum(dropout(RMSNorm(Y)) * d_model**-0.5, E)   (tied)
    logits = dropout(RMSNorm(Y)) W_lm                          (untied)

Dropout, where T5 puts it (all at `dropout_rate`): on the embeddings, on
the attention weights, on the feed-forward hidden layer, on every sublayer's
output before its residual add, and on each stack's final RMSNorm output.

The three attention types take their own `AttentionConfig`, one for the
whole stack or one per layer. Weights start as
in Mesh TensorFlow's T5: embeddings N(0, 1); attention and the feed-forward
input N(0, 1/d_model), with 1/sqrt(d_k) folded into P_q; the feed-forward
output N(0, 1/d_ff). (Mesh TensorFlow starts P_o at N(0, 1/(h d_v)); that is
the same whenever h d_v = d_model.)

`run_decoder` (thattn.models.wiring, shared with the Keras 3 model) is the
one description of the decoder: the builder calls it on Keras symbolic
tensors, and `thattn.models.generation` calls it with the attention layers'
caches, one step at a time.
"""

import tf_keras

from thattn.models import front_end
from thattn.models import wiring


def build_t5(config, name=None):
  """The T5 model with its LM head for a `T5Config`, by `config.stacks`
  (see `thattn.models.wiring.build_t5`), in tf_keras layers."""
  return wiring.build_t5(config, front_end.TF_KERAS, name)


def encoder_model(model):
  """tokens -> (encoder output M, its attention mask [b, 1, m]), as a model.

  It shares the layers (and so the weights) of the T5 `model`.
  """
  return tf_keras.Model(
      model.input["encoder_input_tokens"],
      [model.get_layer("encoder_output").output,
       model.get_layer("encoder_mask").output],
      name=f"{model.name}_encoder")
