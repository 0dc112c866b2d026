"""Differential attention (Ye et al., 2024) on the tf_keras layers, against
the NumPy transcription of transformers' DiffLlama (family_reference.py)
and against `DiffLlamaAttention` itself (rotary positions, shared key and
value heads); cached decoding, configs and bad arguments. The Keras 3
layer on its three backends: tests/keras3/backend_checks.py."""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers
from thattn.ops import differential

try:
  from . import family_reference
except ImportError:  # tests/layers is not a package
  import family_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _weights(layer):
  """The layer's weights as family_reference's arguments."""
  *vectors, query, key, value, output = [w.numpy() for w in layer.weights]
  assert [w.name.split("/")[-1] for w in layer.weights[:4]] == [
      f"{name}:0" for name in differential.LAMBDA_WEIGHTS]
  return dict(P_q=query, P_k=key, P_v=value,
              P_o=output.reshape(-1, output.shape[-1]),
              **dict(zip(differential.LAMBDA_WEIGHTS, vectors)))


def _randomized(layer, rng, x, memory):
  layer(x, memory)
  layer.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3
                     for w in layer.weights])
  return _weights(layer)


@pytest.mark.parametrize("kv_heads, layer_index, memory", [
    (None, 0, "self"), (2, 3, "self"), (1, 1, "cross")])
def test_the_layer_equals_the_reference(kv_heads, layer_index, memory):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 12)).astype("float32")
  mem = x if memory == "self" else rng.normal(size=(2, 7, 10)).astype(
      "float32")
  mask = rng.random((2, 5, mem.shape[1])) < 0.7
  mask[:, :, 0] = True  # no fully masked row
  layer = layers.DifferentialAttention(4, 3, num_key_value_heads=kv_heads,
                                       layer_index=layer_index)
  weights = _randomized(layer, rng, x, mem)
  got = layer(x, mem, attention_mask=mask).numpy()
  want = family_reference.differential_attention(
      x, mem, layer_index=layer_index, mask=mask, **weights)
  np.testing.assert_allclose(got, want, rtol=1e-4,
                             atol=1e-5 * np.abs(want).max())


def _diff_llama_attention(kv_heads, layer_index):
  from transformers.models.diffllama import modeling_diffllama  # pylint: disable=g-import-not-at-top
  config = transformers.DiffLlamaConfig(
      hidden_size=16, num_attention_heads=4, num_key_value_heads=kv_heads,
      head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
      max_position_embeddings=64)
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(layer_index)
  attention = modeling_diffllama.DiffLlamaAttention(
      config, layer_idx=layer_index).eval()
  for weight in attention.parameters():
    torch.nn.init.normal_(weight, std=0.3)
  return attention, modeling_diffllama.DiffLlamaRotaryEmbedding(config)


@pytest.mark.parametrize("kv_heads, layer_index", [(4, 0), (2, 2)])
def test_a_diff_llama_layer_gives_transformers_output(kv_heads, layer_index):
  attention, rotary_embedding = _diff_llama_attention(kv_heads, layer_index)
  layer = layers.DifferentialAttention(
      4, 8, num_key_value_heads=kv_heads, layer_index=layer_index,
      rotary_base=10000.0)
  probe = tf.zeros([1, 2, 16])
  layer(probe, probe)

  def kernel(linear, heads):  # [heads * d, width] -> [width, heads, d]
    return linear.weight.detach().numpy().T.reshape(16, heads, 8)

  layer.set_weights(
      [getattr(attention, name).detach().numpy()
       for name in differential.LAMBDA_WEIGHTS] +
      [kernel(attention.q_proj, 4) * 8 ** -0.5,
       kernel(attention.k_proj, kv_heads), kernel(attention.v_proj, kv_heads),
       attention.o_proj.weight.detach().numpy().T.reshape(2, 16, 16)])
  x = np.random.default_rng(1).normal(size=(2, 7, 16)).astype(np.float32)
  hidden = torch.from_numpy(x)
  causal = torch.full((7, 7), torch.finfo(torch.float32).min).triu(1)
  with torch.no_grad():
    want = attention(hidden, rotary_embedding(
        hidden, torch.arange(7)[None].repeat(2, 1)),
                     attention_mask=causal[None, None])[0].numpy()
  got = layer(x, x, use_causal_mask=True).numpy()
  np.testing.assert_allclose(got, want, rtol=0,
                             atol=2e-5 * np.abs(want).max())


def test_cached_decoding_equals_the_causal_pass():
  layer = layers.DifferentialAttention(4, 4, num_key_value_heads=2,
                                       layer_index=1, rotary_base=10000.0)
  x = np.random.default_rng(2).normal(size=(2, 6, 8)).astype("float32")
  whole = layer(x, x, use_causal_mask=True).numpy()
  cache = layer.initial_cache(2, 6)
  assert cache["value"].shape == (2, 6, 2, 4)  # N_kv heads of K, as made
  steps = []
  for step in range(0, 6, 2):
    y, cache = layer(x[:, step:step + 2], x[:, step:step + 2], cache=cache,
                     decode_step=step)
    steps.append(y.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-5, atol=1e-5)


def test_a_config_rebuilds_the_layer():
  layer = layers.DifferentialAttention(4, 4, num_key_value_heads=2,
                                       layer_index=5, norm_epsilon=1e-6,
                                       use_gate=True)
  x = np.random.default_rng(3).normal(size=(1, 3, 8)).astype("float32")
  y = layer(x, x).numpy()
  again = layers.DifferentialAttention.from_config(layer.get_config())
  again.set_weights(layer.get_weights())
  np.testing.assert_array_equal(again(x, x).numpy(), y)
  assert again.lambda_init == pytest.approx(0.8 - 0.6 * np.exp(-1.5))
  _, scores = layer(x, x, return_attention_scores=True)
  assert scores.shape == (1, 2, 3, 3)  # U: N/2 differences of maps


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_heads=3, key_dim=4), "num_heads .* must be even; got "
                                   "num_heads=3"),
    (dict(num_heads=4, key_dim=4, value_dim=8),
     "value_dim must be None or key_dim=4; got value_dim=8"),
    (dict(num_heads=4, key_dim=4, num_key_value_heads=3),
     "num_key_value_heads=3 must divide num_heads=4"),
    (dict(num_heads=4, key_dim=4, layer_index=-1),
     "layer_index must be an integer >= 0, got -1"),
])
def test_bad_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.DifferentialAttention(**kwargs)
