"""The Pallas talking-heads kernel, in Pallas's interpret mode on CPU.

Run by `pallas_test.py` in a JAX process with THATTN_PALLAS=interpret, not
collected on its own. The kernel (`thattn.kernels.pallas_kernel`) is checked
against a float64 NumPy transcription of the paper's core (forward) and
against jax.grad of thattn's keras.ops path (every gradient), for every
case the kernel covers; then through the Keras 3 layer; then that its
traced program holds no [b, h, n, m] buffer and that it lowers to Triton
for a CUDA GPU (lowering needs no GPU; running does).

Tolerances (relative L2 error): float32 1e-5; float16 4e-3 and bfloat16
2.5e-2, against a float32 reference on the same rounded inputs (the kernel
rounds U to the input dtype before the U V product, as the keras.ops path
rounds W).
"""

import functools
import os
import types

import jax
from jax import export
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from thattn import keras3
from thattn.keras3 import attention_math
from thattn.keras3 import masks
from thattn.kernels import pallas_kernel
from thattn.kernels import pallas_tiles
from tests.layers import numpy_reference as ref

assert keras.backend.backend() == "jax"
assert os.environ.get("THATTN_PALLAS") == "interpret"

TOLERANCE = {"float32": 1e-5, "float16": 4e-3, "bfloat16": 2.5e-2}
TILES = pallas_tiles.default_tiles(0)  # 16 x 8: several tiles per sequence
# Programs per slice of 8 heads (16 per key-tile program): more than 8
# heads of a kind are split, 17 to 20 into slices of 8, 8 and the rest.
SLICED = pallas_tiles.Tiles(16, 8, num_warps=8, heads_per_program=8)


