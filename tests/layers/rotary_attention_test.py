"""Attention with rotary position embeddings (`rotary_base`, `rotary_pct`,
`rotary_scaling`) in thattn.layers, against transformers' Llama and
GPT-NeoX attention.

A Llama 3.2-style layer (32 query heads are too many for a test: 4 over 2
KV heads, the `llama3` scaling) and a Pythia-style one (a quarter of each
head turned, biases) with transformers' weights give transformers'
outputs; queries and keys turn by position before the
logits, cached keys as they were written, so cached decoding equals the
whole sequence; and talking heads takes the same rotations.
"""

import numpy as np
import pytest
import tensorflow as tf

from thattn import layers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WIDTH, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 8
SCALING = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}


def _llama_attention():
  from transformers.models.llama import modeling_llama  # pylint: disable=g-import-not-at-top
  config = transformers.LlamaConfig(
      hidden_size=WIDTH, num_attention_heads=HEADS,
      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
      max_position_embeddings=4096, attention_bias=False,
      rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                           **SCALING))
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(0)
  attention = modeling_llama.LlamaAttention(config, layer_idx=0).eval()
  for weight in attention.parameters():
    torch.nn.init.normal_(weight, std=0.3)
  return attention, modeling_llama.LlamaRotaryEmbedding(config)


def _thattn_layer(attention):
  """thattn's MultiHeadAttention holding `attention`'s weights (thattn's
  P_q holds the d_k**-0.5 that transformers applies at run time)."""
  layer = layers.MultiHeadAttention(
      HEADS, HEAD_DIM, num_key_value_heads=KV_HEADS, rotary_base=500000.0,
      rotary_scaling=dict(SCALING, rope_type="llama3"))
  probe = tf.zeros([1, 2, WIDTH])
  layer(probe, probe)

  def kernel(linear, heads):  # [heads * d, width] -> [width, heads, d]
    return linear.weight.detach().numpy().T.reshape(WIDTH, heads, HEAD_DIM)

  layer.set_weights([
      kernel(attention.q_proj, HEADS) * HEAD_DIM ** -0.5,
      kernel(attention.k_proj, KV_HEADS), kernel(attention.v_proj, KV_HEADS),
      attention.o_proj.weight.detach().numpy().T.reshape(HEADS, HEAD_DIM,
                                                         WIDTH)])
  return layer


def test_a_llama_layer_gives_transformers_output():
  attention, rotary_embedding = _llama_attention()
  layer = _thattn_layer(attention)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 7, WIDTH)).astype(np.float32)
  hidden = torch.from_numpy(x)
  positions = torch.arange(7)[None].repeat(2, 1)
  causal = torch.full((7, 7), torch.finfo(torch.float32).min).triu(1)
  with torch.no_grad():
    want = attention(hidden, rotary_embedding(hidden, positions),
                     attention_mask=causal[None, None])[0].numpy()
  got = layer(tf.constant(x), tf.constant(x), use_causal_mask=True).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  # Without the rotation the layer is another function.
  plain = layers.MultiHeadAttention(HEADS, HEAD_DIM,
                                    num_key_value_heads=KV_HEADS)
  plain(tf.constant(x), tf.constant(x))
  plain.set_weights(layer.get_weights())
  assert not np.allclose(
      plain(tf.constant(x), tf.constant(x), use_causal_mask=True).numpy(),
      want, atol=1e-3)


@pytest.mark.parametrize("make", [
    lambda: layers.MultiHeadAttention(4, 8, num_key_value_heads=2,
                                      rotary_base=10000.0, rotary_pct=0.5),
    lambda: layers.TalkingHeadsAttention(3, 8, num_key_heads=4,
                                         num_value_heads=2,
                                         rotary_base=10000.0,
                                         dynamic_projections=["x2l"]),
], ids=["multi_head_partial", "talking_heads"])
def test_cached_decoding_turns_each_step_at_its_position(make):
  layer = make()
  rng = np.random.default_rng(1)
  x = tf.constant(rng.normal(size=(2, 6, 16)), tf.float32)
  whole = layer(x, x, use_causal_mask=True).numpy()
  cache = layer.initial_cache(2, 6)
  steps = []
  for step in range(0, 6, 2):  # two steps a call
    y, cache = layer(x[:, step:step + 2], x[:, step:step + 2], cache=cache,
                     decode_step=step)
    steps.append(y.numpy())
  np.testing.assert_allclose(np.concatenate(steps, axis=1), whole,
                             rtol=1e-5, atol=1e-5)


