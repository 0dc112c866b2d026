"""thattn.keras3 on one Keras 3 backend: the checks `backends_test.py` runs.

Run by `backends_test.py` in a fresh process per backend (KERAS_BACKEND is
fixed at import), not collected on its own. Every variant is compared with
the float64 NumPy transcription of the paper (tests/layers/numpy_reference.py).
"""

import os
import types

import keras
from keras import ops
import numpy as np
import pytest

from thattn import keras3
from thattn.ops import rotary
from tests.layers import family_reference
from tests.layers import numpy_reference as ref

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)


def _numpy(tensor):
  return np.asarray(ops.convert_to_numpy(tensor))


def _as_reference_variable(variable):
  """A Keras 3 variable as numpy_reference reads one (name with its path)."""
  return types.SimpleNamespace(
      name=variable.path, shape=tuple(variable.shape),
      numpy=lambda: _numpy(variable.value),
      assign=variable.assign)


def _reference_weights(layer, rng=None):
  """Random weights of ordinary size, as float64 reference arguments."""
  wrapped = types.SimpleNamespace(
      weights=[_as_reference_variable(v) for v in layer.weights])
  if rng is not None:
    ref.randomize_weights(wrapped, rng)
  return ref.reference_kwargs(wrapped)


VARIANTS = {
    "multi_head": (lambda: keras3.MultiHeadAttention(3, 4, value_dim=5),
                   ref.multi_head_attention),
    "talking_heads_2_3_4": (
        lambda: keras3.TalkingHeadsAttention(3, 4, value_dim=5,
                                             num_key_heads=2,
                                             num_value_heads=4),
        ref.talking_heads_attention),
    "logits_only": (
        lambda: keras3.TalkingHeadsAttention(3, 4, num_key_heads=2,
                                             project_weights=False),
        ref.talking_heads_attention),
    "weights_only": (
        lambda: keras3.TalkingHeadsAttention(3, 4, num_value_heads=2,
                                             project_logits=False),
        ref.talking_heads_attention),
    "dynamic_all": (
        lambda: keras3.TalkingHeadsAttention(
            3, 4, num_key_heads=2, num_value_heads=4,
            dynamic_projections=keras3.DYNAMIC_PROJECTIONS),
        ref.talking_heads_attention_with_dynamic_projections),
    "grouped_dynamic": (
        lambda: keras3.TalkingHeadsAttention(
            4, 4, num_key_heads=2, num_value_heads=6, num_head_groups=2,
            dynamic_projections=["m2l", "x2w"]),
        ref.grouped_talking_heads_attention),
    "general_bilinear": (lambda: keras3.GeneralBilinearAttention(3),
                         ref.general_bilinear_attention),
}
for _name in keras3.DYNAMIC_PROJECTIONS:
  VARIANTS[f"dynamic_{_name}"] = (
      lambda name=_name: keras3.TalkingHeadsAttention(
          3, 4, num_key_heads=2, num_value_heads=4,
          dynamic_projections=[name]),
      ref.talking_heads_attention_with_dynamic_projections)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("memory", ["self", "cross"])
def test_every_variant_equals_the_paper(variant, masked, memory):
  make_layer, reference = VARIANTS[variant]
  rng = np.random.default_rng(1)
  self_attention = memory == "self"
  n, m, d_x = 5, 5 if self_attention else 7, 8
  d_m = d_x if self_attention else 6
  x, mem = ref.make_inputs(rng, 2, n, m, d_x, d_m, self_attention)
  # A random mask, and the causal one too for self-attention.
  kind = ("none" if not masked else
          "random_and_causal" if self_attention else "random")
  layer_mask, causal, ref_mask = ref.make_masks(rng, kind, 2, n, m)
  layer = make_layer()
  layer(x.astype("float32"), mem.astype("float32"))
  weights = _reference_weights(layer, rng)
  got, scores = layer(x.astype("float32"), mem.astype("float32"),
                      attention_mask=layer_mask, use_causal_mask=causal,
                      return_attention_scores=True)
  want, want_scores = reference(x, mem, mask=ref_mask, return_weights=True,
                                **weights)
  ref.assert_close(_numpy(got), want)
  ref.assert_close(_numpy(scores), want_scores)


