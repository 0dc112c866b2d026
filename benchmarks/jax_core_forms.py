"""The talking-heads core on JAX (CPU) written several ways, timed together.

The attention core only: J = Q K^T, L = mix(J, P_l), W = softmax(L),
U = mix(W, P_w), O = U V, with Q, K, V [b, n, h, d] and the mixes over the
heads (`thattn.keras3` writes them as einsums). Forward and backward
(gradients of sum(O^2) with respect to Q, K, V, P_l and P_w) under
`jax.jit(jax.grad(...))`, every form in this one process, round by round,
median of `--repeats`; each form's gradients are checked against the
einsum form's. Multi-head attention's core (no mixes) is the floor;
`fused_kernel` is what `thattn.keras3` runs on JAX on CPU.

    KERAS_BACKEND=jax python benchmarks/jax_core_forms.py            # h=12
    python benchmarks/jax_core_forms.py --heads 24 --forms einsum,multi_head
    python benchmarks/jax_core_forms.py --forms einsum,broadcast   # slow

Results: benchmarks/RESULTS.md, "thattn.keras3 against
keras.layers.MultiHeadAttention".
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def _scores(q, k):
  return jnp.einsum("bnhd,bmhd->bhnm", q, k)


def _outputs(u, v):
  return jnp.einsum("bhnm,bmhd->bnhd", u, v)


def einsum_mix(x, p):
  return jnp.einsum("bfnm,fg->bgnm", x, p)


def batched_matmul_mix(x, p):
  batch, heads = x.shape[:2]
  return jnp.matmul(p.T, x.reshape(batch, heads, -1)).reshape(x.shape)


def broadcast_mix(x, p):
  return (x[:, :, None] * p[None, :, :, None, None]).sum(axis=1)


def talking_heads(mix):
  def core(q, k, v, pl, pw):
    w = jax.nn.softmax(mix(_scores(q, k), pl), -1)
    return _outputs(mix(w, pw), v)
  return core


def multi_head(q, k, v, pl, pw):
  del pl, pw  # no mixes
  return _outputs(jax.nn.softmax(_scores(q, k), -1), v)


def heads_major(q, k, v, pl, pw):
  """Scores [h, b, n, m]: each mix is one [g, f] @ [f, b*n*m] product."""
  heads = q.shape[2]
  j = jnp.einsum("bnhd,bmhd->hbnm", q, k)
  w = jax.nn.softmax((pl.T @ j.reshape(heads, -1)).reshape(j.shape), -1)
  u = (pw.T @ w.reshape(heads, -1)).reshape(j.shape)
  return jnp.einsum("hbnm,bmhd->bnhd", u, v)


def _custom_forward(q, k, v, pl, pw):
  j = _scores(q, k)
  w = jax.nn.softmax(einsum_mix(j, pl), -1)
  u = einsum_mix(w, pw)
  return _outputs(u, v), (q, k, v, pl, pw, j, w, u)


def _custom_backward(saved, do):
  q, k, v, pl, pw, j, w, u = saved
  du = jnp.einsum("bnhd,bmhd->bhnm", do, v)
  dv = jnp.einsum("bhnm,bnhd->bmhd", u, do)
  dpw = jnp.einsum("bgnm,bhnm->gh", w, du)
  dw = einsum_mix(du, pw.T)
  dl = w * (dw - jnp.sum(dw * w, -1, keepdims=True))
  dpl = jnp.einsum("bhnm,bgnm->hg", j, dl)
  dj = einsum_mix(dl, pl.T)
  return (jnp.einsum("bhnm,bmhd->bnhd", dj, k),
          jnp.einsum("bhnm,bnhd->bmhd", dj, q), dv, dpl, dpw)


@jax.custom_vjp
def custom_vjp(q, k, v, pl, pw):
  return _custom_forward(q, k, v, pl, pw)[0]


custom_vjp.defvjp(_custom_forward, _custom_backward)

def fused_kernel(q, k, v, pl, pw):
  """thattn.keras3's XLA FFI kernel (compiled on first use)."""
  from thattn.kernels import jax_kernel  # pylint: disable=g-import-not-at-top
  return _outputs(jax_kernel.talking_heads_softmax(_scores(q, k), pl, pw), v)


FORMS = {
    "einsum": talking_heads(einsum_mix),
    "multi_head": multi_head,
    "heads_major": heads_major,
    "batched_matmul": talking_heads(batched_matmul_mix),
    "custom_vjp": custom_vjp,
    "broadcast": talking_heads(broadcast_mix),
    "fused_kernel": fused_kernel,
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--sizes", default="8,512,768",
                      help="batch,length,width")
  parser.add_argument("--forms", default="einsum,multi_head,heads_major,"
                      "batched_matmul,custom_vjp,fused_kernel")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  batch, length, width = (int(size) for size in args.sizes.split(","))
  heads = args.heads
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(batch, length, heads,
                                          width // heads)), jnp.float32)
             for _ in range(3))
  pl, pw = (jnp.asarray(rng.normal(size=(heads, heads)) / np.sqrt(heads),
                        jnp.float32) for _ in range(2))
  steps, reference = {}, None
  for name in ["einsum"] + [f for f in args.forms.split(",") if f != "einsum"]:
    grad = jax.jit(jax.grad(lambda *a, f=FORMS[name]: (f(*a) ** 2).sum(),
                            argnums=(0, 1, 2, 3, 4)))
    steps[name] = lambda g=grad: jax.block_until_ready(g(q, k, v, pl, pw))
    grads = steps[name]()  # compile
    if name == "einsum":
      reference = grads
    elif name != "multi_head":
      error = max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
                  for a, b in zip(grads, reference))
      assert error < 1e-4, (name, error)
  times = {name: [] for name in steps}
  for _ in range(args.repeats):
    for name, step in steps.items():
      start = time.perf_counter()
      step()
      times[name].append(time.perf_counter() - start)
  print(f"h={heads}, batch {batch}, length {length}, width {width}, "
        f"forward+backward of the core, median of {args.repeats}:")
  for name, values in times.items():
    print(f"  {name:15s} {1e3 * statistics.median(values):8.0f} ms")


if __name__ == "__main__":
  main()
