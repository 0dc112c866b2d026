"""Which talking-heads core an accelerator runs by default: measured.

`fused_kernel=None` on a GPU or TPU picks between the Pallas kernel
(`thattn.kernels.pallas_kernel`: FlashAttention's memory, never [b, h, n,
m]) and the keras.ops einsums (which hold [b, h, n, m] several times) from
the measurements below, taken with `benchmarks/accelerator.py`
(forward+backward of one self-attention layer, width 768, bfloat16,
16,384 tokens per step; benchmarks/RESULTS.md). The kernel is the default
only

- where a measurement on this kind of device, at these heads and the
  nearest length measured, found it faster than keras.ops, or
- where keras.ops would not fit: its working set, KERAS_OPS_BYTES per
  element of [b, h, n, m] (measured), over half the device's memory.

A device or head count with no measurement gets keras.ops unless it would
not fit. `THATTN_PALLAS=interpret` still runs the kernel wherever it
applies (it asks for the kernel, for tests).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Measurement:
  """Forward+backward ms of one layer; None where it ran out of memory."""
  device_kind: str  # jax.Device.device_kind, e.g. "NVIDIA H200"
  heads: int
  length: int
  keras_ops_ms: float | None
  kernel_ms: float | None


# Issue 41's H200 table (2026-11-27, jax 0.11.2; benchmarks/RESULTS.md).
# A run of benchmarks/accelerator.py ends its results.md with these rows,
# as measured, for its device.
MEASUREMENTS = (
    Measurement("NVIDIA H200", 12, 4096, 23.4, 134.4),
    Measurement("NVIDIA H200", 12, 16384, 65.4, 532.6),
    Measurement("NVIDIA H200", 24, 4096, 42.8, 2903.0),
    Measurement("NVIDIA H200", 24, 16384, None, 11624.0),
)

# The keras.ops path's peak device memory per element of [b, h, n, m],
# forward+backward in bfloat16: 12.24 GiB at b h n m = 4 * 12 * 4096^2
# (16.3 bytes) and 42.17 GiB at 1 * 12 * 16384^2 (14.1 bytes), H100,
# benchmarks/RESULTS.md.
KERAS_OPS_BYTES = 16
# Of the device's memory, what one layer's keras.ops working set may take:
# the rest of the model and its other layers' saved activations need room.
MEMORY_SHARE = 0.5


def keras_ops_fits(batch, heads, length, memory, device_bytes):
  """Whether the keras.ops core's [b, h, n, m] working set fits in
  MEMORY_SHARE of `device_bytes` (None: unknown, assumed to fit)."""
  if device_bytes is None or batch is None:
    return True
  needed = KERAS_OPS_BYTES * batch * heads * length * memory
  return needed <= MEMORY_SHARE * device_bytes


def kernel_measured_faster(device_kind, heads, length,
                           measurements=MEASUREMENTS):
  """Whether the nearest measurement (same device kind and heads, nearest
  length) found the kernel faster than keras.ops; False with none."""
  candidates = [m for m in measurements
                if m.device_kind == device_kind and m.heads == heads and
                m.keras_ops_ms is not None and m.kernel_ms is not None]
  if not candidates:
    return False
  nearest = min(candidates, key=lambda m: abs(m.length - length))
  return nearest.kernel_ms < nearest.keras_ops_ms


def use_kernel_by_default(batch, heads, length, memory):
  """The default (fused_kernel=None) on this JAX accelerator: the Pallas
  kernel where measured faster or where keras.ops would not fit."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  device_bytes = stats.get("bytes_limit")
  if not keras_ops_fits(batch, heads, length, memory, device_bytes):
    return True
  return kernel_measured_faster(device.device_kind, heads, length)
