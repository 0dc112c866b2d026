"""What thattn's Keras 3 models run on a GPU, checked on a CPU (JAX).

Run by gpu_paths_test.py with KERAS_BACKEND=jax. Three fixes measured on
an H200 (benchmarks/RESULTS.md, "Keras 3 models on a GPU") are held here
so they cannot come back unseen:

- multi-head attention reaches cuDNN for the masks models use: thattn's
  conditions (`thattn.kernels.cudnn.obstacle`) against the ones JAX's cuDNN
  path checks, and every attention call of a BERT and a T5 passing them,
  computed through the same key lengths with XLA here; traced through
  JAX's real cuDNN primitives, their gradients hold nothing [b, h, n, m]
  (found on a CPU, not yet measured on a GPU), and BERT's no branch;
- no bfloat16 scatter-add and no scatter into a small table in a model's
  gradient (the lowered step's HLO, before XLA's CPU passes upcast it);
- the default talking-heads path on a GPU is keras.ops unless measured
  slower or too big (`thattn.kernels.kernel_choice`).
"""

import inspect

import jax
from jax._src.cudnn import fused_attention_stablehlo as jax_cudnn
import jax.numpy as jnp
import keras
import numpy as np
import pytest

from thattn.kernels import cudnn
from thattn.kernels import dispatch
from thattn.kernels import kernel_choice
from thattn.keras3 import lookups
from thattn.keras3 import models
from thattn.kernels import pallas_kernel
from thattn.keras3 import relative_position
from thattn.keras3.models import embeddings
from thattn.training import keras3_steps
from thattn.keras3 import attention_math

TINY_BERT = dict(vocab_size=50, d_model=32, num_layers=2, d_ff=64,
                 num_heads=4, dropout_rate=0.0, max_position_embeddings=32)
TINY_T5 = dict(vocab_size=50, d_model=32, num_layers=2, d_ff=64,
               num_heads=4, dropout_rate=0.0)


@pytest.fixture
def mixed_bfloat16():
  with keras3_steps.dtype_policy("bfloat16"):  # as --mixed_precision sets it
    yield


def _spec(shape, dtype):
  return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


def _jax_accepts(query, key, value, bias, lengths):
  """Whether JAX's cuDNN path would build this call (bf16/f16, pre-Hopper
  head sizes: on a CPU its capability checks read "not Hopper")."""
  layout = jax_cudnn._normalize_layout("BTNH")  # pylint: disable=protected-access
  extra = {name: None for name in inspect.signature(
      jax_cudnn.check_layout).parameters
           if name not in ("query", "key", "value", "bias", "layout",
                           "q_seqlen", "kv_seqlen")}
  try:
    jax_cudnn.check_layout(query, key, value, bias, lengths, lengths,
                           layout=layout, **extra)
    jax_cudnn.check_is_flash_attention(
        query, key, value, layout.value, cudnn_version=91000,
        has_bias=bias is not None, is_training=True)
  except (ValueError, NotImplementedError):
    return False
  return True


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("head_dim", [64, 60, 136])
@pytest.mark.parametrize("bias", [None, "full", "per key"])
@pytest.mark.parametrize("lengths", [(64, 64), (63, 64)])
@pytest.mark.parametrize("key_mask", [False, True])
def test_thattn_refuses_what_jax_s_cudnn_checks_refuse(dtype, head_dim, bias,
                                                       lengths, key_mask):
  batch, heads = 2, 4
  n, m = lengths
  query = _spec((batch, n, heads, head_dim), dtype)
  key = value = _spec((batch, m, heads, head_dim), dtype)
  bias_spec = {None: None, "full": _spec((1, heads, n, m), dtype),
               "per key": _spec((batch, 1, 1, m), dtype)}[bias]
  mask = _spec((batch, 1, 1, m), "bool") if key_mask else None
  ours = cudnn.obstacle(query, key, value, bias_spec, mask, None,
                        head_dim_limit=128)
  lengths_spec = _spec((batch,), "int32") if key_mask else None
  assert (ours is None) == _jax_accepts(query, key, value, bias_spec,
                                        lengths_spec), ours


def test_masks_cudnn_cannot_take_as_lengths_are_refused_by_name():
  query = key = value = _spec((2, 8, 4, 64), "bfloat16")
  per_query = _spec((2, 1, 8, 8), "bool")
  assert "key mask" in cudnn.obstacle(query, key, value, mask=per_query)
  assert "offset" in cudnn.obstacle(query, key, value, causal_offset=3)
  assert cudnn.obstacle(query, key, value, causal_offset=0) is None


def _random(shape, seed, dtype="float32"):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), dtype)