def test_identity_projections_give_multi_head_attention():
  x = RNG.normal(size=(2, 5, 8)).astype("float32")
  multi = keras3.MultiHeadAttention(3, 4)
  talking = keras3.TalkingHeadsAttention(3, 4)
  multi(x, x)
  talking(x, x)
  talking.set_weights([np.eye(3), np.eye(3)] + multi.get_weights())
  np.testing.assert_allclose(_numpy(talking(x, x, use_causal_mask=True)),
                             _numpy(multi(x, x, use_causal_mask=True)),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bool", "float32", "int32"])
def test_numeric_and_implicit_masks(dtype):
  x = RNG.normal(size=(2, 5, 8)).astype("float32")
  layer = keras3.TalkingHeadsAttention(3, 4, num_value_heads=2)
  mask = RNG.random((2, 5, 5)) > 0.3
  mask[:, :, 0] = True
  want = _numpy(layer(x, x, attention_mask=mask))
  np.testing.assert_array_equal(
      _numpy(layer(x, x, attention_mask=mask.astype(dtype))), want)
  # Keras implicit masks: padding tokens (id 0) of an Embedding(mask_zero).
  tokens = keras.Input((5,), dtype="int32")
  embedded = keras.layers.Embedding(10, 8, mask_zero=True)(tokens)
  attention = keras3.MultiHeadAttention(2, 4)
  model = keras.Model(tokens, attention(embedded, embedded))
  ids = np.array([[3, 4, 5, 0, 0], [1, 2, 3, 4, 5]], "int32")
  valid = ids != 0
  explicit = valid[:, :, None] & valid[:, None, :]
  embedding = model.layers[1]
  direct = attention(embedding(ids), embedding(ids), attention_mask=explicit)
  np.testing.assert_allclose(_numpy(model(ids)), _numpy(direct), rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("variant", ["talking_heads_2_3_4", "dynamic_all",
                                     "grouped_dynamic", "general_bilinear"])
def test_cached_decoding_equals_the_causal_pass(variant):
  layer = VARIANTS[variant][0]()
  x = RNG.normal(size=(2, 6, 8)).astype("float32")
  full = _numpy(layer(x, x, use_causal_mask=True))
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(6):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache, decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5,
                             atol=1e-5)
  # Cross-attention: the memory projected once.
  memory = RNG.normal(size=(2, 4, 8)).astype("float32")
  cross = _numpy(layer(x, memory))
  cache = layer.memory_cache(memory)
  y, _ = layer(x, None, cache=cache)
  np.testing.assert_allclose(_numpy(y), cross, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_half_precision_is_finite_on_fully_masked_rows(policy):
  if BACKEND == "torch" and policy == "mixed_float16":
    pytest.skip("torch's CPU einsum has no float16 kernels")
  x = RNG.normal(size=(2, 5, 8)).astype("float32")
  mask = np.ones((2, 5, 5), bool)
  mask[0, 2] = False  # one query may attend nothing
  for layer in (keras3.TalkingHeadsAttention(3, 4,
                                             dynamic_projections=["x2l"],
                                             dtype=policy),
                keras3.DynamicallyComposableAttention(
                    2, 4, static_mix=True, query_key_norm_epsilon=1e-6,
                    dtype=policy)):
    y = _numpy(layer(x, x, attention_mask=mask)).astype("float32")
    assert np.isfinite(y).all(), layer.name


def test_keras_file_round_trip(tmp_path):
  model, inputs = functional_model()
  path = tmp_path / "model.keras"
  model.save(path)
  loaded = keras.models.load_model(path)
  np.testing.assert_array_equal(_numpy(loaded(inputs)), _numpy(model(inputs)))
  assert isinstance(loaded.get_layer("talking"),
                    keras3.TalkingHeadsAttention)


def functional_model():
  """A functional model of every layer kind, and fixed inputs for it."""
  query = keras.Input((6, 8), name="query")
  memory = keras.Input((5, 8), name="memory")
  y = keras3.TalkingHeadsAttention(
      3, 4, num_key_heads=2, dynamic_projections=["m2w"], num_head_groups=1,
      name="talking")(query, memory)
  y = keras3.MultiHeadAttention(2, 4, use_bias=True, name="multi")(y, memory)
  y = keras3.GeneralBilinearAttention(2, name="bilinear")(y, memory)
  y = keras3.DynamicallyComposableAttention(2, 4, name="dcmha")(y, memory)
  rng = np.random.default_rng(3)
  inputs = [rng.normal(size=(2, 6, 8)).astype("float32"),
            rng.normal(size=(2, 5, 8)).astype("float32")]
  return keras.Model([query, memory], y), inputs


def test_save_for_other_backends():
  """Writes a model and its outputs for `test_load_from_other_backends`."""
  folder = os.environ.get("THATTN_KERAS3_EXCHANGE")
  if not folder:
    pytest.skip("run by backends_test.py")
  model, inputs = functional_model()
  model.save(os.path.join(folder, f"{BACKEND}.keras"))
  np.save(os.path.join(folder, f"{BACKEND}.npy"), _numpy(model(inputs)))


def test_load_from_other_backends():
  folder = os.environ.get("THATTN_KERAS3_EXCHANGE")
  if not folder:
    pytest.skip("run by backends_test.py")
  _, inputs = functional_model()
  others = [name[:-len(".keras")] for name in os.listdir(folder)
            if name.endswith(".keras") and not name.startswith(BACKEND)]
  if not others:
    pytest.skip("no other backend has saved a model yet")
  for other in others:
    loaded = keras.models.load_model(os.path.join(folder, f"{other}.keras"))
    np.testing.assert_allclose(
        _numpy(loaded(inputs)), np.load(os.path.join(folder, f"{other}.npy")),
        rtol=1e-5, atol=1e-5, err_msg=f"saved on {other}")


def test_config_round_trip_and_tf_keras_names():
  layer = keras3.TalkingHeadsAttention(
      3, 4, num_key_heads=2, dropout_rate=0.1, output_dim=6,
      kernel_regularizer="l2")
  config = layer.get_config()
  assert (config["dropout"], config["output_shape"]) == (0.1, 6)
  clone = keras3.TalkingHeadsAttention.from_config(config)
  assert clone.get_config() == config
  with pytest.raises(ValueError, match="query_chunk_size=8 is a thattn.layers"):
    keras3.TalkingHeadsAttention(3, 4, query_chunk_size=8)
  with pytest.raises(ValueError, match="num_head_groups=2 must divide"):
    keras3.TalkingHeadsAttention(3, 4, num_head_groups=2)


def test_fused_kernel_true_names_what_stops_it():
  layer = keras3.TalkingHeadsAttention(2, 4, fused_kernel=True)
  x = RNG.normal(size=(1, 3, 8)).astype("float32")
  if BACKEND in ("tensorflow", "jax"):
    layer(x, x)  # the kernel runs (compiled on first use)
    return
  with pytest.raises(ValueError, match=rf"fused_kernel=True, but the fused "
                     rf"kernels run on the TensorFlow and JAX backends and "
                     rf"the Keras backend is {BACKEND}"):
    layer(x, x)


def _jax_step(layer, x, mask):
  """jit(grad) of sum(Y * cotangent) for the input and every weight."""
  import jax  # pylint: disable=g-import-not-at-top
  cotangent = np.random.default_rng(5).normal(
      size=(x.shape[0], x.shape[1], layer._output_dense.kernel.shape[-1]))  # pylint: disable=protected-access

  def loss(trainable, x):
    y, _ = layer.stateless_call(trainable, [], x, x, attention_mask=mask)
    return (y * cotangent).sum()

  trainable = [v.value for v in layer.trainable_variables]
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), trainable


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA FFI kernel is JAX's")
def test_the_jax_kernel_runs_in_jit_and_equals_keras_ops():
  import jax  # pylint: disable=g-import-not-at-top
  x = RNG.normal(size=(2, 9, 8)).astype("float32")
  mask = RNG.random((2, 9, 9)) > 0.3
  mask[0, 4] = False  # a fully masked row
  fused = keras3.TalkingHeadsAttention(3, 4, num_key_heads=2,
                                       num_value_heads=5)
  plain = keras3.TalkingHeadsAttention(3, 4, num_key_heads=2,
                                       num_value_heads=5, fused_kernel=False)
  fused(x, x)
  plain(x, x)
  plain.set_weights(fused.get_weights())
  fused_step, weights = _jax_step(fused, x, mask)
  plain_step, _ = _jax_step(plain, x, mask)
  # The kernel's custom call is in the traced step; the plain path's is not.
  assert "thattn_talking_heads_softmax" in str(
      jax.make_jaxpr(fused_step)(weights, x))
  assert "thattn_talking_heads_softmax" not in str(
      jax.make_jaxpr(plain_step)(weights, x))
  (got_loss, got_grads), (want_loss, want_grads) = (
      fused_step(weights, x), plain_step(weights, x))
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4,
                               atol=1e-5 * np.abs(want).max())


