"""Query-chunked attention core with recomputation in the backward pass.

The attention core of multi-head and talking-heads attention, from the
projected Q, K, V to the context O, computed one (example, query chunk) at a
time. Per chunk of c queries (letters as in `thattn.core.dims`):

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
the bias's dL), so L and W are not materialized even per chunk. It also
takes the dynamic projections of the paper's Appendix A: the chunk's rows
of R_Xl[b, n, h_k, h] and R_Xw[b, n, h, h_v], and the example's
R_Ml[b, m, h_k, h] and R_Mw[b, m, h, h_v]; their gradients are written per
chunk (R_X) or summed over the chunks (R_M), like dQ and dK.

The causal mask is generated per chunk from positions, never materialized at
[n, m]. The result equals the plain computation to float32 rounding
(tests/layers/chunked_test.py). Not covered here: attention dropout (its
random mask would have to be regenerated identically in the recomputation)
and dynamic projections without the kernel; `thattn.kernels.dispatch.
choose` sends those calls to the plain path.

Code map: `attention_core` wraps `_forward` and `_gradients` in a custom
gradient; `_Call` holds one call's tensors and chunking. Per chunk, the
forward pass is `_forward_chunk` (TensorFlow ops) or `_forward_chunk_fused`
(the kernel), the backward pass `_backward_chunk` or `_backward_chunk_fused`,
and `_example_gradients` sums one example's chunk gradients in a loop.
"""

import dataclasses

import tensorflow as tf