@pytest.mark.parametrize("case", [
    "prefix", "hole", "empty row", "holes, empty row", "batch-1", "causal",
    "bias", "hole, causal", "hole, bias", "empty row, bias"])
def test_key_lengths_compute_what_the_mask_says(case):
  """The lengths cuDNN gets, with the allowed keys moved first (no causal
  mask or bias), or the check that sends a mask that is not a prefix (or a
  row with no key) to the mask itself: computed here with XLA, values and
  gradients against jax.nn.dot_product_attention of the mask."""
  batch, n, heads, d = 3, 12, 2, 8
  query, key, value = (_random((batch, n, heads, d), seed)
                       for seed in range(3))
  lengths = np.array([12, 7, 3])
  mask = np.arange(n)[None] < lengths[:, None]
  bias, causal = None, None
  parts = case.split(", ")
  if "hole" in parts:
    mask[1, 2] = False
  if "holes" in parts:
    mask[0, [0, 5, 6, 11]] = False
    mask[1, 2] = False
  if "empty row" in parts:
    mask[2] = False
  if "batch-1" in parts:
    mask = mask[:1]
  if "causal" in parts:
    causal = 0
  if "bias" in parts:
    bias = _random((1, heads, n, n), 4)
  mask = jnp.asarray(mask[:, None, None, :])
  weights = _random((batch, n, heads, d), 5)

  def ours(*qkv):
    return cudnn.attention(*qkv, bias, mask, causal, implementation="xla")

  def reference(*qkv):
    return jax.nn.dot_product_attention(*qkv, bias=bias, mask=mask,
                                        scale=1.0,
                                        is_causal=causal is not None)

  # Values and gradients (through either branch of the prefix check).
  for fn in (lambda f: f, lambda f: jax.grad(
      lambda *qkv: jnp.sum(weights * f(*qkv)), argnums=(0, 1, 2))):
    np.testing.assert_allclose(
        np.concatenate([np.ravel(x) for x in
                        jax.tree.leaves(fn(ours)(query, key, value))]),
        np.concatenate([np.ravel(x) for x in
                        jax.tree.leaves(fn(reference)(query, key, value))]),
        rtol=1e-5, atol=1e-6)


@pytest.fixture
def cudnn_calls(monkeypatch):
  """thattn's layers as on an NVIDIA GPU: cuDNN's calls recorded, checked
  against JAX's conditions, and computed by XLA from the same lengths."""
  calls = []
  real_attention = cudnn.attention

  def attention(query, key, value, bias=None, mask=None, causal_offset=None):
    lengths = None if mask is None else _spec((query.shape[0],), "int32")
    calls.append(dict(
        shapes=(query.shape, key.shape), mask=mask is not None,
        bias=bias is not None, causal=causal_offset is not None,
        accepted=_jax_accepts(
            query, key, value,
            None if bias is None else _spec(bias.shape, query.dtype),
            lengths)))
    return real_attention(query, key, value, bias, mask, causal_offset,
                          implementation="xla")

  monkeypatch.setattr(cudnn, "available", lambda: True)
  monkeypatch.setattr(dispatch, "on_accelerator", lambda: True)
  monkeypatch.setattr(cudnn, "max_head_dim", lambda: 256)
  monkeypatch.setattr(cudnn, "attention", attention)
  return calls


def _bert_inputs(batch=2, length=8):
  lengths = np.array([length, length // 2, length - 1])[:batch]
  mask = (np.arange(length)[None] < lengths[:, None]).astype("int32")
  rng = np.random.default_rng(0)
  return {"input_word_ids": rng.integers(1, 50, (batch, length)) * mask,
          "input_mask": mask,
          "input_type_ids": (np.arange(length)[None] >= 3).astype("int32")}


def test_every_bert_and_t5_attention_call_goes_to_cudnn(mixed_bfloat16,
                                                        cudnn_calls):
  """BERT's padding mask, T5's padding, causal mask and position bias: each
  attention call of the models passes thattn's and JAX's conditions, and
  the outputs are the keras.ops core's."""
  del mixed_bfloat16
  bert = models.create_model("bert_base", **TINY_BERT)
  inputs = _bert_inputs()
  fast = bert(inputs)["sequence_output"]
  assert len(cudnn_calls) == 2, cudnn_calls  # one per block
  assert all(call["accepted"] and call["mask"] for call in cudnn_calls)
  for layer in bert.layers:
    if hasattr(layer, "attention"):
      layer.attention.flash_attention = False
  core = bert(inputs)["sequence_output"]
  np.testing.assert_allclose(np.asarray(fast, "float32"),
                             np.asarray(core, "float32"), atol=2e-2)

  del cudnn_calls[:]
  t5 = models.create_model("t5_base", **TINY_T5)
  tokens = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], "int32")
  t5({"encoder_input_tokens": tokens, "decoder_input_tokens": tokens})
  # 2 encoder self, 2 decoder self (causal + bias), 2 cross-attention.
  assert len(cudnn_calls) == 6, cudnn_calls
  assert all(call["accepted"] for call in cudnn_calls), cudnn_calls
  assert sum(call["causal"] and call["bias"] for call in cudnn_calls) == 2


