"""The output gate of gated attention (Qiu et al., 2025), written once for
both front ends over an ops namespace (`keras.ops`,
`thattn.ops.tf_ops.TF_OPS`). Letters follow `thattn.core.dims`.

The gate G = sigmoid(X P_g) is made by the layer's `gate` projection
(`thattn.core.attention_spec.gate_projection`); here it multiplies each
head's output O before the output projection P_o:

    element-wise:  O'[b, n, h_v, d_v] = O[b, n, h_v, d_v] G[b, n, h_v, d_v]
    head-wise:     O'[b, n, h_v, d_v] = O[b, n, h_v, d_v] G[b, n, h_v]
"""


def gated_context(ops, context, gate, headwise):
  """O' from O[b, n, h_v, d_v] and the gate G (already through its
  sigmoid), in O's dtype."""
  gate = ops.cast(gate, context.dtype)
  if headwise:
    gate = ops.expand_dims(gate, -1)
  return context * gate