from thattn.core import attention_spec
from thattn.kernels import talking_heads_softmax
from thattn.layers import attention_ops
from thattn.layers import head_mixing

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
                   chunk_size=128, parallel_chunks=2, fused=False,
                   dynamic=None):
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
      `talking_heads_softmax.unsupported_reason` first
      (`thattn.kernels.dispatch.choose` does).
    dynamic: optional {name: R} of dynamic projections, as
      `talking_heads_softmax.talking_heads_softmax` takes them; needs
      `fused=True`.

  Returns:
    O[b, n, h_v, d_v] in the dtype of `value`.

  Raises:
    ValueError: dynamic projections without `fused=True`.
  """
  dynamic = dict(dynamic or {})
  if dynamic and not fused:
    raise ValueError(f"The chunked core takes dynamic projections "
                     f"{sorted(dynamic)} only through the fused kernel "
                     f"(fused=True); got fused=False.")
  inputs = {"query": query, "key": key, "value": value, **dynamic}
  for name, tensor in (("pre_softmax", pre_softmax),
                       ("post_softmax", post_softmax), ("bias", bias)):
    if tensor is not None:
      inputs[name] = tensor
  if mask is not None:
    mask = tf.broadcast_to(
        mask, tf.concat([tf.shape(mask)[:2], [tf.shape(mask)[2]],
                         tf.shape(key)[1:2]], 0))
  names = tuple(sorted(inputs))
  core = _with_custom_gradient(names, mask, causal_offset, chunk_size,
                               parallel_chunks, fused)
  return core(*[inputs[name] for name in names])


def _with_custom_gradient(names, mask, causal_offset, chunk_size,
                          parallel_chunks, fused):
  """A custom-gradient function of the tensors `names` (sorted).

  `_forward` keeps none of the scores; `_gradients` recomputes them.
  """

  @tf.custom_gradient
  def core(*tensors):
    call = _Call.create(dict(zip(names, tensors)), mask=mask,
                        causal_offset=causal_offset, chunk_size=chunk_size,
                        parallel_chunks=parallel_chunks, fused=fused)
    return _forward(call), lambda d_output: _gradients(call, d_output)

  return core


@dataclasses.dataclass(frozen=True)
class _Call:
  """One call of the core: its tensors and how the queries are chunked.

  The work is split into items, one per (example e, query chunk k), numbered
  item = e * num_chunks + k; `query_chunks[item]` is Q[c, h_k, d_k] of the
  chunk's queries (the last chunk zero-padded).
  """
  names: tuple  # the names of the given tensors below, sorted
  query: tf.Tensor  # Q[b, n, h_k, d_k]
  key: tf.Tensor  # K[b, m, h_k, d_k]
  value: tf.Tensor  # V[b, m, h_v, d_v]
  pre_softmax: object  # P_l or None
  post_softmax: object  # P_w or None
  bias: object  # B[b or 1, h, n or 1, m] or None
  mask: object  # boolean [b or 1, 1, n or 1, m] or None
  causal_offset: object  # None, or the memory position of query 0
  chunk_size: int  # c
  parallel_chunks: int
  fused: bool
  dynamic: dict  # {name: R} of the dynamic projections, as given
  # R_Xl and R_Xw in chunks [b * num_chunks, c, ...], like `query_chunks`
  query_term_chunks: dict
  batch: tf.Tensor  # b
  length: tf.Tensor  # n
  num_chunks: tf.Tensor
  query_chunks: tf.Tensor  # [b * num_chunks, c, h_k, d_k]

  @classmethod
  def create(cls, tensors, *, mask, causal_offset, chunk_size,
             parallel_chunks, fused):
    query = tensors["query"]
    batch, length = tf.shape(query)[0], tf.shape(query)[1]
    num_chunks = (length + chunk_size - 1) // chunk_size
    dynamic = {name: tensors[name]
               for name in talking_heads_softmax.DYNAMIC_PROJECTIONS
               if name in tensors}
    return cls(
        names=tuple(sorted(tensors)), query=query, key=tensors["key"],
        value=tensors["value"], pre_softmax=tensors.get("pre_softmax"),
        post_softmax=tensors.get("post_softmax"), bias=tensors.get("bias"),
        mask=mask, causal_offset=causal_offset, chunk_size=chunk_size,
        parallel_chunks=parallel_chunks, fused=fused, dynamic=dynamic,
        query_term_chunks={
            name: _to_chunks(tensor, chunk_size, num_chunks)
            for name, tensor in dynamic.items() if name in _PER_QUERY},
        batch=batch,
        length=length, num_chunks=num_chunks,
        query_chunks=_to_chunks(query, chunk_size, num_chunks))

  def tensor(self, name):
    """The input tensor called `name` (one of `names`)."""
    if name in self.dynamic:
      return self.dynamic[name]
    return getattr(self, name)

  def dynamic_terms(self, item):
    """{name: R} of one chunk, with a batch axis of 1, for the kernel."""
    terms = {name: chunks[item]
             for name, chunks in self.query_term_chunks.items()}
    terms.update({name: tensor[self.example(item)]
                  for name, tensor in self.dynamic.items()
                  if name not in _PER_QUERY})
    return {name: tf.expand_dims(term, 0) for name, term in terms.items()}

  def example(self, item):
    return item // self.num_chunks

  def rows(self, tensor, item):
    """tensor[e, :, rows] for the item's example e and query rows.

    For the mask [b or 1, 1, n or 1, m] and the bias [b or 1, h, n or 1, m]:
    a dimension of size 1 is shared, and rows past n repeat the last one
    (their results are cut off at the end).
    """
    example = tf.minimum(item // self.num_chunks, tf.shape(tensor)[0] - 1)
    per_example = tensor[example]
    if per_example.shape[1] == 1:
      return per_example
    start = (item % self.num_chunks) * self.chunk_size
    rows = tf.minimum(start + tf.range(self.chunk_size), self.length - 1)
    return tf.gather(per_example, rows, axis=1)

  def allowed(self, item, keys):
    """The chunk's boolean mask, broadcastable to [c, m], or None."""
    allowed = None
    if self.mask is not None:
      allowed = self.rows(self.mask, item)
    if self.causal_offset is not None:
      start = (item % self.num_chunks) * self.chunk_size + self.causal_offset
      causal = attention_ops.causal_mask(self.chunk_size, tf.shape(keys)[0],
                                         start)
      allowed = causal if allowed is None else tf.logical_and(allowed,
                                                              causal)
    return allowed


# ---- forward ---------------------------------------------------------------
def _forward(call):
  """O[b, n, h_v, d_v], one chunk at a time; no scores are kept."""
  forward_chunk = _forward_chunk_fused if call.fused else _forward_chunk
  items = tf.range(call.batch * call.num_chunks)
  context = tf.map_fn(
      lambda args: forward_chunk(call, *args), (call.query_chunks, items),
      fn_output_signature=tf.TensorSpec(None, call.value.dtype),
      parallel_iterations=call.parallel_chunks)
  return _from_chunks(context, call.batch, call.length)


def _weights(call, item, query_chunk, keys):
  """TensorFlow ops: (J[h_k, c, m], W[h, c, m] in float32, allowed)."""
  dots = tf.einsum(_CHUNK_DOT, query_chunk, keys)
  pre = call.pre_softmax
  logits = tf.cast(dots if pre is None else head_mixing.mix(dots, pre),
                   tf.float32)
  if call.bias is not None:
    logits += tf.cast(call.rows(call.bias, item), tf.float32)
  allowed = call.allowed(item, keys)
  if allowed is not None:
    logits = tf.where(allowed, logits, attention_spec.MASKED_LOGIT)
  return dots, tf.nn.softmax(logits, axis=-1), allowed