@pytest.mark.skipif(BACKEND != "jax", reason="the XLA FFI kernel is JAX's")
@pytest.mark.parametrize("kwargs, reason", [
    (dict(num_head_groups=2, num_key_heads=2, num_value_heads=2),
     "has no grouped heads"),
    (dict(dynamic_projections=("x2l",)), "has no dynamic projections"),
    (dict(project_logits=False), "needs both P_l and P_w"),
])
def test_the_jax_kernel_names_what_it_cannot_do(kwargs, reason):
  layer = keras3.TalkingHeadsAttention(2, 4, fused_kernel=True, **kwargs)
  x = RNG.normal(size=(1, 3, 8)).astype("float32")
  with pytest.raises(ValueError, match=f"the JAX kernel {reason}"):
    layer(x, x)


@pytest.mark.parametrize("key_dim, rotary_pct, base, llama3", [
    (16, 1.0, 500000.0, (32.0, 1.0, 4.0, 8192)), (12, 0.5, 10000.0, None)],
                         ids=["llama_3_2", "pythia"])
def test_rotary_positions_as_the_numpy_reference(key_dim, rotary_pct, base,
                                                 llama3):
  """thattn.ops.rotary in this backend's keras.ops: the float64 rotation
  matrices' result (tests/ops/rotary_test.py holds tf_keras's namespace and
  both against transformers)."""
  rotated = rotary.rotated_size(key_dim, rotary_pct)
  scaling = rotary.Llama3Scaling(*llama3) if llama3 else None
  theta = rotary.frequencies(rotated, base=base, scaling=scaling)
  x = RNG.normal(size=(2, 4, 3, key_dim)).astype("float32")
  positions = np.array([[0, 1, 2, 3], [500, 501, 502, 503]], "int32")
  got = _numpy(rotary.apply(ops, ops.convert_to_tensor(x),
                            ops.convert_to_tensor(positions), theta))
  want = ref.rotary(x, positions,
                    ref.rotary_frequencies(rotated, base, llama3))
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
  np.testing.assert_array_equal(got[..., rotated:], x[..., rotated:])


