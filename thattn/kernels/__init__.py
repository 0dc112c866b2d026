"""The kernels behind thattn's attention layers, in one place.

- On CPUs: C++ TensorFlow ops, compiled from the sources in this folder
  against the installed TensorFlow on first use and cached (`build`,
  `compiler`; `talking_heads_softmax`, `tf_internals`), and the same fused
  softmax as XLA FFI custom calls for JAX (`talking_heads_softmax_xla.cc`,
  `jax_kernel`).
- On GPUs, for Keras 3 on JAX: talking heads' whole core as a Pallas
  kernel (`pallas_kernel`, composed of `pallas_programs`, launched by
  `pallas_launch`, with the arithmetic of one tile in `pallas_tiles`), and
  multi-head attention on cuDNN's fused attention (`cudnn`).
- `kernel_choice`: the table measured on each device kind that the
  default (`fused_kernel=None`, `flash_attention=None`) reads.

Which kernel a call runs is chosen in one place for both fronts,
`dispatch`, from a description of the call (the layers then run the
kernel it names: `thattn.layers.core` on tf_keras, `thattn.keras3.fused`
and `thattn.keras3.flash` on Keras 3). The layers fall back to plain ops wherever a kernel cannot run, so a
machine without a C++ compiler or a GPU loses speed, not results. Nothing
here is imported by `import thattn.kernels`: each module imports its own
framework.
"""
