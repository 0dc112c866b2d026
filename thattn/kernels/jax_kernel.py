"""thattn's fused talking-heads softmax for JAX on CPU (XLA FFI custom calls).

J[b, h_k, n, m] -> U[b, h_v, n, m] (mix, masked softmax, mix) in one pass
per block of query rows, from `thattn/kernels/talking_heads_softmax_xla.cc`,
compiled on first use like the TensorFlow kernel (`thattn.kernels.compiler`)
against jaxlib's XLA FFI headers and the Eigen headers TensorFlow ships (no
TensorFlow import). Its gradient is the companion custom call, tied in by
`jax.custom_vjp`; both are `jax.ffi.ffi_call`s, so a step stays traceable by
`jax.jit` with static shapes (no host callbacks).

It covers the common case: dense P_l and P_w, an optional boolean mask, no
bias, no dynamic projections, float32, on the CPU platform. Everything else
keeps the keras.ops path (`unsupported_reason` says why).
"""

import importlib.util
import os

import jax
import jax.numpy as jnp

from thattn.kernels import compiler

_NAME = "talking_heads_softmax_xla"
_FORWARD = "thattn_talking_heads_softmax"
_GRADIENT = "thattn_talking_heads_softmax_grad"
# None: not tried yet; True: registered; a KernelUnavailable: why not.
_state = {"registered": None}


def _eigen_include():
  """TensorFlow's include folder (it holds Eigen), found without importing
  TensorFlow."""
  spec = importlib.util.find_spec("tensorflow")
  if spec is None or not spec.submodule_search_locations:
    raise compiler.KernelUnavailable(
        "the Eigen headers come with TensorFlow, which is not installed")
  include = os.path.join(list(spec.submodule_search_locations)[0], "include")
  if not os.path.isdir(os.path.join(include, "Eigen")):
    raise compiler.KernelUnavailable(f"no Eigen headers in {include}")
  return include


def _register():
  """Compiles and registers the custom calls once; KernelUnavailable if not."""
  if _state["registered"] is None:
    try:
      import ctypes  # pylint: disable=g-import-not-at-top
      library = ctypes.cdll.LoadLibrary(compiler.compiled_library(
          _NAME, ["-std=c++17", f"-I{jax.ffi.include_dir()}",
                  f"-I{_eigen_include()}"], f"jax {jax.__version__}"))
      for target, symbol in ((_FORWARD, "ThattnTalkingHeadsSoftmaxXla"),
                             (_GRADIENT, "ThattnTalkingHeadsSoftmaxGradXla")):
        jax.ffi.register_ffi_target(
            target, jax.ffi.pycapsule(getattr(library, symbol)),
            platform="cpu")
      _state["registered"] = True
    except (compiler.KernelUnavailable, OSError) as error:
      _state["registered"] = (
          error if isinstance(error, compiler.KernelUnavailable) else
          compiler.KernelUnavailable(f"loading the {_NAME} kernel failed: "
                                     f"{error}"))
  if _state["registered"] is not True:
    raise _state["registered"]


def unsupported_reason(dots, pre, post, bias, dynamic):
  """Why the kernel cannot compute this call, or None."""
  if jax.default_backend() != "cpu":
    return f"the JAX kernel is for CPU and JAX runs on {jax.default_backend()}"
  if pre is None or post is None:
    return "the JAX kernel needs both P_l and P_w"
  if len(pre.shape) != 2 or len(post.shape) != 2:
    return "the JAX kernel has no grouped heads"
  if bias is not None:
    return "the JAX kernel has no position bias"
  if dynamic:
    return "the JAX kernel has no dynamic projections"
  if dots.dtype != jnp.float32:
    return f"the JAX kernel computes in float32, not {dots.dtype}"
  try:
    _register()
  except compiler.KernelUnavailable as error:
    return str(error)
  return None


def talking_heads_softmax(dots, pre, post, mask=None):
  """U[b, h_v, n, m] from J[b, h_k, n, m]; mask bool, broadcastable to
  [b, 1, n, m] (True: may attend), or None."""
  _register()
  batch, _, length, memory = dots.shape
  if mask is None:
    mask = jnp.zeros((0,), bool)
  else:
    mask = jnp.broadcast_to(jnp.asarray(mask, bool),
                            (batch, 1, length, memory))[:, 0]
  return _fused(dots, pre, post, mask)


@jax.custom_vjp
def _fused(dots, pre, post, mask):
  batch, _, length, memory = dots.shape
  out = jax.ShapeDtypeStruct((batch, post.shape[1], length, memory),
                             jnp.float32)
  return jax.ffi.ffi_call(_FORWARD, out)(dots, pre, post, mask)


def _fused_forward(dots, pre, post, mask):
  return _fused(dots, pre, post, mask), (dots, pre, post, mask)


def _fused_backward(saved, d_value_weights):
  dots, pre, post, mask = saved
  shapes = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32)
                 for x in (dots, pre, post))
  d_dots, d_pre, d_post = jax.ffi.ffi_call(_GRADIENT, shapes)(
      dots, pre, post, mask, d_value_weights)
  return d_dots, d_pre, d_post, None


_fused.defvjp(_fused_forward, _fused_backward)
