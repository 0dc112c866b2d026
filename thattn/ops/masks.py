"""Attention masks written once for both front ends, over an ops namespace
(`keras.ops`, `thattn.ops.tf_ops.TF_OPS`). True = attend."""


def prefix_lm_mask(ops, causal_attention):
  """A prefix LM's self-attention mask, boolean [b, n, n] (query i, key j):
  j <= i, or both i and j in the prefix region, where `causal_attention`
  [b, n] (t5x's `decoder_causal_attention`) is nonzero. With no region it
  is the causal mask; the region attends both ways, as Mesh TensorFlow's
  `Unitransformer(input_full_attention=True)` does."""
  region = ops.not_equal(causal_attention, 0)
  # The positions [b, n] from a cumulative sum, not arange: a Keras 3
  # functional model's length is unknown (None) when it is built.
  positions = ops.cumsum(ops.ones_like(causal_attention), 1)
  causal = ops.less_equal(ops.expand_dims(positions, 1),
                          ops.expand_dims(positions, 2))
  both = ops.logical_and(ops.expand_dims(region, 2),
                         ops.expand_dims(region, 1))
  return ops.logical_or(causal, both)
