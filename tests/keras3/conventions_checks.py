"""keras.layers.MultiHeadAttention's conventions on thattn.keras3's layers.

Run by `backends_test.py` in a process per backend, like backend_checks.py:
the gate (element-wise, Keras 3's; head-wise, thattn's) and the sliding
window against the NumPy reference (extended with both gates and the band
mask), for every variant, self and cross, with
causal and explicit masks and in step-by-step decoding; masks of rank 2-4;
Keras masks; the `_compute_attention` override point; LoRA; quantization;
flash_attention; compute_output_shape; from_keras / to_keras.
"""

import warnings

import keras
from keras import ops
import numpy as np
import pytest

from thattn import keras3
from thattn.keras3 import flash
from thattn.kernels import dispatch
from tests.keras3.backend_checks import _numpy
from tests.keras3.backend_checks import _reference_weights
from tests.layers import numpy_reference as ref

BACKEND = keras.backend.backend()
WINDOW = 2

VARIANTS = {
    "multi_head": (lambda **kw: keras3.MultiHeadAttention(3, 4, value_dim=5,
                                                          **kw),
                   ref.multi_head_attention),
    "talking_heads": (lambda **kw: keras3.TalkingHeadsAttention(
        3, 4, value_dim=5, num_key_heads=2, num_value_heads=4, **kw),
                      ref.talking_heads_attention),
    "logits_only": (lambda **kw: keras3.TalkingHeadsAttention(
        3, 4, num_key_heads=2, project_weights=False, **kw),
                    ref.talking_heads_attention),
    "weights_only": (lambda **kw: keras3.TalkingHeadsAttention(
        3, 4, num_value_heads=2, project_logits=False, **kw),
                     ref.talking_heads_attention),
    "dynamic": (lambda **kw: keras3.TalkingHeadsAttention(
        3, 4, num_key_heads=2, num_value_heads=4,
        dynamic_projections=keras3.DYNAMIC_PROJECTIONS, **kw),
                ref.talking_heads_attention_with_dynamic_projections),
    "grouped": (lambda **kw: keras3.TalkingHeadsAttention(
        4, 4, num_key_heads=2, num_value_heads=6, num_head_groups=2,
        dynamic_projections=["m2l", "x2w"], **kw),
                ref.grouped_talking_heads_attention),
    "general_bilinear": (lambda **kw: keras3.GeneralBilinearAttention(3, **kw),
                         ref.general_bilinear_attention),
}
PROJECTED = ("multi_head", "talking_heads")


def _inputs(rng, self_attention, n=5):
  m = n if self_attention else 7
  d_m = 8 if self_attention else 6
  return ref.make_inputs(rng, 2, n, m, 8, d_m, self_attention)


# ---- use_gate and sliding_window against the reference ----------------------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("memory", ["self", "cross"])
def test_gate_and_window_equal_the_reference(variant, memory):
  make_layer, reference = VARIANTS[variant]
  rng = np.random.default_rng(3)
  self_attention = memory == "self"
  x, mem = _inputs(rng, self_attention)
  n, m = x.shape[1], mem.shape[1]
  explicit = rng.random((2, n, m)) < 0.7
  explicit[:, np.arange(n), np.arange(n)] = True  # no fully masked row
  layer = make_layer(use_gate=True, sliding_window=WINDOW)
  layer(x.astype("float32"), mem.astype("float32"))
  weights = _reference_weights(layer, rng)
  assert "P_g" in weights
  got = layer(x.astype("float32"), mem.astype("float32"),
              attention_mask=explicit, use_causal_mask=self_attention)
  want_mask = explicit & ref.band_mask(2, n, m, WINDOW)
  if self_attention:
    want_mask &= ref.causal_mask(2, n, m)
  want = reference(x, mem, mask=want_mask, **weights)
  ref.assert_close(_numpy(got), want)


