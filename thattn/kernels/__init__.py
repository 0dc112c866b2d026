"""Compiled CPU kernels for thattn's layers.

The kernels are C++ TensorFlow ops, compiled from the sources in this folder
against the installed TensorFlow on first use and cached (see `build` and
`compiler`); `talking_heads_softmax_xla.cc` is the same fused softmax as XLA
FFI custom calls for JAX on CPU (`thattn.keras3.jax_kernel`). The
layers fall back to plain TensorFlow ops wherever a kernel cannot run, so a
machine without a C++ compiler loses speed, not results.
"""
