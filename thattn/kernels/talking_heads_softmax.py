"""The fused talking-heads softmax: one CPU op for mix, softmax and mix.

    L[b, h, n, m]   = einsum(J, P_l) + B
    U[b, h_v, n, m] = einsum(softmax_m(mask ? L : -1e9), P_w)

with J[b, h_k, n, m], P_l[h_k, h], P_w[h, h_v] and an optional bias B
broadcastable to [b, h, n, m] (T5's relative position bias), and optional
dynamic projections (the paper's Appendix A) added to P_l and P_w per query
row n or memory position m:

    L[b, h, n, m]   += einsum(J, R_Xl[b, n, h_k, h] + R_Ml[b, m, h_k, h])
    U[b, h_v, n, m] += einsum(W, R_Xw[b, n, h, h_v] + R_Mw[b, m, h, h_v])

exactly what
`thattn.layers.ProjectedAttention` computes with TensorFlow ops between the
dot products and the values. The op works on blocks of query rows that stay
in cache, so the logits L and weights W are never written to memory; its
gradient op recomputes them from J (talking_heads_softmax.cc says why and
how). Results equal the TensorFlow ops to float32 rounding
(tests/kernels/talking_heads_softmax_test.py).

J and U may be float32, bfloat16 or float16 (mixed precision): the op
widens each block of J to float32 in cache, computes in float32 (the
softmax too, as the TensorFlow-ops path does) and rounds U to J's dtype as
it writes it, so no float32 copy of J or U is ever made. P_l, P_w, the
bias and the dynamic projections go in as float32 (they are small), and
their gradients come back in their own dtypes.

Limits, checked by `unsupported_reason` so that callers can fall back:
float32, bfloat16 or float16 only, CPU only, no XLA (`jit_compile`) and
no DTensor, since neither knows this op, and not while a SavedModel is
traced, so that exports load without thattn. It is not differentiable
twice.
"""

import tensorflow as tf

from thattn.kernels import build
from thattn.kernels import compiler
from thattn.kernels import tf_internals

KERNEL = "talking_heads_softmax"
# The dtypes of J and U the op takes (its attr T).
_SCORE_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


def unsupported_reason(dots, *projections):
  """Why the fused op cannot run on these inputs here, or None if it can.

  Args:
    dots: J, the `[b, h_k, n, m]` dot products, or a tensor of J's dtype.
    *projections: the P_l and P_w variables or tensors (None for identity).
  """
  if dots.dtype not in _SCORE_DTYPES:
    return (f"the scores are {dots.dtype.name}; the kernel takes "
            f"{', '.join(dtype.name for dtype in _SCORE_DTYPES)}")
  if tf_internals.in_saved_model_tracing():
    # A SavedModel must load where thattn's kernel is not installed.
    return "SavedModel tracing must not record a custom op"
  if tf_internals.in_xla_context():
    return "XLA (jit_compile) cannot compile a custom op"
  if any(_is_dtensor_variable(p) for p in projections if p is not None):
    return "DTensor has no layout rule for a custom op"
  if tf.config.list_logical_devices("GPU"):
    return "the kernel runs on CPU only and a GPU is visible"
  try:
    build.load(KERNEL)
  except compiler.KernelUnavailable as error:
    return str(error)
  return None


def _is_dtensor_variable(variable):
  # Under a mixed precision policy tf-keras wraps each weight in an
  # AutoCastVariable, which keeps the real one in `_variable`.
  variable = getattr(variable, "_variable", variable)
  return isinstance(variable, tf.experimental.dtensor.DVariable)


def talking_heads_softmax(dots, pre_softmax, post_softmax, mask=None,
                          bias=None, dynamic=None, rows_per_block=0):
  """U = einsum(softmax(einsum(J, P_l) + B, masked), P_w), fused.

  Args:
    dots: J, `[b, h_k, n, m]`, float32, bfloat16 or float16.
    pre_softmax: P_l, `[h_k, h]`, or for grouped talking heads its G
      diagonal blocks `[G, h_k/G, h/G]` (each group's heads mix among
      themselves); None means identity (h = h_k).
    post_softmax: P_w, `[h, h_v]` or `[G, h/G, h_v/G]`; None means
      identity (h_v = h).
    mask: optional boolean tensor broadcastable to `[b, 1, n, m]`; True
      means "may attend". A fully masked row is uniform, as in
      `thattn.layers.attention_ops.masked_softmax`.
    bias: optional B, broadcastable to `[b, h, n, m]`, added to the logits
      after P_l and before the mask; it gets a gradient.
    dynamic: optional {name: R} of dynamic projections, any of "x2l"
      (R_Xl[b, n, h_k, h]), "m2l" (R_Ml[b, m, h_k, h]), "x2w"
      (R_Xw[b, n, h, h_v]) and "m2w" (R_Mw[b, m, h, h_v]); each gets a
      gradient.
    rows_per_block: query rows per cache block; 0 picks from the sizes.

  Returns:
    U, `[b, h_v, n, m]` in J's dtype.

  Raises:
    compiler.KernelUnavailable: the kernel cannot be built or loaded here.
  """
  ops = build.load(KERNEL)
  return ops.thattn_talking_heads_softmax(
      *_op_inputs(dots, pre_softmax, post_softmax, mask, bias, dynamic),
      rows_per_block=rows_per_block)