@pytest.mark.parametrize("variant", ["talking_heads", "general_bilinear"])
def test_the_headwise_gate_equals_the_reference(variant):
  """thattn's `headwise_gate`: one gate per head, P_g[d_X, heads]."""
  make_layer, reference = VARIANTS[variant]
  rng = np.random.default_rng(6)
  x, mem = _inputs(rng, self_attention=True)
  layer = make_layer(use_gate=True, headwise_gate=True)
  layer(x.astype("float32"), mem.astype("float32"))
  gate = layer.gate_dense
  assert tuple(gate.kernel.shape) == (8, layer.gate_shape()[0])
  weights = _reference_weights(layer, rng)
  got = layer(x.astype("float32"), mem.astype("float32"),
              use_causal_mask=True)
  want = reference(x, mem, mask=ref.causal_mask(2, 5, 5), **weights)
  ref.assert_close(_numpy(got), want)


@pytest.mark.parametrize("variant", ["multi_head", "talking_heads", "dynamic",
                                     "general_bilinear"])
def test_windowed_gated_decoding_equals_the_full_pass(variant):
  layer = VARIANTS[variant][0](use_gate=True, sliding_window=WINDOW)
  x = np.random.default_rng(4).normal(size=(2, 6, 8)).astype("float32")
  full = _numpy(layer(x, x, use_causal_mask=True))
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(6):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache, decode_step=t)
    steps.append(_numpy(y))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5,
                             atol=1e-5)


def test_window_without_causal_is_keras_symmetric_band():
  layer = keras3.MultiHeadAttention(2, 4, sliding_window=3)
  x = np.random.default_rng(5).normal(size=(1, 7, 8)).astype("float32")
  _, scores = layer(x, x, return_attention_scores=True)
  scores = _numpy(scores)[0, 0]
  band = ref.band_mask(1, 7, 7, 3)[0]
  assert (scores[~band] == 0).all() and (scores[band] > 0).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(sliding_window=0), r"`sliding_window` must be `None` or a positive "
     r"integer. Received: sliding_window=0"),
    (dict(sliding_window=2.5), r"Received: sliding_window=2.5"),
    (dict(use_gate="yes"), r"`use_gate` must be True or False. Received: "
     r"use_gate='yes'"),
    (dict(flash_attention="on"), r"`flash_attention` must be None, True or "
     r"False. Received: flash_attention='on'"),
])
def test_bad_new_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    keras3.TalkingHeadsAttention(2, 4, **kwargs)


def test_window_over_a_cross_attention_cache_is_refused():
  layer = keras3.MultiHeadAttention(2, 4, sliding_window=2)
  memory = np.ones((1, 3, 8), "float32")
  layer(memory, memory)
  with pytest.raises(ValueError, match=r"sliding_window=2 with a "
                     r"cross-attention cache"):
    layer(memory[:, :1], None, cache=layer.memory_cache(memory))


# ---- masks --------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["multi_head", "talking_heads",
                                     "general_bilinear"])
def test_masks_of_rank_2_3_and_4_broadcast_as_keras(variant):
  layer = VARIANTS[variant][0]()
  rng = np.random.default_rng(6)
  x = rng.normal(size=(2, 5, 8)).astype("float32")
  mask = rng.random((5, 5)) < 0.6
  mask[:, 0] = True
  batch_mask = np.broadcast_to(mask, (2, 5, 5))
  heads = layer.num_heads
  per_head = np.broadcast_to(mask, (2, heads, 5, 5))
  want = _numpy(layer(x, x, attention_mask=batch_mask))
  for form in (mask, per_head, mask.astype("float32")):
    np.testing.assert_allclose(_numpy(layer(x, x, attention_mask=form)), want,
                               rtol=1e-6, atol=1e-6)


def test_a_per_head_mask_masks_each_head_of_the_softmax():
  layer = keras3.MultiHeadAttention(2, 4, flash_attention=False)
  x = np.random.default_rng(7).normal(size=(1, 4, 8)).astype("float32")
  per_head = np.ones((1, 2, 4, 4), bool)
  per_head[0, 1, :, 1:] = False  # head 1 sees key 0 only
  _, scores = layer(x, x, attention_mask=per_head,
                    return_attention_scores=True)
  scores = _numpy(scores)
  np.testing.assert_allclose(scores[0, 1, :, 0], 1.0, rtol=1e-6)
  assert (scores[0, 0] > 0).all()


