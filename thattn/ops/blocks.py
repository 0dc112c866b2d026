"""The Transformer block's computations, written once for both front ends.

Functions over an ops namespace (`keras.ops` on Keras 3,
`thattn.ops.tf_ops.TF_OPS` on tf_keras) and over the sublayers a block
holds, called by each front end's own layer classes
(`thattn.models.blocks`, `thattn.keras3.models.blocks`). Plain Python:
nothing here imports a framework. Letters follow `thattn.core.dims`.

- `activation(ops, name)`: the feed-forward activations by name;
- `rms_norm`: T5's layer norm;
- `feed_forward`: the position-wise network, plain or gated;
- `post_norm_block`: BERT's and ALBERT's layer,
      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))
- `pre_norm_block`: T5's layer (RMSNorm) and the decoder-only LMs'
  (RMSNorm or LayerNorm),
      x = x + dropout(self_attention(norm(x), norm(x)))
      x = x + dropout(cross_attention(norm(x), memory))    (decoder only)
      x = x + dropout(feed_forward(norm(x)))
  or GPT-NeoX's parallel residual, both sublayers reading the block's input,
      x = x + dropout(self_attention(norm_1(x))) + dropout(feed_forward(norm_2(x)))
  also one decoding step with the attention layers' caches
  (`pre_norm_initial_cache`).
"""

from thattn.core import validation

# The names of thattn.models.config.ACTIVATIONS: "gelu" is BERT's exact
# (erf) form, "gelu_approximate" the tanh form of ALBERT v2 and T5.1.1.
_GELU_APPROXIMATE = {"gelu": False, "gelu_approximate": True}


def activation(ops, name):
  """The function act(x) named `name` (relu, gelu, gelu_approximate, silu)
  in `ops`; ValueError for another name."""
  validation.one_of("activation", name,
                    ("relu", "silu") + tuple(_GELU_APPROXIMATE))
  if name == "relu":
    return ops.relu
  if name == "silu":
    return ops.silu
  approximate = _GELU_APPROXIMATE[name]
  return lambda x: ops.gelu(x, approximate=approximate)


def rms_norm(ops, x, scale, epsilon, dtype):
  """y[d] = x[d] / sqrt(mean_d(x**2) + epsilon) * scale[d], computed in
  float32 (under mixed precision too) and returned in `dtype`; unlike
  LayerNormalization it subtracts no mean and adds no bias."""
  x = ops.cast(x, "float32")
  variance = ops.mean(ops.square(x), axis=-1, keepdims=True)
  y = x * ops.rsqrt(variance + epsilon)
  return ops.cast(y * ops.cast(scale, "float32"), dtype)


def feed_forward(x, input_dense, gate_dense, output_dense, act, dropout,
                 training=None):
  """The position-wise network, from its dense layers (`gate_dense` None
  when plain) and its activation:

      H[f] = act(X[d] W_i[d, f] (+ b_i))            plain
      H[f] = act(X[d] W_i[d, f]) * X[d] W_g[d, f]   gated (T5.1.1)
      Y[d] = dropout(H[f]) W_o[f, d] (+ b_o)
  """
  hidden = act(input_dense(x))
  if gate_dense is not None:
    hidden = hidden * gate_dense(x)
  return output_dense(dropout(hidden, training=training))


def post_norm_block(x, attention, attention_norm, feed_forward_network,
                    feed_forward_norm, dropout, attention_mask=None,
                    position_bias=None, training=None):
  """BERT's layer: residual, then LayerNorm (post-LN), from its sublayers."""
  y = attention(x, x, attention_mask=attention_mask,
                position_bias=position_bias, training=training)
  x = attention_norm(x + dropout(y, training=training))
  y = feed_forward_network(x, training=training)
  return feed_forward_norm(x + dropout(y, training=training))


def pre_norm_initial_cache(block_name, self_attention, cross_attention,
                           batch_size, max_length, memory=None):
  """A decoder block's cache: its self-attention's empty one, and (when it
  has a cross-attention) the memory projected once."""
  cache = {"self_attention":
               self_attention.initial_cache(batch_size, max_length)}
  if cross_attention is not None:
    if memory is None:
      raise ValueError(f"{block_name}: a decoder block's cache needs the "
                       "encoder output as `memory`.")
    cache["cross_attention"] = cross_attention.memory_cache(memory)
  return cache


# The sublayers of T5's layer, by the names its blocks hold them under;
# cross_attention and its norm are None in an encoder.
PRE_NORM_SUBLAYERS = ("self_attention_norm", "self_attention",
                      "cross_attention_norm", "cross_attention",
                      "feed_forward_norm", "feed_forward")


def pre_norm_block(x, sublayers, dropout, causal, memory=None,
                   attention_mask=None, memory_mask=None, position_bias=None,
                   training=None, cache=None, decode_step=None,
                   parallel_residual=False):
  """T5's layer, from `sublayers`: {name of PRE_NORM_SUBLAYERS: layer}.
  With `cache` (from
  `pre_norm_initial_cache`) `x` holds the decoding steps from
  `decode_step` on, and the result is `(y, new_cache)`. With
  `parallel_residual` (no cross-attention then) the feed-forward network
  reads the block's input, not the attention's sum."""
  # x = x + ..., never x += ...: a PyTorch tensor would be changed in
  # place, the caller's input with it.
  block_input = x
  new_cache = {}
  h = sublayers["self_attention_norm"](x)
  if cache is None:
    y = sublayers["self_attention"](
        h, h, attention_mask=attention_mask, use_causal_mask=causal,
        position_bias=position_bias, training=training)
  else:
    y, new_cache["self_attention"] = sublayers["self_attention"](
        h, h, attention_mask=attention_mask, position_bias=position_bias,
        training=training, cache=cache["self_attention"],
        decode_step=decode_step)
  x = x + dropout(y, training=training)
  if sublayers["cross_attention"] is not None:
    h = sublayers["cross_attention_norm"](x)
    if cache is None:
      y = sublayers["cross_attention"](h, memory, attention_mask=memory_mask,
                                       training=training)
    else:  # the memory was projected once, into the cache
      y, new_cache["cross_attention"] = sublayers["cross_attention"](
          h, None, attention_mask=memory_mask, training=training,
          cache=cache["cross_attention"])
    x = x + dropout(y, training=training)
  y = sublayers["feed_forward"](
      sublayers["feed_forward_norm"](block_input if parallel_residual else x),
      training=training)
  x = x + dropout(y, training=training)
  return x if cache is None else (x, new_cache)
