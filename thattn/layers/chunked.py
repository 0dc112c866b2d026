"""Query-chunked attention core with recomputation in the backward pass.

The attention core of multi-head and talking-heads attention, from the
projected Q, K, V to the context O, computed one (example, query chunk) at a
time. Per chunk of c queries (letters as in `thattn.dims`):

    J[h_k, c, m]   = einsum(Q[c, h_k, d_k], K[m, h_k, d_k])
    L[h, c, m]     = einsum(J[h_k, c, m], P_l[h_k, h])       (or J)
    W[h, c, m]     = softmax(L + B, masked, reduced_dim=m)   # float32
    U[h_v, c, m]   = einsum(W[h, c, m], P_w[h, h_v])         (or W)
    O[c, h_v, d_v] = einsum(U[h_v, c, m], V[m, h_v, d_v])

With grouped talking heads, P_l and P_w come as their G diagonal blocks
([G, h_k/G, h/G] and [G, h/G, h_v/G]) and each mixing, and each of its
gradients, is a batched matmul over the groups.

The forward pass keeps none of J, L, W or U; the backward pass recomputes
them chunk by chunk. Two things follow:
- Memory for the scores is O(c * m) per chunk in flight instead of
  O(n * m) per example held for the backward pass, so a training step's
  memory grows about linearly with the sequence length.
- It is usually faster on CPU, not slower, despite the recomputation: the
  head-mixing steps are memory-bound, and a chunk's score tensors stay in
  cache while each is produced and consumed (benchmarks/RESULTS.md).

With `fused=True` the kernel `thattn.kernels.talking_heads_softmax` takes
each chunk from J to U (and its gradient op from dU to dJ, dP_l, dP_w and
the bias's dL), so L and W are not materialized even per chunk.

The causal mask is generated per chunk from positions, never materialized at
[n, m]. The result equals the plain computation to float32 rounding
(tests/layers/chunked_test.py). Not covered here: attention dropout (its
random mask would have to be regenerated identically in the recomputation)
and dynamic projections; layers use the plain path for those.
"""

import tensorflow as tf

from thattn.kernels import talking_heads_softmax
from thattn.layers import attention_ops

# Per chunk: J[h_k, c, m] = einsum(Q[c, h_k, d_k], K[m, h_k, d_k])
_CHUNK_DOT = "cik,mik->icm"
# O[c, h_v, d_v] = einsum(U[h_v, c, m], V[m, h_v, d_v])
_CHUNK_CONTEXT = "jcm,mjv->cjv"
# Backward: dU[h_v, c, m] = einsum(dO[c, h_v, d_v], V[m, h_v, d_v])
_CHUNK_D_WEIGHTS = "cjv,mjv->jcm"
# Backward: dV[m, h_v, d_v] = einsum(U[h_v, c, m], dO[c, h_v, d_v])
_CHUNK_D_VALUE = "jcm,cjv->mjv"
# Backward: dQ[c, h_k, d_k] = einsum(dJ[h_k, c, m], K[m, h_k, d_k])
_CHUNK_D_QUERY = "icm,mik->cik"
# Backward: dK[m, h_k, d_k] = einsum(dJ[h_k, c, m], Q[c, h_k, d_k])
_CHUNK_D_KEY = "icm,cik->mik"


def _mix(scores, projection):
  """[f, c, m] x P[f, g] -> [g, c, m]: one matmul over the heads.

  With grouped blocks P[G, f/G, g/G] (see `attention_ops.mix_heads`), one
  batched matmul over the groups.
  """
  shape = tf.shape(scores)
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    mixed = tf.linalg.matmul(
        projection, tf.reshape(scores, [groups, heads_in, -1]),
        transpose_a=True)
    return tf.reshape(mixed, [groups * heads_out, shape[1], shape[2]])
  mixed = tf.linalg.matmul(projection, tf.reshape(scores, [shape[0], -1]),
                           transpose_a=True)
  return tf.reshape(mixed, [tf.shape(projection)[1], shape[1], shape[2]])


def _unmix(scores, projection):
  """[g, c, m] x P[f, g] -> [f, c, m]: the transpose of `_mix`."""
  shape = tf.shape(scores)
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    mixed = tf.linalg.matmul(projection,
                             tf.reshape(scores, [groups, heads_out, -1]))
    return tf.reshape(mixed, [groups * heads_in, shape[1], shape[2]])
  mixed = tf.linalg.matmul(projection, tf.reshape(scores, [shape[0], -1]))
  return tf.reshape(mixed, [tf.shape(projection)[0], shape[1], shape[2]])