@pytest.mark.parametrize("shape,message", [
    ((5,), r"attention_mask has shape \(5,\); expected rank 2"),
    ((1, 1, 1, 5, 5), r"expected rank 2 .* 3 .* or 4"),
    ((2, 4, 5, 5), r"heads dimension 4 must be 1 or num_heads=3"),
])
def test_masks_of_other_shapes_are_named(shape, message):
  layer = keras3.TalkingHeadsAttention(3, 4)
  x = np.ones((2, 5, 8), "float32")
  with pytest.raises(ValueError, match=message):
    layer(x, x, attention_mask=np.ones(shape, bool))


@pytest.mark.parametrize("variant", ["multi_head", "talking_heads",
                                     "general_bilinear"])
def test_keras_masks_give_no_warnings_and_equal_the_explicit_mask(variant):
  layer = VARIANTS[variant][0]()
  tokens = np.array([[1, 2, 3, 0, 0], [3, 3, 1, 1, 2]])
  embed = keras.layers.Embedding(5, 8, mask_zero=True)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    masked = embed(tokens)
    got = _numpy(layer(masked, masked))
  assert not [w for w in caught if "mask" in str(w.message)], [
      str(w.message) for w in caught]
  keep = tokens != 0
  explicit = keep[:, :, None] & keep[:, None, :]
  want = _numpy(layer(_numpy(embed(tokens)), _numpy(embed(tokens)),
                      attention_mask=explicit))
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---- _compute_attention, the override point ----------------------------------


@pytest.mark.parametrize("variant", ["multi_head", "talking_heads",
                                     "general_bilinear"])
def test_a_compute_attention_override_is_called(variant):
  base_class = type(VARIANTS[variant][0]())
  seen = {}

  class Halved(base_class):

    def _compute_attention(self, query, key, value, attention_mask=None,
                           training=None, return_attention_scores=False):
      seen["mask_shape"] = (None if attention_mask is None else
                            tuple(attention_mask.shape))
      output, scores = super()._compute_attention(
          query, key, value, attention_mask, training,
          return_attention_scores)
      return output * 0.5, scores

  kwargs = {"num_heads": 3} if variant == "general_bilinear" else {
      "num_heads": 3, "key_dim": 4}
  layer = Halved(**kwargs)
  plain = base_class(**kwargs)
  x = np.random.default_rng(8).normal(size=(2, 5, 8)).astype("float32")
  plain(x, x)
  layer(x, x)
  layer.set_weights(plain.get_weights())
  got = _numpy(layer(x, x, use_causal_mask=True))
  assert seen["mask_shape"] == (1, 5, 5)  # the causal mask folded in
  halved_core = _numpy(plain(x, x, use_causal_mask=True))
  # The core is halved before the output projection; without biases the
  # output projection is linear, so the outputs halve too.
  np.testing.assert_allclose(got, 0.5 * halved_core, rtol=1e-5, atol=1e-6)


def test_an_override_that_cannot_take_the_position_bias_is_named():

  class Plain(keras3.TalkingHeadsAttention):

    def _compute_attention(self, query, key, value, attention_mask=None,
                           training=None, return_attention_scores=False):
      return super()._compute_attention(query, key, value, attention_mask,
                                        training, return_attention_scores)

  layer = Plain(2, 4)
  x = np.ones((1, 3, 8), "float32")
  with pytest.raises(ValueError, match=r"needs `position_bias`, which it "
                     r"does not take"):
    layer(x, x, position_bias=np.zeros((1, 2, 3, 3), "float32"))


# ---- compute_output_shape -----------------------------------------------------


def test_compute_output_shape_raises_keras_errors():
  layer = keras3.TalkingHeadsAttention(2, 4, output_shape=6)
  assert layer.compute_output_shape((2, 5, 8), (2, 7, 3)) == (2, 5, 6)
  with pytest.raises(ValueError, match=r"All dimensions of `value` and `key`, "
                     r"except the last one, must be equal"):
    layer.compute_output_shape((2, 5, 8), (2, 7, 3), (2, 6, 3))
  layer.build((2, 5, 8), (2, 7, 3))
  with pytest.raises(ValueError, match=r"The last dimension of `value_shape` "
                     r"must be equal to the width the layer was built for, "
                     r"3"):
    layer.compute_output_shape((2, 5, 8), (2, 7, 4))