def _fused_value_weights(call, item, query_chunk, keys):
  """The kernel: (J[1, h_k, c, m], U[1, h_v, c, m], allowed, B or None).

  B is the chunk's bias [1, h, c or 1, m]; the kernel wants a batch axis.
  """
  dots = tf.expand_dims(tf.einsum(_CHUNK_DOT, query_chunk, keys), 0)
  allowed = call.allowed(item, keys)
  chunk_bias = (None if call.bias is None else
                tf.expand_dims(call.rows(call.bias, item), 0))
  value_weights = talking_heads_softmax.talking_heads_softmax(
      dots, call.pre_softmax, call.post_softmax, allowed, chunk_bias,
      dynamic=call.dynamic_terms(item))
  return dots, value_weights, allowed, chunk_bias


def _forward_chunk(call, query_chunk, item):
  """O[c, h_v, d_v] of one chunk with TensorFlow ops."""
  example = call.example(item)
  _, weights, _ = _weights(call, item, query_chunk, call.key[example])
  weights = tf.cast(weights, call.value.dtype)
  post = call.post_softmax
  value_weights = (weights if post is None else
                   head_mixing.mix(weights, post))
  return tf.einsum(_CHUNK_CONTEXT, value_weights, call.value[example])


def _forward_chunk_fused(call, query_chunk, item):
  """O[c, h_v, d_v] of one chunk, with the kernel from J to U."""
  example = call.example(item)
  _, value_weights, _, _ = _fused_value_weights(call, item, query_chunk,
                                                call.key[example])
  return tf.einsum(_CHUNK_CONTEXT, value_weights[0], call.value[example])


# ---- backward ----------------------------------------------------------------
# Dynamic projections of the query rows (chunked like Q); the others, of
# the memory positions, are whole per example like K.
_PER_QUERY = ("x2l", "x2w")
# Gradients summed over an example's chunks, and those written per chunk.
_SUMMED = ("key", "value", "pre_softmax", "post_softmax", "m2l", "m2w")
_PER_CHUNK = ("query", "bias") + _PER_QUERY


def _gradients(call, d_output):
  """The gradients of every input (in `call.names` order) given dO."""
  d_output_chunks = _to_chunks(d_output, call.chunk_size, call.num_chunks)
  spec = {name: tf.TensorSpec(None, _gradient_dtype(call, name))
          for name in call.names}
  per_example = tf.map_fn(
      lambda example: _example_gradients(call, d_output_chunks, example),
      tf.range(call.batch), fn_output_signature=spec, parallel_iterations=1)
  return [_reduce_example_gradient(name, per_example[name], call.tensor(name),
                                   call.length) for name in call.names]


def _gradient_dtype(call, name):
  # dB stays float32, the dtype the logits are computed in.
  return tf.float32 if name == "bias" else call.tensor(name).dtype


def _example_gradients(call, d_output_chunks, example):
  """Gradients from one example's chunks, summed as the loop goes.

  Summing in the loop (rather than stacking per-chunk dK and dV and summing
  after) keeps the memory linear in the sequence length.
  """
  backward_chunk = _backward_chunk_fused if call.fused else _backward_chunk
  first = example * call.num_chunks
  summed = [name for name in call.names if name in _SUMMED]
  per_chunk = [name for name in call.names if name in _PER_CHUNK]

  def body(chunk, sums, chunks):
    item = first + chunk
    grads = backward_chunk(call, call.query_chunks[item],
                           d_output_chunks[item], item)
    sums = [total + tf.cast(grads[name], total.dtype)
            for total, name in zip(sums, summed)]
    chunks = [array.write(chunk, grads[name])
              for array, name in zip(chunks, per_chunk)]
    return chunk + 1, sums, chunks

  like = {"key": call.key[0], "value": call.value[0],
          "pre_softmax": call.pre_softmax, "post_softmax": call.post_softmax}
  like.update({name: call.dynamic[name][0] for name in ("m2l", "m2w")
               if name in call.dynamic})
  sums = [tf.zeros_like(like[name]) for name in summed]
  chunks = [tf.TensorArray(_gradient_dtype(call, name), size=call.num_chunks,
                           infer_shape=False) for name in per_chunk]
  _, sums, chunks = tf.while_loop(
      lambda chunk, *_: chunk < call.num_chunks, body,
      (tf.constant(0), sums, chunks), parallel_iterations=call.parallel_chunks)
  result = dict(zip(summed, sums))
  for name, array in zip(per_chunk, chunks):
    result[name] = array.stack() if name == "bias" else array.concat()
  return result