def _projection_gradient(inputs, output_gradient, projection):
  """dP[f, g] = sum over (c, m) of inputs[f, c, m] * output_gradient[g, c, m].

  For grouped blocks P[G, f/G, g/G], only the diagonal blocks:
  dP[G, f/G, g/G], one batched matmul.
  """
  if projection.shape.rank == 3:
    groups, heads_in, heads_out = projection.shape.as_list()
    return tf.linalg.matmul(
        tf.reshape(inputs, [groups, heads_in, -1]),
        tf.reshape(output_gradient, [groups, heads_out, -1]),
        transpose_b=True)
  return tf.linalg.matmul(
      tf.reshape(inputs, [tf.shape(inputs)[0], -1]),
      tf.reshape(output_gradient, [tf.shape(output_gradient)[0], -1]),
      transpose_b=True)


def _to_chunks(tensor, chunk_size, num_chunks):
  """[b, n, ...] -> [b * num_chunks, chunk_size, ...], zero-padding n."""
  shape = tf.shape(tensor)
  padding = num_chunks * chunk_size - shape[1]
  paddings = tf.concat([[[0, 0], [0, padding]],
                        tf.zeros([tf.rank(tensor) - 2, 2], tf.int32)], 0)
  padded = tf.pad(tensor, paddings)
  return tf.reshape(padded, tf.concat([[-1, chunk_size], shape[2:]], 0))


def _from_chunks(chunks, batch, length):
  """[b * num_chunks, chunk_size, ...] -> [b, n, ...]."""
  shape = tf.shape(chunks)
  merged = tf.reshape(chunks, tf.concat([[batch, -1], shape[2:]], 0))
  return merged[:, :length]


def attention_core(query, key, value, *, pre_softmax=None, post_softmax=None,
                   mask=None, causal_offset=None, bias=None,
                   chunk_size=128, parallel_chunks=2, fused=False):
  """O[b, n, h_v, d_v], computed in query chunks with recomputation.

  Args:
    query: Q[b, n, h_k, d_k].
    key: K[b, m, h_k, d_k].
    value: V[b, m, h_v, d_v].
    pre_softmax: P_l[h_k, h], or None for multi-head (h = h_k), or the G
      diagonal blocks P_l[G, h_k/G, h/G] of a block-diagonal P_l (grouped
      talking heads; heads group-major, as in `attention_ops.mix_heads`).
    post_softmax: P_w[h, h_v], or None (h_v = h), or blocks
      P_w[G, h/G, h_v/G].
    mask: optional boolean tensor of shape [b or 1, 1, n or 1, m]; True
      means "may attend".
    causal_offset: None, or the position of the first query within the
      memory (query i may attend memory j <= i + offset). Generated per
      chunk, so a causal mask costs no [n, m] tensor.
    bias: optional float tensor [b or 1, h, n, m] added to the logits L; it
      receives a gradient.
    chunk_size: queries per chunk, c.
    parallel_chunks: chunks in flight at once (one per core is a good
      choice on CPU).
    fused: compute J -> U per chunk with the fused talking-heads kernel.
      Needs float32 and ungrouped (or None) projections; the caller checks
      `talking_heads_softmax.unsupported_reason` first.

  Returns:
    O[b, n, h_v, d_v] in the dtype of `value`.
  """
  tensors = {"query": query, "key": key, "value": value}
  for name, tensor in (("pre_softmax", pre_softmax),
                       ("post_softmax", post_softmax), ("bias", bias)):
    if tensor is not None:
      tensors[name] = tensor
  if mask is not None:
    mask = tf.broadcast_to(
        mask, tf.concat([tf.shape(mask)[:2], [tf.shape(mask)[2]],
                         tf.shape(key)[1:2]], 0))
  if fused:
    ranks = [None if p is None else p.shape.rank
             for p in (pre_softmax, post_softmax)]
    if any(rank not in (None, 2) for rank in ranks):
      raise ValueError(
          f"fused=True needs [f, g] (rank-2) projections or None; got "
          f"projection ranks {ranks}.")
  names = sorted(tensors)
  core = _make_core(names, mask, causal_offset, chunk_size, parallel_chunks,
                    fused)
  return core(*[tensors[name] for name in names])