# ---- LoRA ---------------------------------------------------------------------


def _functional(layer, width=8, length=5):
  query = keras.Input((length, width))
  return keras.Model(query, layer(query, query))


@pytest.mark.parametrize("variant", PROJECTED)
def test_lora_trains_only_its_factors_and_saves(variant, tmp_path):
  layer = VARIANTS[variant][0](use_gate=True)
  model = _functional(layer)
  x = np.random.default_rng(9).normal(size=(4, 5, 8)).astype("float32")
  before = _numpy(model(x))
  for projection in (layer.query_dense, layer.key_dense, layer.value_dense,
                     layer.output_dense):
    projection.enable_lora(4)
  np.testing.assert_allclose(_numpy(model(x)), before, rtol=1e-6, atol=1e-6)
  frozen = {v.path: _numpy(v) for v in layer.non_trainable_weights}
  assert sorted(path.rsplit("/", 2)[-2] for path in frozen) == [
      "key", "output", "query", "value"]
  trainable = sorted(v.path.split("/", 1)[1] for v in
                     layer.trainable_weights)
  lora = [path for path in trainable if "lora_kernel" in path]
  assert len(lora) == 8
  others = sorted(set(trainable) - set(lora))
  assert others == sorted(
      ["gate/kernel"] + [name for name in ("pre_softmax_projection",
                                           "post_softmax_projection")
                         if variant == "talking_heads"])
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  model.fit(x, np.zeros((4, 5, 8), "float32"), epochs=2, verbose=0)
  for v in layer.non_trainable_weights:
    np.testing.assert_array_equal(_numpy(v), frozen[v.path])
  assert not np.allclose(_numpy(model(x)), before)
  path = str(tmp_path / "lora.keras")
  model.save(path)
  reloaded = keras.models.load_model(path)
  np.testing.assert_allclose(_numpy(reloaded(x)), _numpy(model(x)),
                             rtol=1e-5, atol=1e-5)


def test_layer_enable_lora_checks_its_arguments():
  layer = keras3.TalkingHeadsAttention(2, 4)
  layer.build((1, 3, 8), (1, 3, 8))
  with pytest.raises(ValueError, match=r"argument `rank`, expected a positive "
                     r"integer. Received: rank=0"):
    layer.enable_lora(0)
  with pytest.raises(ValueError, match=r"Received: lora_alpha=-1"):
    layer.enable_lora(2, lora_alpha=-1)
  with pytest.raises(ValueError, match=r"no projection \['gate'\]"):
    layer.enable_lora(2, projections=("query", "gate"))
  layer.enable_lora(2)
  assert layer.query_dense.lora_rank == 2 and layer.output_dense.lora_enabled


# ---- quantization -------------------------------------------------------------


# Every mode on talking heads (its P_l and P_w must stay float), int8 on
# multi-head too: the quantized projections are the same EinsumDense
# layers in both, so multi-head's other modes would time Keras's code.
@pytest.mark.parametrize("variant, mode", [
    ("talking_heads", "int8"), ("talking_heads", "int4"),
    ("talking_heads", "float8"), ("multi_head", "int8")])
def test_quantize_a_built_layer(variant, mode):
  layer = VARIANTS[variant][0](use_gate=True)
  x = np.random.default_rng(10).normal(size=(2, 5, 8)).astype("float32")
  before = _numpy(layer(x, x))
  layer.quantize(mode)
  after = _numpy(layer(x, x))
  # Keras's own test of a quantized MultiHeadAttention: mean squared error
  # below 1e-2 ("a weak correctness test").
  assert np.mean((after - before) ** 2) < 1e-2
  for projection in (layer.query_dense, layer.key_dense, layer.value_dense,
                     layer.output_dense, layer.gate_dense):
    assert projection.quantization_mode == mode
  for name in ("pre_softmax_projection", "post_softmax_projection"):
    for variable in layer.weights:
      if variable.path.endswith(name):
        assert variable.dtype == "float32" and variable.trainable
  with pytest.raises(ValueError, match=r"already quantized"):
    layer.quantize(mode)