def paper_core(q, k, v, pre, post, mask=None, bias=None, causal=False,
               offset=0):
  """O[b, n, h_v, d_v] in float64: the paper's J -> L -> W -> U -> O, with
  masked logits at -1e9 (numpy_reference's convention)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  dots = np.einsum("bnik,bmik->binm", q, k)  # J[h_k, n, m]
  logits = dots if pre is None else np.einsum(
      "binm,ih->bhnm", dots, np.asarray(pre, np.float64))  # L[h, n, m]
  if bias is not None:
    logits = logits + np.asarray(bias, np.float64)
  n, m = q.shape[1], k.shape[1]
  allowed = np.ones((1, 1, n, m), bool)
  if causal:
    allowed = allowed & (np.arange(m)[None, :] <= np.arange(n)[:, None] +
                         offset)
  if mask is not None:
    mask = np.asarray(mask, bool)
    allowed = allowed & (mask[:, None, None, :] if mask.ndim == 2 else
                         mask[:, None])
  weights = ref.softmax(np.where(allowed, logits, ref.MASKED_LOGIT), axis=-1)
  mixed = weights if post is None else np.einsum(
      "bhnm,hj->bjnm", weights, np.asarray(post, np.float64))  # U[h_v, n, m]
  return np.einsum("bjnm,bmjv->bnjv", mixed, v)


def keras_ops_core(q, k, v, pre, post, mask=None, bias=None, causal=False,
                   offset=0):
  """The same core through thattn's keras.ops path (attention_math), in
  float32: what jax.grad differentiates for the reference gradients."""
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  dots = jnp.einsum("bnik,bmik->binm", q, k, precision="highest")
  logits = dots if pre is None else attention_math.mix_heads(dots, pre)
  n, m = q.shape[1], k.shape[1]
  full = None
  if mask is not None:
    full = (mask[:, None, None, :] if mask.ndim == 2 else mask[:, None])
  if causal:
    full = masks.combine(full, masks.positions_band(n, m, offset,
                                                    causal=True))
  weights = attention_math.masked_softmax(logits, full, bias)
  mixed = weights if post is None else attention_math.mix_heads(weights, post)
  return jnp.einsum("bjnm,bmjv->bnjv", mixed, v, precision="highest")


def relative_error(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


def make_case(seed, b, n, m, h_k, h, h_v, d_k, d_v, dtype, pre=True,
              post=True, mask=None, bias=None):
  rng = np.random.default_rng(seed)
  arrays = dict(
      q=(rng.normal(size=(b, n, h_k, d_k)) * d_k ** -0.5),
      k=rng.normal(size=(b, m, h_k, d_k)),
      v=rng.normal(size=(b, m, h_v, d_v)))
  arrays = {name: jnp.asarray(x, dtype) for name, x in arrays.items()}
  arrays["pre"] = (jnp.asarray(rng.normal(size=(h_k, h)) * h_k ** -0.5,
                               jnp.float32) if pre else None)
  arrays["post"] = (jnp.asarray(rng.normal(size=(h, h_v)) * h ** -0.5,
                                jnp.float32) if post else None)
  if mask == "keys":
    arrays["mask"] = jnp.asarray(rng.random((b, m)) > 0.3)
  elif mask in ("full", "full_one"):
    full = rng.random((1 if mask == "full_one" else b, n, m)) > 0.3
    full[0, 1] = False  # a fully masked row: uniform over the m keys
    arrays["mask"] = jnp.asarray(full)
  else:
    arrays["mask"] = None
  arrays["bias"] = (None if bias is None else jnp.asarray(
      rng.normal(size=(1 if bias == "one" else b, h, n, m)), jnp.float32))
  arrays["cotangent"] = jnp.asarray(rng.normal(size=(b, n, h_v, d_v)),
                                    jnp.float32)
  return arrays


# name: (b, n, m, h_k, h, h_v, d_k, d_v, dtype, options)
CASES = {
    "heads_3_4_5": (2, 20, 37, 3, 4, 5, 8, 6, "float32", {}),
    "logits_only": (2, 19, 19, 3, 2, 2, 8, 8, "float32", dict(post=False)),
    "weights_only": (2, 19, 23, 3, 3, 2, 8, 8, "float32", dict(pre=False)),
    "causal": (2, 33, 33, 2, 3, 2, 8, 8, "float32", dict(causal=True)),
    "causal_offset": (1, 5, 21, 2, 3, 2, 8, 8, "float32",
                      dict(causal=True, offset=16)),
    "key_mask": (2, 17, 30, 2, 3, 2, 8, 8, "float32", dict(mask="keys")),
    "full_mask_causal": (2, 18, 18, 2, 3, 4, 8, 8, "float32",
                         dict(mask="full", causal=True)),
    "broadcast_mask": (2, 18, 21, 2, 3, 4, 8, 8, "float32",
                       dict(mask="full_one")),
    "t5_bias_causal": (2, 20, 20, 2, 3, 2, 8, 8, "float32",
                       dict(bias="one", causal=True, tiles=SLICED)),
    "batched_bias_mask": (2, 17, 25, 2, 3, 2, 8, 8, "float32",
                          dict(bias="batched", mask="full")),
    "bfloat16": (2, 20, 37, 3, 4, 5, 16, 16, "bfloat16",
                 dict(mask="keys")),
    "float16": (2, 20, 37, 3, 4, 5, 16, 16, "float16", dict(causal=True)),
    # More than 16 heads (H = 32): every mix takes three chunks of
    # MIX_CHUNK = 8 heads, the last one partly padding.
    "heads_17_18_20": (1, 9, 21, 17, 18, 20, 4, 4, "float32",
                       dict(mask="keys")),
    # Programs per slice of the heads (`Tiles.heads_per_program`), the
    # default above 16 heads: the slices' outputs, and dbias written once.
    "sliced_heads_17_18_20": (1, 9, 21, 17, 18, 20, 4, 4, "float32",
                              dict(mask="keys", tiles=SLICED)),
    "sliced_bias_causal": (2, 20, 20, 9, 10, 11, 8, 8, "float32",
                           dict(bias="one", causal=True, tiles=SLICED)),
    "sliced_logits_only": (1, 19, 26, 9, 10, 10, 8, 8, "float32",
                           dict(post=False, tiles=SLICED)),
    "sliced_weights_only": (1, 19, 26, 17, 17, 9, 16, 16, "bfloat16",
                            dict(pre=False, tiles=SLICED)),
}


def _run_case(name):
  b, n, m, h_k, h, h_v, d_k, d_v, dtype, options = CASES[name]
  options = dict(options)
  causal, offset = options.pop("causal", False), options.pop("offset", 0)
  tiles = options.pop("tiles", TILES)
  case = make_case(sum(map(ord, name)), b, n, m, h_k, h, h_v, d_k, d_v,
                   dtype, **options)
  mask, cotangent = case["mask"], case["cotangent"]
  differentiable = ("q", "k", "v", "pre", "post", "bias")
  args = tuple(case[key] for key in differentiable)

  def loss(core, q, k, v, pre, post, bias):
    out = core(q, k, v, pre, post, mask=mask, bias=bias, causal=causal,
               offset=offset)
    return jnp.sum(out.astype(jnp.float32) * cotangent), out

  kernel = functools.partial(_kernel_core, tiles=tiles)
  grad = functools.partial(jax.value_and_grad, argnums=tuple(range(6)),
                           has_aux=True)
  (_, got), got_grads = jax.jit(grad(functools.partial(loss, kernel)))(*args)
  (_, _), want_grads = jax.jit(grad(functools.partial(loss, keras_ops_core)))(
      *(None if x is None else x.astype(jnp.float32) for x in args))
  return case, dtype, got, got_grads, want_grads, dict(
      causal=causal, offset=offset)


def _kernel_core(q, k, v, pre, post, mask=None, bias=None, causal=False,
                 offset=0, tiles=None):
  return pallas_kernel.talking_heads_attention(
      q, k, v, pre, post, mask=mask, bias=bias, causal=causal,
      causal_offset=offset, tiles=tiles, interpret=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kernel_equals_the_paper_and_its_gradients_keras_ops(name):
  case, dtype, got, got_grads, want_grads, flags = _run_case(name)
  tolerance = TOLERANCE[dtype]
  want = paper_core(*(None if x is None else np.asarray(x, np.float32)
                      for x in (case["q"], case["k"], case["v"], case["pre"],
                                case["post"])),
                    mask=case["mask"], bias=case["bias"], **flags)
  assert got.dtype == case["v"].dtype
  assert relative_error(got, want) < tolerance, relative_error(got, want)
  labels = ("dQ", "dK", "dV", "dP_l", "dP_w", "dbias")
  checked = 0
  for label, got_grad, want_grad in zip(labels, got_grads, want_grads):
    if want_grad is None:
      assert got_grad is None, label
      continue
    assert np.all(np.isfinite(np.asarray(got_grad, np.float32))), label
    error = relative_error(got_grad, want_grad)
    assert error < tolerance, (label, error)
    checked += 1
  assert checked == 3 + sum(case[key] is not None
                            for key in ("pre", "post", "bias"))


def _equations(jaxpr):
  """Every equation of `jaxpr` and of its inner jaxprs (the programs'
  bodies included)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for inner in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