def _scatters(fn, *args):
  """The result shapes of the scatters in `fn`'s lowered HLO (JAX's
  gradient as written, before a backend's passes)."""
  text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
  return [line.split("=", 1)[1].split()[0].split("{")[0]
          for line in text.splitlines() if " scatter(" in line]


def _gradient_of(model, inputs, output):
  def loss(trainable, non_trainable):
    outputs, _ = model.stateless_call(trainable, non_trainable, inputs)
    value = outputs if output is None else outputs[output]
    return jnp.mean(jnp.square(value.astype("float32")))
  return jax.grad(loss), ([v.value for v in model.trainable_variables],
                          [v.value for v in model.non_trainable_variables])


def test_mixed_precision_gradients_scatter_only_into_the_float32_word_table(
    mixed_bfloat16):
  """Under mixed_bfloat16 the embedding tables are read in float32, so the
  word table's gradient is a float32 scatter-add (a bfloat16 one cost 75 ms
  of an H200 step), and the token types and T5's position buckets are
  looked up by selection, with no scatter at all (2 and 32 rows that every
  position hits: 139 ms as a bfloat16 scatter)."""
  del mixed_bfloat16
  bert = models.create_model("bert_base", **TINY_BERT)
  grad, args = _gradient_of(bert, {k: jnp.asarray(v) for k, v in
                                   _bert_inputs().items()}, "sequence_output")
  assert _scatters(grad, *args) == ["f32[50,32]"]
  t5 = models.create_model("t5_base", **TINY_T5)
  tokens = jnp.asarray(np.array([[5, 6, 7, 0], [9, 10, 11, 12]], "int32"))
  grad, args = _gradient_of(t5, {"encoder_input_tokens": tokens,
                                 "decoder_input_tokens": tokens}, None)
  assert set(_scatters(grad, *args)) == {"f32[50,32]"}


