"""The output gate of gated attention (Qiu et al., 2025) on the tf_keras
layers: `use_gate` (element-wise, Keras 3's argument) and `headwise_gate`
(one gate per head), against the NumPy reference, in decoding, through a
config, and beside the Keras 3 layers (their three backends are checked in
tests/keras3/conventions_checks.py); and the layout Qwen3-Next ships, the
gate with q/k RMSNorm (`query_key_norm_epsilon`) and a quarter of each
head rotated, against transformers' `Qwen3NextAttention`."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers
from thattn.core import variants
from thattn.layers import keras_interop

try:
  from . import numpy_reference as ref
except ImportError:  # tests/layers is not a package
  import numpy_reference as ref

LAYERS = {
    "multi_head": (lambda **kw: layers.MultiHeadAttention(3, 4, value_dim=5,
                                                          **kw),
                   ref.multi_head_attention),
    "talking_heads": (lambda **kw: layers.TalkingHeadsAttention(
        3, 4, value_dim=5, num_key_heads=2, num_value_heads=4, **kw),
                      ref.talking_heads_attention),
    "general_bilinear": (lambda **kw: layers.GeneralBilinearAttention(
        3, **kw), ref.general_bilinear_attention),
}


def _inputs(rng, n=5):
  x, mem = ref.make_inputs(rng, 2, n, n, 8, 8, self_attention=True)
  return x.astype("float32"), mem.astype("float32")


@pytest.mark.parametrize("headwise", [False, True], ids=["element", "head"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_gate_equals_the_reference(name, headwise):
  make_layer, reference = LAYERS[name]
  rng = np.random.default_rng(7)
  x, mem = _inputs(rng)
  mask = rng.random((2, 5, 5)) < 0.7
  mask[:, np.arange(5), np.arange(5)] = True  # no fully masked row
  layer = make_layer(use_gate=True, headwise_gate=headwise)
  layer(x, mem)
  heads, width = layer.gate_shape()
  gate_shape = (8, heads) if headwise else (8, heads, width)
  assert tuple(layer.weights[-1].shape) == gate_shape  # made last
  ref.randomize_weights(layer, rng)
  weights = ref.reference_kwargs(layer)
  got = layer(x, mem, attention_mask=mask, use_causal_mask=True)
  want = reference(x, mem, mask=mask & ref.causal_mask(2, 5, 5), **weights)
  ref.assert_close(got.numpy(), want)
  ungated = reference(x, mem, mask=mask & ref.causal_mask(2, 5, 5),
                      **dict(weights, P_g=None))
  assert np.abs(want - ungated).max() > 0.1  # the gate counts


def test_gated_decoding_equals_the_causal_pass():
  layer = layers.TalkingHeadsAttention(3, 4, use_gate=True,
                                       headwise_gate=True)
  x = np.random.default_rng(8).normal(size=(2, 6, 8)).astype("float32")
  full = layer(x, x, use_causal_mask=True).numpy()
  cache = layer.initial_cache(2, 6)
  steps = []
  for t in range(6):
    y, cache = layer(x[:, t:t + 1], x[:, t:t + 1], cache=cache,
                     decode_step=t)
    steps.append(y.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5,
                             atol=1e-5)


def test_a_config_rebuilds_the_gated_layer():
  layer = layers.MultiHeadAttention(2, 4, use_bias=True, use_gate=True,
                                    headwise_gate=True)
  x = np.random.default_rng(9).normal(size=(1, 3, 8)).astype("float32")
  y = layer(x, x).numpy()
  config = layer.get_config()
  assert config["use_gate"] and config["headwise_gate"]
  again = layers.MultiHeadAttention.from_config(config)
  again.set_weights(layer.get_weights())
  np.testing.assert_array_equal(again(x, x).numpy(), y)
  assert [w.name.split("/", 1)[1] for w in again.weights][-2:] == [
      "gate/kernel:0", "gate/bias:0"]  # a bias per head


def test_the_registry_s_gated_variants_are_multi_head_with_a_gate():
  for name, headwise in (("gated", False), ("gated_headwise", True)):
    layer = variants.make_attention("tf_keras", name, 2, 4)
    assert isinstance(layer, layers.MultiHeadAttention)
    assert (layer.use_gate, layer.headwise_gate) == (True, headwise)


@pytest.mark.parametrize("kwargs, message", [
    (dict(headwise_gate=True), "headwise_gate=True .* needs use_gate=True"),
    (dict(use_gate=1), r"`use_gate` must be True or False. Received: "
                       r"use_gate=1"),
])
def test_bad_gate_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.MultiHeadAttention(2, 4, **kwargs)


def test_tf_keras_s_own_layers_have_no_gate_to_take():
  layer = layers.MultiHeadAttention(2, 4, use_gate=True)
  layer(tf.zeros([1, 2, 8]), tf.zeros([1, 2, 8]))
  with pytest.raises(ValueError, match="use_gate=True gates the heads' "
                     "outputs, which neither tf_keras's"):
    keras_interop.to_keras(layer)


def _qwen3_next_attention():
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from transformers.models.qwen3_next import modeling_qwen3_next  # pylint: disable=g-import-not-at-top
  config = transformers.Qwen3NextConfig(
      hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
      head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=64,
      layer_types=["full_attention"], num_hidden_layers=1)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(0)
  attention = modeling_qwen3_next.Qwen3NextAttention(config, 0).eval()
  for weight in attention.parameters():
    torch.nn.init.normal_(weight, std=0.3)
  return (torch, attention,
          modeling_qwen3_next.Qwen3NextRotaryEmbedding(config))


def test_a_qwen3_next_layer_gives_transformers_output():
  """Qwen3-Next's full attention: `q_proj` holds each head's query rows,
  then its gate rows (K each), so they split head by head into P_q and
  P_g; its (1 + w) q/k norms are scales 1 + w here, the query's times
  d_k**-0.5 (the logits' scale, applied after the norm there)."""
  torch, attention, rotary_embedding = _qwen3_next_attention()
  rotary_pct = attention.config.rope_parameters["partial_rotary_factor"]
  assert rotary_pct == 0.25  # Qwen3-Next's default
  layer = layers.MultiHeadAttention(
      4, 8, num_key_value_heads=2, use_gate=True, query_key_norm_epsilon=1e-6,
      rotary_base=attention.config.rope_parameters["rope_theta"],
      rotary_pct=rotary_pct)
  probe = tf.zeros([1, 2, 16])
  layer(probe, probe)
  weight = lambda module: module.weight.detach().numpy()
  query_and_gate = weight(attention.q_proj).reshape(4, 2, 8, 16)
  kernel = lambda rows: np.transpose(rows, (2, 0, 1))  # [h, K, d] -> [d, h, K]
  layer.set_weights([
      (1 + weight(attention.q_norm)) * 8 ** -0.5, 1 + weight(attention.k_norm),
      kernel(query_and_gate[:, 0]),
      kernel(weight(attention.k_proj).reshape(2, 8, 16)),
      kernel(weight(attention.v_proj).reshape(2, 8, 16)),
      weight(attention.o_proj).T.reshape(4, 8, 16),
      kernel(query_and_gate[:, 1])])
  x = np.random.default_rng(4).normal(size=(2, 7, 16)).astype(np.float32)
  hidden = torch.from_numpy(x)
  causal = torch.full((7, 7), torch.finfo(torch.float32).min).triu(1)
  with torch.no_grad():
    want = attention(hidden, rotary_embedding(
        hidden, torch.arange(7)[None].repeat(2, 1)),
                     attention_mask=causal[None, None])[0].numpy()
  got = layer(x, x, use_causal_mask=True).numpy()
  np.testing.assert_allclose(got, want, rtol=0,
                             atol=2e-5 * np.abs(want).max())


def test_the_query_key_norm_is_an_rms_norm_of_each_head():
  """Q and K through the norm: x / sqrt(mean(x**2) + eps) * scale over
  d_k, head by head, before the rotation; the config keeps it."""
  layer = layers.TalkingHeadsAttention(3, 4, query_key_norm_epsilon=1e-5)
  x = np.random.default_rng(5).normal(size=(1, 3, 8)).astype("float32")
  layer(x, x)
  # After P_l and P_w: the two scales [d_k], then P_q.
  query_scale, key_scale, query_kernel = layer.weights[2:5]
  assert [w.name.split("/")[-1] for w in (query_scale, key_scale)] == [
      "query_norm:0", "key_norm:0"]
  assert query_kernel.name.endswith("query/kernel:0")
  np.testing.assert_allclose(query_scale.numpy(), [0.5] * 4)  # d_k**-0.5
  for scale in (query_scale, key_scale):
    scale.assign(np.arange(1, 5, dtype="float32"))
  raw = np.einsum("bnd,dhk->bnhk", x, query_kernel.numpy())
  want = raw / np.sqrt(np.mean(raw ** 2, -1, keepdims=True) + 1e-5) * (
      np.arange(1, 5))
  np.testing.assert_allclose(
      layer.project_query(tf.constant(x))["query"].numpy(), want, rtol=1e-5,
      atol=1e-5)
  assert layers.TalkingHeadsAttention.from_config(
      layer.get_config()).query_key_norm_epsilon == 1e-5
  with pytest.raises(ValueError, match="query_key_norm_epsilon must be None"):
    layers.MultiHeadAttention(2, 4, query_key_norm_epsilon=0)