def _make_core(names, mask, causal_offset, chunk_size, parallel_chunks,
               fused):
  """A custom-gradient function of the tensors in `names` (sorted)."""

  @tf.custom_gradient
  def core(*args):
    t = dict(zip(names, args))
    query, key, value = t["query"], t["key"], t["value"]
    pre, post, bias = t.get("pre_softmax"), t.get("post_softmax"), t.get("bias")
    batch, length = tf.shape(query)[0], tf.shape(query)[1]
    num_chunks = (length + chunk_size - 1) // chunk_size
    query_chunks = _to_chunks(query, chunk_size, num_chunks)
    items = tf.range(batch * num_chunks)

    def chunk_rows(tensor, item):
      """tensor[e, :, rows] for the item's example e and query rows."""
      example = tf.minimum(item // num_chunks, tf.shape(tensor)[0] - 1)
      per_example = tensor[example]
      if per_example.shape[1] == 1:
        return per_example
      start = (item % num_chunks) * chunk_size
      rows = tf.minimum(start + tf.range(chunk_size), length - 1)
      return tf.gather(per_example, rows, axis=1)

    def allowed_positions(item, keys):
      """The chunk's boolean mask, broadcastable to [c, m], or None."""
      allowed = None
      if mask is not None:
        allowed = chunk_rows(mask, item)
      if causal_offset is not None:
        start = (item % num_chunks) * chunk_size + causal_offset
        causal = attention_ops.causal_mask(chunk_size, tf.shape(keys)[0],
                                           start)
        allowed = causal if allowed is None else tf.logical_and(allowed,
                                                                causal)
      return allowed

    def weights(item, query_chunk, keys):
      """(J, W, allowed) for one chunk; W in float32, allowed may be None."""
      dots = tf.einsum(_CHUNK_DOT, query_chunk, keys)
      logits = tf.cast(dots if pre is None else _mix(dots, pre), tf.float32)
      if bias is not None:
        logits += tf.cast(chunk_rows(bias, item), tf.float32)
      allowed = allowed_positions(item, keys)
      if allowed is not None:
        logits = tf.where(allowed, logits, attention_ops.MASKED_LOGIT)
      return dots, tf.nn.softmax(logits, axis=-1), allowed

    def fused_mixed_weights(item, query_chunk, keys):
      """(J[1, h_k, c, m], U[1, h_v, c, m], allowed, B) from the kernel."""
      dots = tf.expand_dims(tf.einsum(_CHUNK_DOT, query_chunk, keys), 0)
      allowed = allowed_positions(item, keys)
      chunk_bias = (None if bias is None else
                    tf.expand_dims(chunk_rows(bias, item), 0))
      mixed = talking_heads_softmax.talking_heads_softmax(
          dots, pre, post, allowed, chunk_bias)
      return dots, mixed, allowed, chunk_bias

    def forward_chunk(args):
      query_chunk, item = args
      example = item // num_chunks
      if fused:
        _, mixed, _, _ = fused_mixed_weights(item, query_chunk,
                                             key[example])
        return tf.einsum(_CHUNK_CONTEXT, mixed[0], value[example])
      _, probabilities, _ = weights(item, query_chunk, key[example])
      probabilities = tf.cast(probabilities, value.dtype)
      mixed = probabilities if post is None else _mix(probabilities, post)
      return tf.einsum(_CHUNK_CONTEXT, mixed, value[example])

    def fused_backward_chunk(query_chunk, d_context, item):
      """As `backward_chunk`, with the kernel from J to U and back."""
      example = item // num_chunks
      keys, values = key[example], value[example]
      dots, mixed, allowed, chunk_bias = fused_mixed_weights(
          item, query_chunk, keys)
      d_mixed = tf.einsum(_CHUNK_D_WEIGHTS, d_context, values)
      grads = {"value": tf.einsum(_CHUNK_D_VALUE, mixed[0], d_context)}
      d_dots, d_pre, d_post, d_bias = (
          talking_heads_softmax.talking_heads_softmax_gradient(
              dots, pre, post, tf.expand_dims(d_mixed, 0), allowed,
              chunk_bias))
      if pre is not None:
        grads["pre_softmax"] = d_pre
      if post is not None:
        grads["post_softmax"] = d_post
      if bias is not None:
        grads["bias"] = d_bias[0]  # dL[h, c, m], as the unfused path gives
      grads["query"] = tf.einsum(_CHUNK_D_QUERY, d_dots[0], keys)
      grads["key"] = tf.einsum(_CHUNK_D_KEY, d_dots[0], query_chunk)
      return grads

    context = tf.map_fn(
        forward_chunk, (query_chunks, items),
        fn_output_signature=tf.TensorSpec(None, value.dtype),
        parallel_iterations=parallel_chunks)
    output = _from_chunks(context, batch, length)

    def grad(d_output):
      d_output_chunks = _to_chunks(d_output, chunk_size, num_chunks)

      def backward_chunk(args):
        query_chunk, d_context, item = args
        if fused:
          return fused_backward_chunk(query_chunk, d_context, item)
        example = item // num_chunks
        keys, values = key[example], value[example]
        dots, probabilities, allowed = weights(item, query_chunk, keys)
        probabilities_c = tf.cast(probabilities, value.dtype)
        mixed = probabilities_c if post is None else _mix(probabilities_c,
                                                          post)
        d_mixed = tf.einsum(_CHUNK_D_WEIGHTS, d_context, values)
        grads = {"value": tf.einsum(_CHUNK_D_VALUE, mixed, d_context)}
        if post is not None:
          grads["post_softmax"] = _projection_gradient(probabilities_c,
                                                       d_mixed, post)
          d_mixed = _unmix(d_mixed, post)
        # Softmax backward in float32: dL = W * (dW - sum_m W * dW).
        d_probabilities = tf.cast(d_mixed, tf.float32)
        d_logits = probabilities * (d_probabilities - tf.reduce_sum(
            probabilities * d_probabilities, axis=-1, keepdims=True))
        if allowed is not None:
          # Masked logits were replaced by a constant, so they get no
          # gradient. This matters in fully masked rows, whose uniform
          # weights are nonzero at masked positions.
          d_logits = tf.where(allowed, d_logits, 0.0)
        if bias is not None:
          grads["bias"] = d_logits
        d_logits = tf.cast(d_logits, query.dtype)
        if pre is not None:
          grads["pre_softmax"] = _projection_gradient(dots, d_logits, pre)
          d_logits = _unmix(d_logits, pre)
        grads["query"] = tf.einsum(_CHUNK_D_QUERY, d_logits, keys)
        grads["key"] = tf.einsum(_CHUNK_D_KEY, d_logits, query_chunk)
        return grads

      def backward_example(example):
        """Gradients from one example's chunks, summed as the loop goes.

        Summing in the loop (rather than stacking per-chunk dK and dV and
        summing after) keeps the memory linear in the sequence length.
        """
        first = example * num_chunks
        accumulate = [name for name in names
                      if name in ("key", "value", "pre_softmax",
                                  "post_softmax")]
        per_row = [name for name in names if name in ("query", "bias")]

        def body(chunk, sums, rows):
          item = first + chunk
          grads = backward_chunk((query_chunks[item], d_output_chunks[item],
                                  item))
          sums = [total + tf.cast(grads[name], total.dtype)
                  for total, name in zip(sums, accumulate)]
          rows = [array.write(chunk, grads[name])
                  for array, name in zip(rows, per_row)]
          return chunk + 1, sums, rows

        like = {"key": key[0], "value": value[0], "pre_softmax": pre,
                "post_softmax": post}
        sums = [tf.zeros_like(like[name]) for name in accumulate]
        rows = [tf.TensorArray(tf.float32 if name == "bias" else query.dtype,
                               size=num_chunks, infer_shape=False)
                for name in per_row]
        _, sums, rows = tf.while_loop(
            lambda chunk, *_: chunk < num_chunks, body,
            (tf.constant(0), sums, rows), parallel_iterations=parallel_chunks)
        result = dict(zip(accumulate, sums))
        for name, array in zip(per_row, rows):
          result[name] = array.concat() if name == "query" else array.stack()
        return result

      spec = {name: tf.TensorSpec(None, tf.float32 if name == "bias"
                                  else t[name].dtype) for name in names}
      per_example = tf.map_fn(backward_example, tf.range(batch),
                              fn_output_signature=spec,
                              parallel_iterations=1)
      return [_reduce_example_gradient(name, per_example[name], t[name],
                                       length) for name in names]

    return output, grad

  return core


def _reduce_example_gradient(name, per_example, like, length):
  """Per-example gradients (from `backward_example`) in the shape of `like`."""
  if name == "query":  # [b, num_chunks * c, h_k, d_k]
    return per_example[:, :length]
  if name in ("key", "value"):  # [b, m, heads, d]
    return per_example
  if name in ("pre_softmax", "post_softmax"):  # [b, f, g]
    return tf.reduce_sum(per_example, axis=0)
  # bias: [b, num_chunks, h, c, m] -> [b, h, n, m], then onto like's shape.
  shape = tf.shape(per_example)
  full = tf.reshape(tf.transpose(per_example, [0, 2, 1, 3, 4]),
                    [shape[0], shape[2], shape[1] * shape[3], shape[4]])
  full = full[:, :, :length]
  if like.shape[0] == 1:
    full = tf.reduce_sum(full, axis=0, keepdims=True)
  if like.shape[2] == 1:
    full = tf.reduce_sum(full, axis=2, keepdims=True)
  return tf.cast(full, like.dtype)