def test_grouped_query_attention_equals_keras_group_query_attention():
  """num_key_value_heads=h_kv: Keras's GroupQueryAttention with the same
  weights (its query kernel times d_k**-0.5, which thattn folds into P_q),
  causal and not; decoding caches hold the h_kv projected heads."""
  theirs = keras.layers.GroupQueryAttention(
      head_dim=4, num_query_heads=6, num_key_value_heads=2, use_bias=False)
  ours = keras3.MultiHeadAttention(6, 4, num_key_value_heads=2)
  x = RNG.normal(size=(2, 5, 12)).astype("float32")
  memory = RNG.normal(size=(2, 7, 12)).astype("float32")
  theirs(x, memory)
  ours(x, memory)
  for name, scale in (("query", 4 ** -0.5), ("key", 1), ("value", 1),
                      ("output", 1)):
    kernel = getattr(theirs, f"_{name}_dense" if name != "output" else
                     "_output_dense").kernel
    getattr(ours, f"{name}_dense").kernel.assign(_numpy(kernel) * scale)
  assert tuple(ours.key_dense.kernel.shape) == (12, 2, 4)
  for causal in (False, True):
    np.testing.assert_allclose(
        _numpy(ours(x, memory, use_causal_mask=causal)),
        _numpy(theirs(x, memory, use_causal_mask=causal)), rtol=1e-5,
        atol=1e-5)
  whole = _numpy(ours(x, x, use_causal_mask=True))
  cache = ours.initial_cache(2, 5)
  assert tuple(cache["key"].shape) == (2, 5, 2, 4)
  steps = []
  for t in range(5):
    y, cache = ours(x[:, t:t + 1], x[:, t:t + 1], cache=cache, decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-5,
                             atol=1e-5)
  # from_keras and to_keras carry a GroupQueryAttention's weights, with
  # its biases and gate, both ways.
  gated = keras.layers.GroupQueryAttention(
      head_dim=4, num_query_heads=6, num_key_value_heads=3, use_gate=True,
      bias_initializer="random_normal")
  want = _numpy(gated(x, memory, use_causal_mask=True))
  converted = keras3.from_keras(gated)
  assert converted.num_key_value_heads == 3 and converted.use_gate
  np.testing.assert_allclose(
      _numpy(converted(x, memory, use_causal_mask=True)), want, rtol=1e-5,
      atol=1e-5)
  back = keras3.to_keras(converted)
  assert isinstance(back, keras.layers.GroupQueryAttention)
  np.testing.assert_allclose(_numpy(back(x, memory, use_causal_mask=True)),
                             want, rtol=1e-5, atol=1e-5)
  odd = keras3.MultiHeadAttention(6, 4, value_dim=2, num_key_value_heads=2)
  odd(x, memory)
  with pytest.raises(ValueError, match="one head_dim"):
    keras3.to_keras(odd)