def talking_heads_softmax_gradient(dots, pre_softmax, post_softmax,
                                   grad_mixed, mask=None, bias=None,
                                   dynamic=None, rows_per_block=0):
  """dJ, dP_l, dP_w, dB and {name: dR} of `talking_heads_softmax` given dU.

  In one pass, for callers that write their own backward pass (the
  query-chunked core); autodiff of `talking_heads_softmax` uses the same
  op. dP_l (dP_w) is None when P_l (P_w) is None. dB is dL per example,
  `[b, h, n, m]` whatever the bias's shape (the caller sums it over
  broadcast dimensions), or None without a bias. The last item has the
  gradient of each of `dynamic`'s projections, in its shape.
  """
  ops = build.load(KERNEL)
  dynamic = dynamic or {}
  grad_dots, grad_pre, grad_post, grad_bias, *grad_dynamic = (
      ops.thattn_talking_heads_softmax_grad(
          *_op_inputs(dots, pre_softmax, post_softmax, mask, bias, dynamic),
          tf.cast(grad_mixed, dots.dtype), rows_per_block=rows_per_block))
  grad_dynamic = {
      name: tf.cast(_from_op_layout(name, grad), dynamic[name].dtype)
      for name, grad in zip(DYNAMIC_PROJECTIONS, grad_dynamic)
      if name in dynamic}
  return (grad_dots,
          None if pre_softmax is None else tf.cast(grad_pre,
                                                   pre_softmax.dtype),
          None if post_softmax is None else tf.cast(grad_post,
                                                    post_softmax.dtype),
          None if bias is None else grad_bias, grad_dynamic)


# The dynamic projections, in the op's order of inputs, and the layout the
# op takes each in: the per-memory ones with m last, so that the kernel
# reads each (i, j) entry along m as one contiguous run.
DYNAMIC_PROJECTIONS = ("x2l", "m2l", "x2w", "m2w")
_OP_LAYOUT = {"x2l": None, "m2l": [0, 2, 3, 1], "x2w": None,
              "m2w": [0, 2, 3, 1]}


def _from_op_layout(name, tensor):
  """A projection (or its gradient) from the op's layout to the caller's."""
  if _OP_LAYOUT[name] is None:
    return tensor
  return tf.transpose(tensor, [0, 3, 1, 2])  # [b, f, g, m] -> [b, m, f, g]


def _output_heads(projection):
  """h of P_l[h_k, h], or of its grouped blocks [G, h_k/G, h/G]."""
  shape = tf.shape(projection)
  return shape[-1] * shape[0] if projection.shape.rank == 3 else shape[-1]


def _op_inputs(dots, pre_softmax, post_softmax, mask, bias, dynamic):
  """The op's (J, P_l, P_w, mask, B, R_Xl, R_Ml, R_Xw, R_Mw).

  Identities for None projections; the mask as [b, n, m]; B as
  [1 or b, h, n, m]; R_Ml and R_Mw as [b, i, j, m]; an absent mask, bias
  or dynamic projection as a tensor of no elements; all but J (and the
  mask) as float32, whatever J's dtype.
  """
  shape = tf.shape(dots)
  batch, length, memory = shape[0], shape[2], shape[3]
  pre_softmax = (tf.eye(shape[1]) if pre_softmax is None else
                 tf.cast(pre_softmax, tf.float32))
  heads = _output_heads(pre_softmax)
  post_softmax = (tf.eye(heads) if post_softmax is None else
                  tf.cast(post_softmax, tf.float32))
  if mask is None:
    mask = tf.zeros([0], tf.bool)
  else:
    # The op takes one mask row per (example, query): [b, n, m], at most
    # b*n*m bytes, small next to the [b, heads, n, m] float scores.
    mask = tf.reshape(tf.broadcast_to(mask, [batch, 1, length, memory]),
                      [batch, length, memory])
  if bias is None:
    bias = tf.zeros([0])
  else:
    # A bias shared by the batch (T5's [1, h, n, m]) stays unbroadcast
    # over the batch; TensorFlow's BroadcastTo gradient sums dB back to the
    # bias's own shape.
    bias = tf.convert_to_tensor(bias)
    shared = bias.shape.rank == 4 and bias.shape[0] == 1
    bias = tf.broadcast_to(
        tf.cast(bias, tf.float32),
        [1 if shared else batch, heads, length, memory])
  dynamic = dynamic or {}
  unknown = sorted(set(dynamic) - set(DYNAMIC_PROJECTIONS))
  if unknown:
    raise ValueError(f"Unknown dynamic projections {unknown}; expected any "
                     f"of {list(DYNAMIC_PROJECTIONS)}.")
  projections = []
  for name in DYNAMIC_PROJECTIONS:
    if name not in dynamic:
      projections.append(tf.zeros([0]))
      continue
    layout = _OP_LAYOUT[name]
    tensor = tf.cast(dynamic[name], tf.float32)
    projections.append(tensor if layout is None else
                       tf.transpose(tensor, layout))
  return (dots, pre_softmax, post_softmax, mask, bias, *projections)


@tf.RegisterGradient("ThattnTalkingHeadsSoftmax")
def _talking_heads_softmax_gradient(op, grad_mixed):
  """dJ, dP_l, dP_w, dB and the dynamic projections' gradients from the
  gradient op; the mask gets none, nor any absent input."""
  ops = build.load(KERNEL)
  (grad_dots, grad_pre, grad_post, grad_bias,
   *grad_dynamic) = ops.thattn_talking_heads_softmax_grad(
       *op.inputs, grad_mixed, rows_per_block=op.get_attr("rows_per_block"))
  bias = op.inputs[4]
  if bias.shape.rank != 4:  # the empty stand-in for "no bias"
    grad_bias = None
  elif bias.shape[0] == 1:  # shared by the batch: the op gave dB per example
    grad_bias = tf.reduce_sum(grad_bias, axis=0, keepdims=True)
  # An absent projection is an empty stand-in of rank 1.
  grad_dynamic = [grad if op.inputs[5 + index].shape.rank == 4 else None
                  for index, grad in enumerate(grad_dynamic)]
  return (grad_dots, grad_pre, grad_post, None, grad_bias, *grad_dynamic)