def _largest_buffer(jaxpr):
  """The most elements of any value in `jaxpr` and its inner jaxprs (the
  kernel's body included)."""
  largest = 0
  for eqn in _equations(jaxpr):
    for var in list(eqn.invars) + list(eqn.outvars):
      shape = getattr(getattr(var, "aval", None), "shape", ())
      largest = max(largest, int(np.prod(shape)) if shape else 1)
  return largest


def test_the_traced_step_holds_no_score_sized_buffer():
  b, n, m, h_k, h, h_v, d = 1, 256, 256, 4, 4, 4, 16
  case = make_case(3, b, n, m, h_k, h, h_v, d, d, "float32", mask="keys")
  args = tuple(case[key] for key in ("q", "k", "v", "pre", "post"))

  def loss(core, q, k, v, pre, post):
    return jnp.sum(core(q, k, v, pre, post, mask=case["mask"], causal=True))

  kernel = functools.partial(_kernel_core, tiles=pallas_tiles.Tiles(32, 32))
  traced = jax.make_jaxpr(jax.grad(functools.partial(loss, kernel),
                                   argnums=tuple(range(5))))(*args).jaxpr
  scores = b * h * n * m
  largest = _largest_buffer(traced)
  # The largest buffers are the inputs, [b, m, h, d]; a tile is 32 x 32.
  assert largest <= b * m * h_k * d, (largest, scores)
  assert "pallas_call" in str(traced)
  # The check sees a score-sized buffer where there is one.
  plain = jax.make_jaxpr(jax.grad(functools.partial(loss, keras_ops_core),
                                  argnums=tuple(range(5))))(*args).jaxpr
  assert _largest_buffer(plain) >= scores