def test_talking_heads_over_shared_key_value_heads_is_the_paper():
  """Talking heads with h_kv = 2 shared by h_k = 4 key heads and h_v = 6
  value heads: the paper's layer whose P_k and P_v repeat each projected
  head (key head i reads K head i // 2, value head j V head j // 3)."""
  layer = keras3.TalkingHeadsAttention(3, 4, num_key_heads=4,
                                       num_value_heads=6,
                                       num_key_value_heads=2)
  x = RNG.normal(size=(2, 5, 12)).astype("float32")
  memory = RNG.normal(size=(2, 7, 12)).astype("float32")
  layer(x, memory)
  weights = _reference_weights(layer, RNG)
  assert weights["P_v"].shape == (12, 2, 4)
  want = ref.talking_heads_attention(
      x, memory, **dict(weights, P_k=np.repeat(weights["P_k"], 2, axis=1),
                        P_v=np.repeat(weights["P_v"], 3, axis=1)))
  ref.assert_close(_numpy(layer(x, memory)), want)
  config = layer.get_config()
  assert config["num_key_value_heads"] == 2
  assert keras3.TalkingHeadsAttention.from_config(
      config).num_key_value_heads == 2


@pytest.mark.parametrize("make", [
    lambda: keras3.MultiHeadAttention(4, 8, num_key_value_heads=2,
                                      rotary_base=10000.0, rotary_pct=0.5),
    lambda: keras3.TalkingHeadsAttention(
        3, 8, num_key_heads=4, num_value_heads=2, rotary_base=500000.0,
        rotary_scaling={"factor": 8.0}),
], ids=["multi_head_partial", "talking_heads_llama3"])
def test_rotary_attention_decodes_each_step_at_its_position(make):
  """Queries and keys turn by position (tests/layers/rotary_attention_test
  holds the tf_keras layer against transformers' Llama attention, and
  tf_keras_transfer_checks.py this front's equal to it): cached steps,
  two a call, equal the whole causal pass, and the config round trips."""
  layer = make()
  x = RNG.normal(size=(2, 6, 16)).astype("float32")
  whole = _numpy(layer(x, x, use_causal_mask=True))
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(0, 6, 2):
    y, cache = layer(x[:, t:t + 2], x[:, t:t + 2], cache=cache,
                     decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-5,
                             atol=1e-5)
  again = type(layer).from_config(layer.get_config())
  again(x, x)
  again.set_weights(layer.get_weights())
  np.testing.assert_allclose(_numpy(again(x, x, use_causal_mask=True)),
                             whole, rtol=1e-6, atol=1e-6)


