"""Which kernel computes one attention call: the one choice, for both fronts.

An attention layer describes its call (`Call`: its switch, P_l and P_w,
the dynamic terms, Q, K and V, the mask, bias, causal offset, dropout and
whether it wants the scores) and `choose` returns a `Choice`: the kernel
that computes the core and, on tf_keras, whether it runs query chunk by
query chunk. The layers then run the kernel named; none of them weighs one
kernel against another.

| kernel                  | computes             | where                      |
|-------------------------|----------------------|----------------------------|
| PALLAS                  | O from Q, K, V, tile | Keras 3 on JAX on a GPU or |
|                         | by tile (`pallas_    | TPU, where `kernel_choice` |
|                         | kernel`)             | measured it faster or      |
|                         |                      | keras.ops would not fit;   |
|                         |                      | THATTN_PALLAS=interpret    |
| CUDNN                   | O, cuDNN through JAX | Keras 3 multi-head         |
|                         | (`cudnn`)            | attention, JAX on NVIDIA   |
| DOT_PRODUCT_ATTENTION   | O, keras.ops.dot_    | Keras 3 multi-head         |
|                         | product_attention    | attention on accelerators  |
|                         |                      | (or flash_attention=True)  |
| CPU_OP                  | U from J, one fused  | TensorFlow on CPU, both    |
|                         | op (`talking_heads_  | fronts                     |
|                         | softmax`)            |                            |
| XLA_FFI                 | U from J, XLA FFI    | Keras 3 on JAX on CPU      |
|                         | calls (`jax_kernel`) |                            |
| OPS                     | the framework's ops  | anywhere: the reference    |

Talking heads (a layer with P_l or P_w) is tried on PALLAS first, then on
the fused softmax of its framework (CPU_OP on TensorFlow, XLA_FFI on JAX;
PyTorch has none), then OPS. Multi-head attention is tried on CUDNN or
DOT_PRODUCT_ATTENTION (Keras 3 on accelerators; on a CPU its keras.ops
core measured faster: `thattn.keras3.flash`), then OPS; on tf_keras it has
no kernel. Each kernel's obstacles are checked in the order written below,
and the first one found is the reason.

The switch (`fused_kernel` for talking heads, `flash_attention` for Keras
3's multi-head attention, or the alias the user gave): None takes the
kernel wherever it applies (and, for Pallas, where it was measured
faster), False never, True always: where the kernel cannot run, a
ValueError names the first obstacle.

tf_keras's chunked core (`thattn.layers.chunked`) applies when all of
these hold:
- `query_chunk_size` is set;
- the caller does not ask for the scores U, which it never holds whole;
- the layer has no dynamic projections, or the fused op runs: the chunked
  TF-ops core mixes heads with P_l, P_w only, while the op takes each
  chunk's R_Xl, R_Xw rows and the example's R_Ml, R_Mw;
- attention dropout cannot run (dropout 0, or training False or None): its
  random mask would have to be regenerated identically when the backward
  pass recomputes a chunk.

This module imports no framework itself: each kernel's own checks are
imported where its framework is the one running.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional

PALLAS = "pallas"
CUDNN = "cudnn"
DOT_PRODUCT_ATTENTION = "dot_product_attention"
CPU_OP = "cpu_op"
XLA_FFI = "xla_ffi"
OPS = "ops"

TF_KERAS = "tf_keras"
KERAS3 = "keras3"

PALLAS_VARIABLE = "THATTN_PALLAS"
_PALLAS_SETTINGS = ("", "interpret", "off")

SCORES_REFUSED = (
    "Returning attention scores is not supported when flash attention is "
    "enabled. Please disable flash attention to access attention scores.")


@dataclasses.dataclass(frozen=True)
class Call:
  """One attention call, as the kernels' choice reads it.

  Attributes:
    owner: the layer's name, for the error messages.
    front: TF_KERAS or KERAS3.
    switch: None (a kernel where it applies), True (always) or False.
    switch_name: the name the user gave the switch, for the messages.
    query: Q[b, n, h_k, d_k] (on tf_keras, any tensor of J's dtype).
    key: K[b, m, h_k, d_k], or None (tf_keras).
    value: V[b, m, h_v, d_v], or None (tf_keras).
    projections: (P_l, P_w) as the kernels take them (values; tf_keras:
      variables), each None for the identity.
    dynamic: {name: R} of the dynamic projections of this call, or {}.
    head_groups: G, of grouped talking heads.
    num_heads: h, the softmax heads.
    mask: boolean [b or 1, h or 1, n or 1, m] without the causal part, or
      None.
    bias: B[b or 1, h, n, m], or None.
    causal_offset: None, or the memory position of the first query.
    dropout: the layer's attention dropout rate.
    training: the call's `training` argument.
    need_scores: whether the caller asks for U.
    chunk_size: tf_keras's query_chunk_size, or None.
  """
  owner: str
  front: str
  switch: Optional[bool]
  switch_name: str = "fused_kernel"
  query: Any = None
  key: Any = None
  value: Any = None
  projections: tuple = (None, None)
  dynamic: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  head_groups: int = 1
  num_heads: Optional[int] = None
  mask: Any = None
  bias: Any = None
  causal_offset: Any = None
  dropout: float = 0.0
  training: Any = None
  need_scores: bool = False
  chunk_size: Optional[int] = None

  @property
  def mixes_heads(self):
    return any(p is not None for p in self.projections)


@dataclasses.dataclass(frozen=True)
class Choice:
  """The kernel of one call (a name above), and whether tf_keras runs it
  chunk by chunk (`thattn.layers.chunked`)."""
  kernel: str
  chunked: bool = False


def choose(call):
  """The `Choice` of `call`, by the rules of the module docstring; a
  ValueError where `call.switch` is True and no kernel can run it."""
  if call.front == TF_KERAS:
    return _tf_keras_choice(call)
  if call.front != KERAS3:
    raise ValueError(f"{call.owner}: unknown front end {call.front!r}; "
                     f"expected {TF_KERAS!r} or {KERAS3!r}")
  if call.mixes_heads:
    return Choice(_talking_heads_kernel(call))
  return Choice(_multi_head_kernel(call))


def _refusal(call, reason, instead):
  return ValueError(f"{call.owner}: {call.switch_name}=True, but {reason}. "
                    f"Pass {call.switch_name}=None to use {instead} "
                    f"instead.")


# ---- tf_keras ---------------------------------------------------------------

def _tf_keras_choice(call):
  fused = False
  if call.switch is not False:
    reason = _cpu_op_obstacle(call)
    if reason is not None and call.switch:
      raise _refusal(call, reason, "TensorFlow ops")
    fused = reason is None
  return Choice(CPU_OP if fused else OPS,
                chunked=_chunked_core_applies(call, fused))


def _chunked_core_applies(call, fused):
  if not call.chunk_size or call.need_scores or (call.dynamic and
                                                 not fused):
    return False
  # None is Keras's "not training"; a tensor might be True at run time.
  return (call.dropout == 0 or call.training is False or
          call.training is None)


def _cpu_op_obstacle(call):
  """Why the fused TensorFlow op cannot compute this call, or None."""
  if call.dynamic and call.head_groups != 1:
    return "the kernel has no grouped dynamic projections"
  from thattn.kernels import talking_heads_softmax  # pylint: disable=g-import-not-at-top
  return talking_heads_softmax.unsupported_reason(call.query,
                                                  *call.projections)


# ---- Keras 3: talking heads ---------------------------------------------------

def _talking_heads_kernel(call):
  """PALLAS, then the framework's fused softmax, then OPS."""
  if call.switch is False:
    return OPS
  mode = pallas_mode()
  if mode is not None:
    reason = _pallas_obstacle(call)
    if reason is not None:
      # Interpret mode refuses as an accelerator would, so CI sees the
      # refusals a GPU user gets.
      if call.switch:
        raise _refusal(call, reason, "keras.ops")
    elif (call.switch or mode == "interpret" or
          _pallas_measured_faster(call)):
      return PALLAS
  reason = _fused_softmax_obstacle(call)
  if reason is not None:
    if call.switch:
      raise _refusal(call, reason, "keras.ops")
    return OPS
  return XLA_FFI if _framework() == "jax" else CPU_OP


def pallas_mode():
  """How the Pallas kernel would run here: "gpu", "tpu", "interpret", or
  None where it does not (not JAX; JAX on CPU without THATTN_PALLAS=
  interpret; THATTN_PALLAS=off)."""
  setting = os.environ.get(PALLAS_VARIABLE, "")
  if setting not in _PALLAS_SETTINGS:
    raise ValueError(
        f"{PALLAS_VARIABLE}={setting!r}: expected unset, 'interpret' (run "
        "the Pallas kernel in interpret mode, on any platform) or 'off' "
        "(never run it).")
  if _framework() != "jax" or setting == "off":
    return None
  if setting == "interpret":
    return "interpret"
  import jax  # pylint: disable=g-import-not-at-top
  platform = jax.default_backend()
  return platform if platform in ("gpu", "tpu") else None


def _pallas_obstacle(call):
  """Why the Pallas kernel cannot compute this call, or None."""
  import keras  # pylint: disable=g-import-not-at-top
  if call.dynamic:
    return "the Pallas kernel has no dynamic projections"
  if call.head_groups != 1:
    return "the Pallas kernel has no head groups"
  if call.need_scores:
    return ("return_attention_scores asks for the [b, h_v, n, m] weights, "
            "which the Pallas kernel never forms")
  if call.dropout and call.training:
    return ("the Pallas kernel has no attention dropout (training with "
            f"dropout={call.dropout})")
  if call.causal_offset is not None and not isinstance(call.causal_offset,
                                                       int):
    return ("the Pallas kernel needs a static causal offset, and decoding "
            "steps pass a traced one")
  if keras.distribution.distribution() is not None:
    return ("a keras.distribution is active: P_l and P_w mix every head, so "
            "the kernel cannot run per shard of split heads, and on whole "
            "arrays it would gather them; keras.ops lets XLA partition the "
            "computation")
  dtype = keras.backend.standardize_dtype(call.query.dtype)
  if dtype not in ("float32", "bfloat16", "float16"):
    return ("the Pallas kernel computes float32, bfloat16 or float16, not "
            f"{dtype}")
  mask = call.mask
  if mask is not None and (len(mask.shape) != 4 or mask.shape[1] != 1):
    return ("the Pallas kernel takes one mask for all heads, got a mask of "
            f"shape {tuple(mask.shape)}")
  if call.bias is not None and len(call.bias.shape) != 4:
    return ("the Pallas kernel takes a position bias [b or 1, h, n, m], got "
            f"shape {tuple(call.bias.shape)}")
  return None


def _pallas_measured_faster(call):
  """fused_kernel=None on an accelerator: the kernel where `kernel_choice`
  measured it faster than keras.ops here, or keras.ops would not fit."""
  from thattn.kernels import kernel_choice  # pylint: disable=g-import-not-at-top
  return kernel_choice.use_kernel_by_default(
      call.query.shape[0], call.num_heads, call.query.shape[1],
      call.key.shape[1])


def _fused_softmax_obstacle(call):
  """Why neither fused softmax (J to U) can compute this Keras 3 call, or
  None: the TensorFlow op on TensorFlow, XLA FFI on JAX."""
  framework = _framework()
  if framework == "jax":
    from thattn.kernels import jax_kernel  # pylint: disable=g-import-not-at-top
    reason = jax_kernel.unsupported_reason(call.query, *call.projections,
                                           call.bias, call.dynamic)
  elif framework == "tensorflow":
    reason = _cpu_op_obstacle(call)
  else:
    return (f"the fused kernels run on the TensorFlow and JAX backends and "
            f"the Keras backend is {framework}")
  if reason is None and call.mask is not None and call.mask.shape[1] != 1:
    reason = ("the kernels take one mask for all heads, and this "
              f"attention_mask is per head (shape {tuple(call.mask.shape)})")
  return reason


# ---- Keras 3: multi-head attention -------------------------------------------

def _multi_head_kernel(call):
  """CUDNN or DOT_PRODUCT_ATTENTION on accelerators (or flash forced),
  else OPS: `thattn.keras3.flash` says why."""
  flash = call.switch
  if flash is False or (flash is None and not on_accelerator()):
    return OPS
  if call.need_scores:
    if flash:
      raise ValueError(f"{call.owner}: {SCORES_REFUSED}")
    return OPS
  if call.dropout and call.training:
    return OPS
  key_dim, value_dim = call.query.shape[-1], call.value.shape[-1]
  if key_dim != value_dim:
    # JAX's dot_product_attention needs d_k == d_v (keras.layers.
    # MultiHeadAttention fails there on such a layer; thattn's does not).
    if flash:
      raise ValueError(
          f"{call.owner}: flash_attention=True needs key_dim == value_dim, "
          f"got key_dim={key_dim} and value_dim={value_dim}; pass "
          "flash_attention=None or False.")
    return OPS
  from thattn.kernels import cudnn  # pylint: disable=g-import-not-at-top
  if not cudnn.available():
    return DOT_PRODUCT_ATTENTION
  reason = cudnn.obstacle(call.query, call.key, call.value, call.bias,
                          call.mask, call.causal_offset, cudnn.max_head_dim())
  if reason is None:
    return CUDNN
  if flash:
    raise ValueError(f"{call.owner}: flash_attention=True, but {reason}. "
                     "Pass flash_attention=None to compute it with "
                     "keras.ops instead.")
  return OPS


def on_accelerator():
  """Whether this Keras backend computes on a GPU or TPU, where its fused
  attention kernels run (TensorFlow: Keras has none; it is einsums)."""
  framework = _framework()
  if framework == "jax":
    import jax  # pylint: disable=g-import-not-at-top
    return jax.default_backend() in ("gpu", "tpu")
  if framework == "torch":
    import torch  # pylint: disable=g-import-not-at-top
    return torch.cuda.is_available()  # Keras's torch backend then uses it
  return False


def _framework():
  import keras  # pylint: disable=g-import-not-at-top
  return keras.backend.backend()