def test_the_kernel_lowers_to_triton_for_a_cuda_gpu():
  """Lowering runs here (no GPU needed): it catches what Pallas's Triton
  backend refuses (array sides that are not powers of two, unsupported
  operations) before a GPU machine sees the kernel."""
  shapes = dict(q=(2, 20, 3, 16), k=(2, 37, 3, 16), v=(2, 37, 5, 16),
                pre=(3, 4), post=(4, 5), bias=(1, 4, 20, 37))
  args = [jax.ShapeDtypeStruct(shape, jnp.bfloat16 if name in "qkv" else
                               jnp.float32) for name, shape in shapes.items()]
  mask = jnp.ones((2, 37), bool)

  def loss(q, k, v, pre, post, bias):
    out = pallas_kernel.talking_heads_attention(
        q, k, v, pre, post, mask=mask, bias=bias, causal=True)  # default tiles
    return jnp.sum(out.astype(jnp.float32))

  triton = "__gpu$xla.gpu.triton"
  exported = export.export(
      jax.jit(jax.grad(loss, argnums=tuple(range(6)))), platforms=["cuda"],
      disabled_checks=[export.DisabledSafetyCheck.custom_call(triton)])(*args)
  module = exported.mlir_module()
  # Forward, then the five backward programs (D and dP_w, then dP_l, per
  # query tile; dQ per query tile; dK, then dV, per key tile).
  assert module.count(triton) == 6
  for kernel in ("forward_kernel", "row_sums_kernel",
                 "logits_pair_sums_kernel", "rows_kernel",
                 "key_columns_kernel", "value_columns_kernel"):
    assert f"thattn_talking_heads_{kernel}" in module


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_every_16_bit_product_contracts_over_16_or_more(dtype):
  """A 16-bit tensor-core product takes a contraction of at least 16; a
  shorter one (the default tiles' 8 keys) came out as twice the product
  on an H200 (benchmarks/RESULTS.md), which interpret mode never shows.
  So no matrix product in any program, forward or backward, at the
  default tiles, contracts 16-bit operands over fewer than 16."""
  case = make_case(5, 1, 40, 40, 3, 4, 5, 16, 16, dtype, mask="keys")
  args = tuple(case[key] for key in ("q", "k", "v", "pre", "post"))

  def loss(q, k, v, pre, post):
    out = pallas_kernel.talking_heads_attention(q, k, v, pre, post,
                                                mask=case["mask"])
    return jnp.sum(out.astype(jnp.float32))

  traced = jax.make_jaxpr(jax.grad(loss, argnums=tuple(range(5))))(*args)
  products = [eqn for eqn in _equations(traced.jaxpr)
              if eqn.primitive.name == "dot_general"]
  assert pallas_tiles.default_tiles(5).block_k < 16 and products
  for eqn in products:
    (contract_a, _), _ = eqn.params["dimension_numbers"]
    a, b = (var.aval for var in eqn.invars)
    if a.dtype == b.dtype == jnp.float32:
      continue
    length = int(np.prod([a.shape[axis] for axis in contract_a]))
    assert length >= pallas_tiles.HALF_CONTRACTION, (a, b, eqn.params)