def test_quantized_model_saves_and_reloads_through_a_policy_map(tmp_path):
  layer = keras3.TalkingHeadsAttention(3, 4, num_value_heads=2, name="th")
  model = _functional(layer)
  x = np.random.default_rng(11).normal(size=(2, 5, 8)).astype("float32")
  model.quantize("int8")
  assert layer.query_dense.quantization_mode == "int8"
  path = str(tmp_path / "int8.keras")
  model.save(path)
  reloaded = keras.models.load_model(path)
  np.testing.assert_allclose(_numpy(reloaded(x)), _numpy(model(x)),
                             rtol=1e-6, atol=1e-6)
  assert reloaded.get_layer("th").query_dense.quantization_mode == "int8"


def test_an_int8_policy_map_quantizes_at_build():
  policies = keras.dtype_policies.DTypePolicyMap()
  for name in ("query", "key", "value", "output"):
    policies[f"th/{name}"] = keras.dtype_policies.QuantizedDTypePolicy(
        "int8", "float32")
  layer = keras3.TalkingHeadsAttention(2, 4, dtype=policies, name="th")
  x = np.random.default_rng(12).normal(size=(2, 5, 8)).astype("float32")
  y = _numpy(layer(x, x))
  assert np.isfinite(y).all()
  assert str(layer.query_dense.kernel.dtype) == "int8"
  assert layer.logical_axes  # the kernels' axes recorded, scales skipped


def test_unknown_quantization_modes_are_named():
  layer = keras3.TalkingHeadsAttention(2, 4)
  layer.build((1, 3, 8), (1, 3, 8))
  with pytest.raises(ValueError, match=r"Invalid quantization mode.*"
                     r"Received: mode=int3"):
    layer.quantize("int3")


# ---- flash_attention ----------------------------------------------------------


def test_multi_head_dot_product_attention_equals_the_keras_ops_core():
  """The accelerators' path (keras.ops.dot_product_attention with thattn's
  masks, flash left to the backend) equals the keras.ops core, here on the
  CPU where the layer itself keeps the keras.ops core."""
  rng = np.random.default_rng(13)
  x = rng.normal(size=(2, 6, 8)).astype("float32")
  mask = rng.random((2, 1, 6, 6)) < 0.7
  mask[..., 0] = True
  layer = keras3.MultiHeadAttention(2, 4, flash_attention=False)
  layer(x, x)
  query = layer.query_dense(x)
  key, value = layer.key_dense(x), layer.value_dense(x)
  for kwargs in (dict(), dict(use_causal_mask=True), dict(attention_mask=mask),
                 dict(attention_mask=mask, use_causal_mask=True)):
    want, _ = layer._compute_attention(query, key, value, **kwargs)  # pylint: disable=protected-access
    causal = 0 if kwargs.get("use_causal_mask") else None
    got = flash.dot_product_core(layer, query, key, value,
                                 kwargs.get("attention_mask"), None, causal,
                                 None)
    np.testing.assert_allclose(_numpy(got), _numpy(want), rtol=1e-5,
                               atol=1e-6)
  assert not dispatch.on_accelerator()  # this machine: the layer's own core


def test_flash_attention_true_is_the_backend_s_or_its_error():
  layer = keras3.MultiHeadAttention(2, 8, flash_attention=True,
                                    dtype="bfloat16")
  x = np.random.default_rng(14).normal(size=(1, 8, 16)).astype("float32")
  try:
    flash = _numpy(ops.cast(layer(x, x), "float32"))
  except (ValueError, RuntimeError, ImportError) as error:
    # No flash kernel on this machine's CPU backends (measured: TensorFlow
    # has none, JAX needs cuDNN, PyTorch's CPU flash refuses these inputs).
    assert "lash" in str(error) or "cuDNN" in str(error), str(error)
    return
  plain = keras3.MultiHeadAttention(2, 8, flash_attention=False,
                                    dtype="bfloat16")
  plain(x, x)
  plain.set_weights(layer.get_weights())
  np.testing.assert_allclose(flash, _numpy(ops.cast(plain(x, x), "float32")),
                             rtol=2e-2, atol=2e-2)