def _backward_chunk(call, query_chunk, d_context, item):
  """One chunk's gradients with TensorFlow ops, recomputing J and W.

  dK, dV, dP_l and dP_w are this chunk's share; dQ[c, h_k, d_k] and
  dB = dL[h, c, m] are its rows.
  """
  example = call.example(item)
  keys, values = call.key[example], call.value[example]
  pre, post = call.pre_softmax, call.post_softmax
  dots, weights, allowed = _weights(call, item, query_chunk, keys)
  weights_c = tf.cast(weights, call.value.dtype)  # W in the compute dtype
  value_weights = (weights_c if post is None else
                   head_mixing.mix(weights_c, post))
  d_value_weights = tf.einsum(_CHUNK_D_WEIGHTS, d_context, values)
  grads = {"value": tf.einsum(_CHUNK_D_VALUE, value_weights, d_context)}
  if post is not None:
    grads["post_softmax"] = head_mixing.projection_gradient(
        weights_c, d_value_weights, post)
    d_value_weights = head_mixing.unmix(d_value_weights, post)
  d_logits = _softmax_gradient(weights, d_value_weights, allowed)
  if call.bias is not None:
    grads["bias"] = d_logits
  d_logits = tf.cast(d_logits, call.query.dtype)
  if pre is not None:
    grads["pre_softmax"] = head_mixing.projection_gradient(dots, d_logits,
                                                           pre)
    d_logits = head_mixing.unmix(d_logits, pre)
  grads["query"] = tf.einsum(_CHUNK_D_QUERY, d_logits, keys)
  grads["key"] = tf.einsum(_CHUNK_D_KEY, d_logits, query_chunk)
  return grads


def _softmax_gradient(weights, d_weights, allowed):
  """dL[h, c, m] from W (float32) and dW, in float32.

  dL = W * (dW - sum_m W * dW), the softmax's backward pass.
  """
  d_weights = tf.cast(d_weights, tf.float32)
  d_logits = weights * (d_weights - tf.reduce_sum(
      weights * d_weights, axis=-1, keepdims=True))
  if allowed is not None:
    # Masked logits were replaced by a constant, so they get no gradient.
    # This matters in fully masked rows, whose uniform weights are nonzero
    # at masked positions.
    d_logits = tf.where(allowed, d_logits, 0.0)
  return d_logits


def _backward_chunk_fused(call, query_chunk, d_context, item):
  """As `_backward_chunk`, with the kernel's gradient op from dU to dJ."""
  example = call.example(item)
  keys, values = call.key[example], call.value[example]
  dots, value_weights, allowed, chunk_bias = _fused_value_weights(
      call, item, query_chunk, keys)
  d_value_weights = tf.einsum(_CHUNK_D_WEIGHTS, d_context, values)
  grads = {"value": tf.einsum(_CHUNK_D_VALUE, value_weights[0], d_context)}
  d_dots, d_pre, d_post, d_bias, d_dynamic = (
      talking_heads_softmax.talking_heads_softmax_gradient(
          dots, call.pre_softmax, call.post_softmax,
          tf.expand_dims(d_value_weights, 0), allowed, chunk_bias,
          dynamic=call.dynamic_terms(item)))
  grads.update({name: grad[0] for name, grad in d_dynamic.items()})
  if call.pre_softmax is not None:
    grads["pre_softmax"] = d_pre
  if call.post_softmax is not None:
    grads["post_softmax"] = d_post
  if call.bias is not None:
    grads["bias"] = d_bias[0]  # dL[h, c, m], as `_backward_chunk` gives
  grads["query"] = tf.einsum(_CHUNK_D_QUERY, d_dots[0], keys)
  grads["key"] = tf.einsum(_CHUNK_D_KEY, d_dots[0], query_chunk)
  return grads


def _reduce_example_gradient(name, per_example, like, length):
  """Per-example gradients (from `_example_gradients`) in `like`'s shape."""
  if name == "query" or name in _PER_QUERY:  # [b, num_chunks * c, ...]
    return per_example[:, :length]
  if name in ("key", "value", "m2l", "m2w"):  # [b, m, ...]
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