@pytest.mark.parametrize("kwargs, message", [
    (dict(q=(2, 5, 3, 8), k=(2, 6, 3, 4), v=(2, 6, 3, 8)),
     r"key shape \(2, 6, 3, 4\) does not match query shape"),
    (dict(pre=(2, 4)), r"P_l has shape \(2, 4\), expected \[h_k=3, h\]"),
    (dict(post=(4, 2)), r"P_w has shape \(4, 2\), expected \[h=3, h_v=3\]"),
    (dict(mask=(2, 5)), r"mask has shape \(2, 5\), expected \[2 or 1, m=6\]"),
    (dict(bias=(2, 2, 5, 6)), r"bias has shape \(2, 2, 5, 6\), expected "
     r"\[2 or 1, h=3, n=5, m=6\]"),
    (dict(causal_offset=jnp.int32(2)), "causal_offset must be a Python int"),
    (dict(dtype=jnp.int32), "must share one of float32, bfloat16, float16"),
])
def test_the_kernel_names_bad_inputs(kwargs, message):
  shapes = dict(q=(2, 5, 3, 8), k=(2, 6, 3, 8), v=(2, 6, 3, 8))
  shapes.update({key: kwargs[key] for key in ("q", "k", "v") if key in kwargs})
  dtype = kwargs.get("dtype", jnp.float32)
  q, k, v = (jnp.zeros(shapes[key], dtype) for key in ("q", "k", "v"))
  extra = {key: jnp.zeros(kwargs[key]) for key in ("pre", "post", "bias")
           if key in kwargs}
  if "mask" in kwargs:
    extra["mask"] = jnp.ones(kwargs["mask"], bool)
  if "causal_offset" in kwargs:
    extra.update(causal=True, causal_offset=kwargs["causal_offset"])
  with pytest.raises(ValueError, match=message):
    pallas_kernel.talking_heads_attention(q, k, v, interpret=True, **extra)


@pytest.mark.parametrize("value", [0, 12, "32"])
def test_tiles_must_be_powers_of_two(value):
  with pytest.raises(ValueError, match=rf"block_q={value!r}, expected a "
                     "power of two"):
    pallas_tiles.Tiles(block_q=value)


@pytest.mark.parametrize("value", [0, 12, True, "16"])
def test_heads_per_program_must_be_whole_chunks(value):
  with pytest.raises(ValueError, match=rf"heads_per_program={value!r}, "
                     "expected None or a positive multiple of 8"):
    pallas_tiles.Tiles(heads_per_program=value)
  assert pallas_tiles.Tiles(heads_per_program=24).heads_per_program == 24


# ---- through the Keras 3 layer ---------------------------------------------


def _layer_pair(**kwargs):
  kernel = keras3.TalkingHeadsAttention(3, 4, fused_kernel=True, **kwargs)
  plain = keras3.TalkingHeadsAttention(3, 4, fused_kernel=False, **kwargs)
  return kernel, plain


@pytest.mark.parametrize("kwargs", [
    dict(num_key_heads=2, value_dim=5, num_value_heads=4),
    dict(num_key_heads=2, project_weights=False),
    dict(num_value_heads=2, project_logits=False),
])
@pytest.mark.parametrize("memory", ["self", "cross"])
def test_the_layer_runs_the_kernel_and_equals_the_paper(kwargs, memory):
  rng = np.random.default_rng(7)
  self_attention = memory == "self"
  n, m = 9, 9 if self_attention else 13
  x, mem = ref.make_inputs(rng, 2, n, m, 8, 8 if self_attention else 6,
                           self_attention)
  kind = "random_and_causal" if self_attention else "random"
  layer_mask, causal, ref_mask = ref.make_masks(rng, kind, 2, n, m)
  kernel, _ = _layer_pair(**kwargs)
  kernel(x.astype("float32"), mem.astype("float32"))
  # The weights as numpy_reference reads a layer's (names with the path).
  holder = types.SimpleNamespace(weights=[types.SimpleNamespace(
      name=v.path, shape=tuple(v.shape),
      numpy=lambda v=v: np.asarray(v.value), assign=v.assign)
                                          for v in kernel.weights])
  ref.randomize_weights(holder, rng)
  got = kernel(x.astype("float32"), mem.astype("float32"),
               attention_mask=layer_mask, use_causal_mask=causal)
  want = ref.talking_heads_attention(x, mem, mask=ref_mask,
                                     **ref.reference_kwargs(holder))
  ref.assert_close(np.asarray(got), want)
  traced = jax.make_jaxpr(lambda x, m: kernel(x, m, attention_mask=layer_mask,
                                              use_causal_mask=causal))(
                                                  x.astype("float32"),
                                                  mem.astype("float32"))
  assert "pallas_call" in str(traced)