def test_flash_attention_refusals_are_named():
  with pytest.raises(ValueError, match=r"Dropout is not supported when flash "
                     r"attention is enabled"):
    keras3.MultiHeadAttention(2, 4, dropout=0.1, flash_attention=True)
  layer = keras3.MultiHeadAttention(2, 4, flash_attention=True)
  x = np.ones((1, 3, 8), "float32")
  with pytest.raises(ValueError, match=r"Returning attention scores is not "
                     r"supported when flash attention is enabled"):
    layer(x, x, return_attention_scores=True)
  with pytest.raises(ValueError, match=r"general bilinear attention's core"):
    keras3.GeneralBilinearAttention(2, flash_attention=True)
  with pytest.raises(ValueError, match=r"fused_kernel=True and its alias "
                     r"flash_attention=False disagree"):
    keras3.TalkingHeadsAttention(2, 4, fused_kernel=True,
                                 flash_attention=False)
  # No thattn kernel computes grouped heads with a dynamic projection, on
  # any backend: the refusal names the switch as the user spelled it.
  talking = keras3.TalkingHeadsAttention(
      4, 4, num_head_groups=2, dynamic_projections=["x2l"],
      flash_attention=True)
  with pytest.raises(ValueError, match=r"flash_attention=True, but .*Pass "
                     r"flash_attention=None"):
    talking(x, x)


# ---- from_keras / to_keras ----------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    dict(num_heads=2, key_dim=4),
    # Keras 3.15's own layer fails on JAX with key_dim != value_dim on its
    # dot_product_attention path; dropout (inactive at inference) sends it
    # down its einsum path.
    dict(num_heads=2, key_dim=4, value_dim=3, use_bias=False, dropout=0.1),
    dict(num_heads=3, key_dim=4, use_gate=True, sliding_window=2),
    dict(num_heads=2, key_dim=4, output_shape=5),
], ids=["biases", "key_dim_ne_value_dim", "gate_window", "output_shape"])
@pytest.mark.parametrize("memory", ["self", "cross"])
def test_from_keras_and_to_keras_keep_the_outputs(kwargs, memory):
  rng = np.random.default_rng(15)
  x = rng.normal(size=(2, 5, 8)).astype("float32")
  mem = x if memory == "self" else rng.normal(size=(2, 7, 6)).astype(
      "float32")
  key = None if memory == "self" else rng.normal(size=(2, 7, 3)).astype(
      "float32")
  source = keras.layers.MultiHeadAttention(**kwargs)
  source(x, mem, key)
  for variable in source.weights:  # random biases too, not zeros
    variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.5)
  want = _numpy(source(x, mem, key, use_causal_mask=memory == "self"))
  converted = keras3.from_keras(source)
  got = _numpy(converted(x, mem, key, use_causal_mask=memory == "self"))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  back = keras3.to_keras(converted)
  np.testing.assert_allclose(
      _numpy(back(x, mem, key, use_causal_mask=memory == "self")), want,
      rtol=1e-5, atol=1e-5)


def test_from_keras_refuses_what_it_cannot_compute():
  with pytest.raises(ValueError, match=r"takes a keras.layers."
                     r"MultiHeadAttention"):
    keras3.from_keras(keras.layers.Dense(3))
  high_rank = keras.layers.MultiHeadAttention(2, 4, attention_axes=(1, 2))
  high_rank(np.ones((1, 2, 3, 8), "float32"), np.ones((1, 2, 3, 8),
                                                       "float32"))
  with pytest.raises(ValueError, match=r"attention_axes"):
    keras3.from_keras(high_rank)
  with pytest.raises(ValueError, match=r"takes a thattn.keras3."
                     r"MultiHeadAttention"):
    keras3.to_keras(keras3.TalkingHeadsAttention(2, 4))

