"""Why the Pallas kernel's O and dQ are wrong in half precision on a GPU.

benchmarks/accelerator.py's check on an H200 (2026-12-04): in bfloat16 and
float16 the output and dQ have relative error 1.0 while dK, dV and the mix
gradients are right; float32 is right. O = U V and dQ = dJ K are the
programs per query tile's [Bq, Bk] x [Bk, d] products; dK and dV are
[Bq, Bk]^T x [Bq, d]. This script runs minimal Pallas programs of each
form, then the kernel's forward at a tiny size, and prints what it sees.
What it found there: every minimal product right, and the kernel's
half-precision O exactly twice the reference (the products contracting
the default tiles' 8 keys; `pallas_tiles.dot` now makes those in
float32; benchmarks/RESULTS.md, "On an H200 after the fixes").

  python benchmarks/pallas_diagnose.py            # on a GPU
  python benchmarks/pallas_diagnose.py --interpret  # anywhere
"""

import sys
import traceback

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
import numpy as np

INTERPRET = "--interpret" in sys.argv


def report(name, got, want):
  got = np.asarray(jnp.asarray(got, jnp.float32))
  want = np.asarray(want, np.float32)
  err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
  print(f"{name}: rel {err:.1e}, |got| {np.linalg.norm(got):.3e}, "
        f"|want| {np.linalg.norm(want):.3e}, zeros "
        f"{np.mean(got == 0):.2f}, nan {np.mean(np.isnan(got)):.2f}",
        flush=True)
  return got


def minimal(dtype, form, store_dtype, three_d):
  """One program: x [16, 16] float32 cast to dtype, y [16, 32] of dtype."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 16)).astype(np.float32)
  y = rng.normal(size=(16, 2, 32)).astype(np.float32)
  yd = jnp.asarray(y, dtype)

  def kernel(x_ref, y_ref, o_ref):
    a = x_ref[...].astype(dtype)
    b = y_ref[pl.ds(0, 16), 1, :] if three_d else y_ref[:, 1, :]
    dims = ((1,), (0,)) if form == "a@b" else ((0,), (0,))
    acc = lax.dot_general(a, b, (dims, ((), ())),
                          preferred_element_type=jnp.float32)
    o_ref[:, 1, :] = acc.astype(o_ref.dtype)
    o_ref[:, 0, :] = jnp.zeros((16, 32), o_ref.dtype)

  out = pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((16, 2, 32), store_dtype),
      interpret=INTERPRET)(jnp.asarray(x), yd)
  xr = np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))
  yr = np.asarray(yd.astype(jnp.float32))[:, 1, :]
  want = xr @ yr if form == "a@b" else xr.T @ yr
  report(f"minimal {jnp.dtype(dtype).name} {form} store "
         f"{jnp.dtype(store_dtype).name} 3d={three_d}", out[:, 1, :], want)


def kernel_forward(dtype, hk=4, h=4, hv=4, n=64, d=32, heads_per_program=None):
  import dataclasses  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, ".")
  from benchmarks import accelerator  # pylint: disable=g-import-not-at-top
  from thattn.kernels import pallas_kernel  # pylint: disable=g-import-not-at-top
  from thattn.kernels import pallas_tiles  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)

  def normal(*shape, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)
  q = normal(1, n, hk, d, scale=d ** -0.5).astype(dtype)
  k, v = normal(1, n, hk, d).astype(dtype), normal(1, n, hv, d).astype(dtype)
  pre, post = normal(hk, h, scale=hk ** -0.5), normal(h, hv, scale=h ** -0.5)
  tiles = None
  if heads_per_program:
    tiles = dataclasses.replace(pallas_tiles.default_tiles(max(hk, h, hv)),
                                heads_per_program=heads_per_program)
  print("tiles", tiles or pallas_tiles.default_tiles(max(hk, h, hv)))
  out = jax.jit(lambda *a: pallas_kernel.talking_heads_attention(
      *a, tiles=tiles, interpret=INTERPRET))(q, k, v, pre, post)
  ref = accelerator._reference(  # pylint: disable=protected-access
      *(t.astype(jnp.float32) for t in (q, k, v)), pre, post, None, None,
      False)
  got = report(f"kernel forward {jnp.dtype(dtype).name}", out, ref)
  ref = np.asarray(ref)
  for j in range(hv):
    best = min(range(hv), key=lambda i: np.linalg.norm(got[..., j, :] -
                                                       ref[..., i, :]))
    ratio = (np.sum(got[..., j, :] * ref[..., j, :]) /
             max(np.sum(ref[..., j, :] ** 2), 1e-30))
    print(f"  head {j}: closest ref head {best}, fit scale {ratio:.3f}, "
          f"rows nonzero {np.mean(np.any(got[0, :, j] != 0, axis=-1)):.2f}")
  tile_rows = 16
  print("  per 16-row tile rel:", " ".join(
      f"{np.linalg.norm(got[0, r:r + tile_rows] - ref[0, r:r + tile_rows]) / np.linalg.norm(ref[0, r:r + tile_rows]):.1e}"
      for r in range(0, n, tile_rows)))


def main():
  print("jax", jax.__version__, jax.devices(), flush=True)
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    for form in ("a@b", "a^T@b"):
      for store in {jnp.float32, dtype}:
        for three_d in (False, True):
          try:
            minimal(dtype, form, store, three_d)
          except Exception:  # pylint: disable=broad-except
            traceback.print_exc(limit=2)
  for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
    try:
      kernel_forward(dtype)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()
  try:
    kernel_forward(jnp.bfloat16, hk=12, h=12, hv=12, n=64, d=64)
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()


if __name__ == "__main__":
  main()