def test_differential_attention_is_diff_llama_s():
  """Differential attention (Ye et al., 2024) against the NumPy
  transcription of transformers' DiffLlama (tests/layers/
  family_reference.py; tests/layers/differential_attention_test.py holds
  the tf_keras layer against DiffLlamaAttention itself), with shared key
  and value heads and a mask; cached decoding equals the causal pass."""
  layer = keras3.DifferentialAttention(4, 3, num_key_value_heads=2,
                                       layer_index=2)
  x = RNG.normal(size=(2, 5, 12)).astype("float32")
  mask = RNG.random((2, 5, 5)) < 0.7
  mask[:, :, 0] = True  # no fully masked row
  layer(x, x)
  for variable in layer.weights:
    variable.assign(RNG.normal(size=variable.shape).astype("float32") * 0.3)
  *vectors, query, key, value, output = [_numpy(w) for w in layer.weights]
  want = family_reference.differential_attention(
      x, x, query, key, value, output.reshape(-1, 12), *vectors,
      layer_index=2, mask=mask)
  ref.assert_close(_numpy(layer(x, x, attention_mask=mask)), want)
  whole = _numpy(layer(x, x, use_causal_mask=True))
  cache = layer.initial_cache(2, 5)
  steps = []
  for t in range(5):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache, decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-5,
                             atol=1e-5)


def test_dcmha_is_the_authors_compose():
  """DCMHA (Xiao et al., 2024) against the NumPy transcription of the
  DCFormer authors' compose (tests/layers/family_reference.py; tests/
  layers/dcmha_test.py holds the tf_keras layer), with shared key and
  value heads, the static mix and a mask; cached decoding, which keeps
  each key's mixing matrices, equals the causal pass in a sliding
  window."""
  layer = keras3.DynamicallyComposableAttention(4, 3, num_key_value_heads=2,
                                                static_mix=True)
  x = RNG.normal(size=(2, 5, 12)).astype("float32")
  mask = RNG.random((2, 5, 5)) < 0.7
  mask[:, :, 0] = True  # no fully masked row
  layer(x, x)
  weights = {}
  for variable in layer.weights:
    variable.assign(RNG.normal(size=variable.shape).astype("float32") * 0.3)
    parts = variable.path.split("/")
    weights[parts[-2] if parts[-1] == "kernel" else parts[-1]] = _numpy(
        variable)
  want = family_reference.dcmha_attention(
      x, x, weights["query"], weights["key"], weights["value"],
      weights["output"], weights["dynamic_hidden"],
      weights["dynamic_factors"], weights["dynamic_gates"], mask=mask,
      static=weights["static_mix"])
  ref.assert_close(_numpy(layer(x, x, attention_mask=mask)), want)
  windowed = keras3.DynamicallyComposableAttention(
      2, 4, sliding_window=2, rotary_base=10000.0,
      query_key_norm_epsilon=1e-6)
  whole = _numpy(windowed(x, x, use_causal_mask=True))
  cache = windowed.initial_cache(2, 5)
  assert tuple(cache["key_mix"].shape) == (2, 5, 2, 2, 2)
  steps = []
  for t in range(5):
    y, cache = windowed(x[:, t:t + 1], x[:, t:t + 1], cache=cache,
                        decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole, rtol=1e-5,
                             atol=1e-5)
