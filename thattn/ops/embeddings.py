"""The embeddings' computations, written once for both front ends, over an
ops namespace (`keras.ops`, `thattn.ops.tf_ops.TF_OPS`). Letters follow
`thattn.core.dims`: `t` indexes the vocabulary."""

# logits[b, n, t] = einsum(X[b, n, d], E[t, d]).
EMBEDDING_LOGITS = "bnd,td->bnt"


def embedding_logits(ops, x, table, logits_scale):
  """float32 logits[b, n, t] = einsum(x * logits_scale, E[t, d]): a token
  embedding scoring vectors against itself (T5's tied output embedding,
  with its d_model**-0.5 as `logits_scale`). float32, so that the softmax
  and the loss never run in float16."""
  scaled = ops.cast(x, "float32") * logits_scale
  return ops.einsum(EMBEDDING_LOGITS, scaled, ops.cast(table, "float32"))