@pytest.fixture
def traced_on_cudnn(monkeypatch):
  """thattn's layers as on an NVIDIA GPU, calling JAX's real cuDNN
  attention: a CPU can trace those calls (make_jaxpr) but not compile
  them, so JAX's cuDNN version check is answered as on a GPU."""
  monkeypatch.setattr(jax_cudnn, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(cudnn, "available", lambda: True)
  monkeypatch.setattr(dispatch, "on_accelerator", lambda: True)
  monkeypatch.setattr(cudnn, "max_head_dim", lambda: 256)


def _equations(jaxpr):
  """Every equation of a jaxpr, nested ones included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


def test_the_cudnn_path_keeps_no_score_sized_value_between_the_passes(
    mixed_bfloat16, traced_on_cudnn):
  """Memory flat in n x m on cuDNN: no value of a BERT's or T5's gradient
  (outside the fallback's own recomputation) has the batch, a query and a
  key axis. The fallback for masks that are not prefixes used to leave its
  residuals (11 bytes per score: a mask, two float32 and one bfloat16
  [b, h, n, m]) in the forward cond's outputs, written as zeros by the
  cuDNN branch and kept for the backward: 1.1 GB a layer at BERT-base,
  batch 32, n = 512. BERT's padding takes no branch at all (its keys are
  reordered instead), and reordering adds no scatter to the gradient."""
  del mixed_bfloat16, traced_on_cudnn
  batch, length = 3, 12

  def traced(grad, args):
    jaxpr = jax.make_jaxpr(grad)(*args).jaxpr
    names = {eqn.primitive.name for eqn in _equations(jaxpr)}
    assert "dot_product_attention_fwd_wrapper" in names
    score_sized = [str(var.aval) for eqn in jaxpr.eqns for var in eqn.outvars
                   if list(var.aval.shape).count(length) >= 2 and
                   batch in var.aval.shape]
    scatters = [str(var.aval) for eqn in _equations(jaxpr)
                if "scatter" in eqn.primitive.name for var in eqn.outvars]
    return score_sized, names, scatters

  bert = models.create_model("bert_base", **TINY_BERT)
  inputs = {k: jnp.asarray(v) for k, v in _bert_inputs(batch, length).items()}
  score_sized, names, scatters = traced(
      *_gradient_of(bert, inputs, "sequence_output"))
  assert not score_sized
  assert "cond" not in names
  assert scatters == ["float32[50,32]"]  # the word table's gradient
  t5 = models.create_model("t5_base", **TINY_T5)
  tokens = np.ones((batch, length), "int32")
  tokens[0, 7:] = 0
  tokens = jnp.asarray(tokens)
  score_sized, names, _ = traced(*_gradient_of(
      t5, {"encoder_input_tokens": tokens, "decoder_input_tokens": tokens},
      None))
  assert not score_sized
  assert "cond" in names  # the encoder's padding with T5's position bias


@pytest.mark.parametrize("rows,dtype", [(2, "float32"), (16, "bfloat16"),
                                        (32, "float32")])
def test_selection_looks_up_what_a_gather_does(rows, dtype):
  table = _random((rows, 3, 5), 0, dtype)
  ids = jnp.asarray(np.random.default_rng(1).integers(0, rows, (4, 7)))
  np.testing.assert_array_equal(lookups.select_rows(table, ids),
                                jnp.take(table, ids, axis=0))
  assert (lookups.lookup(table, ids).shape == (4, 7, 3, 5))


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("n,m,offset", [(5, 7, 0), (1, 9, 4), (7, 3, 0),
                                        (1, 1, 0), (30, 30, 0)])
def test_the_toeplitz_position_bias_equals_a_gather_of_buckets(
    bidirectional, n, m, offset):
  layer = relative_position.RelativePositionBias(
      3, bidirectional=bidirectional, num_buckets=8, max_distance=20)
  layer.build()
  table = np.asarray(layer.embeddings.value)
  got = layer(query_length=n, memory_length=m, query_offset=offset)
  distance = np.arange(m)[None] - (np.arange(n)[:, None] + offset)
  buckets = np.asarray(attention_math.relative_position_bucket(
      jnp.asarray(distance, "int32"), bidirectional, 8, 20))
  np.testing.assert_array_equal(
      got, table[buckets].transpose(2, 0, 1)[None])


def test_the_default_talking_heads_path_is_keras_ops_unless_measured_slower():
  measured = kernel_choice.MEASUREMENTS
  # Every measurement so far: keras.ops faster where both ran.
  assert not any(kernel_choice.kernel_measured_faster(
      "NVIDIA H200", h, n) for h in (12, 24) for n in (512, 4096, 16384))
  faster = measured + (kernel_choice.Measurement("NVIDIA H200", 48, 2048,
                                                 10.0, 5.0),)
  assert kernel_choice.kernel_measured_faster("NVIDIA H200", 48, 1024,
                                              faster)
  assert not kernel_choice.kernel_measured_faster("NVIDIA H100", 48, 1024,
                                                  faster)
  # The memory rule reproduces what ran and what ran out on the H200
  # (139 GiB): h = 12 at n = 16384 ran in 42 GiB, h = 24 did not fit.
  h200 = 139 * 2**30
  assert kernel_choice.keras_ops_fits(1, 12, 16384, 16384, h200)
  assert not kernel_choice.keras_ops_fits(1, 24, 16384, 16384, h200)


def test_on_a_gpu_the_layer_takes_keras_ops_by_default(monkeypatch):
  """With pallas_mode() reading "gpu", fused_kernel=None computes the core
  with keras.ops (no measurement here says the kernel is faster), and
  fused_kernel=True still runs the kernel."""
  from thattn import keras3  # pylint: disable=g-import-not-at-top
  kernel_calls = []
  real_kernel = pallas_kernel.talking_heads_attention

  def kernel(*args, **kwargs):
    kernel_calls.append(kwargs)
    return real_kernel(*args, **{**kwargs, "interpret": True})

  monkeypatch.setattr(dispatch, "pallas_mode", lambda: "gpu")
  monkeypatch.setattr(pallas_kernel, "talking_heads_attention", kernel)
  x = _random((2, 6, 8), 5)
  default = keras3.TalkingHeadsAttention(2, 4, name="default")
  forced = keras3.TalkingHeadsAttention(2, 4, fused_kernel=True,
                                        name="forced")
  default(x, x)
  assert not kernel_calls
  forced.build(x.shape, x.shape)
  forced.set_weights(default.get_weights())
  np.testing.assert_allclose(forced(x, x), default(x, x), atol=1e-5)
  assert len(kernel_calls) == 1


def test_embedding_tables_are_read_in_float32_under_mixed_bfloat16(
    mixed_bfloat16):
  del mixed_bfloat16
  table = embeddings.TokenEmbedding(2, 4)
  table.build()
  ids = jnp.asarray([[0, 1, 1]])
  with keras.src.backend.AutocastScope("bfloat16"):
    np.testing.assert_array_equal(
        table(ids), np.asarray(table.embeddings.numpy()[[0, 1, 1]][None],
                               "float32").astype("bfloat16"))
    assert table.embeddings.value.dtype == jnp.float32