def test_the_config_round_trips():
  layer = layers.TalkingHeadsAttention(
      2, 8, rotary_base=500000.0, rotary_pct=0.5,
      rotary_scaling={"factor": 8.0})
  config = layer.get_config()
  assert config["rotary_base"] == 500000.0
  assert config["rotary_scaling"]["factor"] == 8.0
  again = layers.TalkingHeadsAttention.from_config(config)
  x = tf.constant(np.random.default_rng(2).normal(size=(1, 5, 6)),
                  tf.float32)
  layer(x, x)
  again(x, x)
  again.set_weights(layer.get_weights())
  np.testing.assert_allclose(again(x, x).numpy(), layer(x, x).numpy(),
                             rtol=1e-6)
  assert "rotary_base" not in layers.MultiHeadAttention(2, 4).get_config()


@pytest.mark.parametrize("kwargs, message", [
    (dict(rotary_pct=0.5), "rotary_pct=0.5 needs rotary_base"),
    (dict(rotary_scaling={"factor": 8.0}), "needs rotary_base"),
    (dict(rotary_base=10000.0, rotary_pct=0.4), "rotates 3 entries"),
    (dict(rotary_base=10000.0, rotary_scaling={"rope_type": "yarn"}),
     "rope_type='yarn' is not supported"),
    (dict(rotary_base=1.0), "base=1.0"),
])
def test_bad_rotary_arguments_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    layers.MultiHeadAttention(2, 8, **kwargs)


def test_to_keras_refuses_rotary_positions():
  layer = layers.MultiHeadAttention(2, 4, rotary_base=10000.0)
  layer(tf.zeros([1, 3, 8]), tf.zeros([1, 3, 8]))
  with pytest.raises(ValueError, match="turns queries and keys by position"):
    layers.to_keras(layer)


def test_a_pythia_layer_gives_transformers_output():
  """GPT-NeoX's attention: a quarter of each head turned, biases, the
  fused query_key_value rows laid out [heads, 3, d_k]."""
  from transformers.models.gpt_neox import modeling_gpt_neox  # pylint: disable=g-import-not-at-top
  config = transformers.GPTNeoXConfig(
      hidden_size=WIDTH, num_attention_heads=2, max_position_embeddings=64,
      attention_bias=True,
      rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                       "partial_rotary_factor": 0.25})
  config._attn_implementation = "eager"  # pylint: disable=protected-access
  torch.manual_seed(1)
  attention = modeling_gpt_neox.GPTNeoXAttention(config, layer_idx=0).eval()
  for weight in attention.parameters():
    torch.nn.init.normal_(weight, std=0.3)
  heads, head_dim = 2, WIDTH // 2
  layer = layers.MultiHeadAttention(heads, head_dim, use_bias=True,
                                    rotary_base=10000.0, rotary_pct=0.25)
  probe = tf.zeros([1, 2, WIDTH])
  layer(probe, probe)
  fused = attention.query_key_value
  kernel = fused.weight.detach().numpy().T.reshape(WIDTH, heads, 3, head_dim)
  bias = fused.bias.detach().numpy().reshape(heads, 3, head_dim)
  scale = head_dim ** -0.5
  values = {"query/kernel": kernel[:, :, 0] * scale,
            "query/bias": bias[:, 0] * scale,
            "key/kernel": kernel[:, :, 1], "key/bias": bias[:, 1],
            "value/kernel": kernel[:, :, 2], "value/bias": bias[:, 2],
            "output/kernel": attention.dense.weight.detach().numpy().T.reshape(
                heads, head_dim, WIDTH),
            "output/bias": attention.dense.bias.detach().numpy()}
  for weight in layer.weights:
    weight.assign(values["/".join(weight.name.split(":")[0].split("/")[-2:])])
  x = np.random.default_rng(3).normal(size=(2, 6, WIDTH)).astype(np.float32)
  hidden = torch.from_numpy(x)
  rotary_embedding = modeling_gpt_neox.GPTNeoXRotaryEmbedding(config)
  causal = torch.full((6, 6), torch.finfo(torch.float32).min).triu(1)
  with torch.no_grad():
    want = attention(hidden, causal[None, None], position_embeddings=(
        rotary_embedding(hidden, torch.arange(6)[None].repeat(2, 1))))[0]
  got = layer(tf.constant(x), tf.constant(x), use_causal_mask=True).numpy()
  np.testing.assert_allclose(got, want.numpy(), rtol=0,
                             atol=2e-5 * np.abs(want.numpy()).max())