def test_the_layer_kernel_trains_under_jit_like_keras_ops():
  kernel, plain = _layer_pair(num_key_heads=2, num_value_heads=4)
  rng = np.random.default_rng(2)
  x = rng.normal(size=(2, 11, 8)).astype("float32")
  mask = rng.random((2, 11, 11)) > 0.3
  kernel(x, x)
  plain(x, x)
  plain.set_weights(kernel.get_weights())
  cotangent = rng.normal(size=(2, 11, 8))

  def step(layer):
    def loss(trainable, x):
      y, _ = layer.stateless_call(trainable, [], x, x, attention_mask=mask,
                                  use_causal_mask=True)
      return (y * cotangent).sum()
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  weights = [v.value for v in kernel.trainable_variables]
  (got, got_grads), (want, want_grads) = (step(kernel)(weights, x),
                                          step(plain)(weights, x))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    assert relative_error(g, w) < 1e-5


def test_keras_masks_and_a_position_bias_reach_the_kernel():
  tokens = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]])
  embed = keras.layers.Embedding(10, 8, mask_zero=True)
  bias_layer = keras3.RelativePositionBias(num_heads=3, bidirectional=False,
                                           num_buckets=8)
  kernel, plain = _layer_pair()
  x = embed(tokens)
  bias = bias_layer(query_length=5, memory_length=5)
  kernel(x, x)
  plain(x, x)
  plain.set_weights(kernel.get_weights())
  got = kernel(x, x, position_bias=bias, use_causal_mask=True)
  want = plain(x, x, position_bias=bias, use_causal_mask=True)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("kwargs, call, reason", [
    (dict(dynamic_projections=("x2l",)), {}, "has no dynamic projections"),
    (dict(num_head_groups=2, num_key_heads=2, num_value_heads=2), {},
     "has no head groups"),
    ({}, dict(return_attention_scores=True), "return_attention_scores asks"),
    (dict(dropout=0.5), dict(training=True), "has no attention dropout"),
])
def test_fused_kernel_true_names_what_stops_the_pallas_kernel(kwargs, call,
                                                              reason):
  layer = keras3.TalkingHeadsAttention(2, 4, fused_kernel=True, **kwargs)
  x = np.zeros((1, 3, 8), "float32")
  with pytest.raises(ValueError, match=f"fused_kernel=True, but .*{reason}"):
    layer(x, x, **call)
  # fused_kernel=None takes keras.ops (or a CPU kernel) instead.
  keras3.TalkingHeadsAttention(2, 4, **kwargs)(x, x, **call)


def test_decoding_steps_use_keras_ops_and_equal_the_full_pass():
  layer = keras3.TalkingHeadsAttention(3, 4, num_key_heads=2)
  x = np.random.default_rng(4).normal(size=(2, 6, 8)).astype("float32")
  full = np.asarray(layer(x, x, use_causal_mask=True))
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(6):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache,
                     decode_step=jnp.int32(t))
    steps.append(np.asarray(y))
  np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-5,
                             atol=1e-6)


def test_an_unknown_thattn_pallas_setting_is_named(monkeypatch):
  monkeypatch.setenv("THATTN_PALLAS", "gpu")
  layer = keras3.TalkingHeadsAttention(2, 4)
  x = np.zeros((1, 3, 8), "float32")
  with pytest.raises(ValueError, match="THATTN_PALLAS='gpu': expected unset, "
                     "'interpret'"):
    layer(x, x)
