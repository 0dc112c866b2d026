"""thattn.ops.rotary against transformers' rotary embeddings, the float64
rotation matrices of tests/layers/numpy_reference.py, and RoPE's
identities, on tf_keras's ops namespace (each Keras 3 backend runs the
same comparison with `keras.ops`: tests/keras3/backend_checks.py).

transformers' Llama and GPT-NeoX code is the anchor: a model converted
from there must see its angles (the default frequencies, Llama 3.2's
`llama3` scaling, Pythia's partial rotation), in its float32 order.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests.layers import numpy_reference as ref
from thattn.ops import rotary
from thattn.ops import tf_ops

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Llama 3.2 1B's config.json: head_dim 64, rope_theta 500000, and its
# rope_scaling.
LLAMA_3_2 = rotary.Llama3Scaling(factor=32.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0,
                                 original_max_position_embeddings=8192)


def _hf_llama_rotary(head_dim, theta, scaling=None):
  from transformers.models.llama import modeling_llama  # pylint: disable=g-import-not-at-top
  parameters = {"rope_type": "default", "rope_theta": theta}
  if scaling is not None:
    parameters = {"rope_type": "llama3", "rope_theta": theta,
                  "factor": scaling.factor,
                  "low_freq_factor": scaling.low_freq_factor,
                  "high_freq_factor": scaling.high_freq_factor,
                  "original_max_position_embeddings":
                      scaling.original_max_position_embeddings}
  config = transformers.LlamaConfig(
      hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
      max_position_embeddings=131072, rope_parameters=parameters)
  return (modeling_llama.LlamaRotaryEmbedding(config),
          modeling_llama.apply_rotary_pos_emb)


def _hf_neox_rotary(head_dim, rotary_pct, theta=10000.0):
  from transformers.models.gpt_neox import modeling_gpt_neox  # pylint: disable=g-import-not-at-top
  config = transformers.GPTNeoXConfig(
      hidden_size=head_dim * 2, num_attention_heads=2,
      max_position_embeddings=2048,
      rope_parameters={"rope_type": "default", "rope_theta": theta,
                       "partial_rotary_factor": rotary_pct})
  return (modeling_gpt_neox.GPTNeoXRotaryEmbedding(config),
          modeling_gpt_neox.apply_rotary_pos_emb)


def _inputs(rng, key_dim, batch=2, n=5, heads=3):
  x = rng.normal(size=(batch, n, heads, key_dim)).astype(np.float32)
  # Each row at its own offset, as a batch of decoding steps is.
  positions = (np.arange(n)[None] + np.array([[0], [1000]])[:batch]).astype(
      np.int32)
  return x, positions


def _hf_apply(embedding, apply, x, positions):
  """transformers' rotation of x [b, n, heads, k] (its q and k are
  [b, heads, n, k]): the query's and the key's, which must agree."""
  q = torch.from_numpy(x).transpose(1, 2)
  cos, sin = embedding(q, torch.from_numpy(positions).long())
  q_out, k_out = apply(q, q.clone(), cos, sin)
  np.testing.assert_array_equal(q_out.numpy(), k_out.numpy())
  return q_out.transpose(1, 2).numpy()


def _turned(x, positions, frequencies):
  return rotary.apply(tf_ops.TF_OPS, tf.constant(x), tf.constant(positions),
                      frequencies).numpy()


# The frequencies are compared to within a few float32 ulps, and the
# rotation given transformers' own frequencies: PyTorch's float32 pow,
# vectorized per CPU, can land one ulp from NumPy's (seen on an AVX-512
# machine), and at position 1000 one ulp of theta moves an angle by 6e-5.
@pytest.mark.parametrize("theta, scaling", [
    (10000.0, None), (500000.0, None), (500000.0, LLAMA_3_2)],
                         ids=["llama2", "llama3_unscaled", "llama_3_2"])
def test_the_frequencies_and_rotation_are_transformers_llamas(theta,
                                                              scaling):
  embedding, apply = _hf_llama_rotary(64, theta, scaling)
  frequencies = rotary.frequencies(64, base=theta, scaling=scaling)
  np.testing.assert_allclose(frequencies, embedding.inv_freq.numpy(),
                             rtol=1e-6, atol=0)
  x, positions = _inputs(np.random.default_rng(0), 64)
  np.testing.assert_allclose(
      _turned(x, positions, embedding.inv_freq.numpy()),
      _hf_apply(embedding, apply, x, positions), rtol=0, atol=2e-5)
  got = _turned(x, positions, frequencies)
  want = ref.rotary(x, positions, ref.rotary_frequencies(
      64, theta, None if scaling is None else (
          scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
          scaling.original_max_position_embeddings)))
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def test_the_llama3_scaling_slows_only_the_long_wavelengths():
  plain = rotary.frequencies(64, base=500000.0)
  scaled = rotary.frequencies(64, base=500000.0, scaling=LLAMA_3_2)
  wavelength = 2 * np.pi / plain
  short = wavelength < 8192 / 4
  long = wavelength > 8192 / 1
  assert short.any() and long.any() and (~short & ~long).any()
  np.testing.assert_array_equal(scaled[short], plain[short])
  np.testing.assert_allclose(scaled[long], plain[long] / 32, rtol=1e-6)
  between = ~short & ~long
  assert np.all(scaled[between] < plain[between])
  assert np.all(scaled[between] > plain[between] / 32)


@pytest.mark.parametrize("key_dim, rotary_pct", [(64, 0.25), (24, 0.5)])
def test_pythias_partial_rotation_is_transformers_gpt_neox(key_dim,
                                                           rotary_pct):
  embedding, apply = _hf_neox_rotary(key_dim, rotary_pct)
  rotated = rotary.rotated_size(key_dim, rotary_pct)
  assert rotated == int(key_dim * rotary_pct)
  frequencies = rotary.frequencies(rotated)
  np.testing.assert_allclose(frequencies, embedding.inv_freq.numpy(),
                             rtol=1e-6, atol=0)
  x, positions = _inputs(np.random.default_rng(1), key_dim)
  np.testing.assert_allclose(
      _turned(x, positions, embedding.inv_freq.numpy()),
      _hf_apply(embedding, apply, x, positions), rtol=0, atol=2e-5)
  got = _turned(x, positions, frequencies)
  # The entries past the rotated ones pass through untouched.
  np.testing.assert_array_equal(got[..., rotated:], x[..., rotated:])
  np.testing.assert_allclose(
      got, ref.rotary(x, positions, ref.rotary_frequencies(rotated, 1e4)),
      rtol=0, atol=2e-4)


def test_rotation_keeps_norms_and_logits_depend_on_the_offset_alone():
  """RoFormer's property: <R(p) q, R(p') k> is a function of p - p'."""
  rng = np.random.default_rng(2)
  q, _ = _inputs(rng, 16, batch=1, n=4)
  k, _ = _inputs(rng, 16, batch=1, n=4)
  frequencies = rotary.frequencies(16)

  def logits(shift):
    positions = np.arange(4, dtype=np.int32)[None] + shift
    turned_q, turned_k = (rotary.apply(tf_ops.TF_OPS, tf.constant(t),
                                       tf.constant(positions),
                                       frequencies).numpy() for t in (q, k))
    np.testing.assert_allclose(np.linalg.norm(turned_q, axis=-1),
                               np.linalg.norm(q, axis=-1), rtol=1e-5)
    return np.einsum("bnik,bmik->bnmi", turned_q, turned_k)

  np.testing.assert_allclose(logits(37), logits(0), rtol=0, atol=1e-4)


def test_the_rotation_keeps_bfloat16():
  x, positions = _inputs(np.random.default_rng(3), 8)
  got = rotary.apply(tf_ops.TF_OPS, tf.constant(x, tf.bfloat16),
                     tf.constant(positions), rotary.frequencies(8))
  assert got.dtype == tf.bfloat16 and got.shape == x.shape


@pytest.mark.parametrize("call, message", [
    (lambda: rotary.rotated_size(64, 0.3), "rotates 19 entries"),
    (lambda: rotary.rotated_size(64, 0), "rotary_pct=0"),
    (lambda: rotary.rotated_size(64, 1.5), "rotary_pct=1.5"),
    (lambda: rotary.rotated_size(0), "key_dim"),
    (lambda: rotary.frequencies(7), "rotated=7"),
    (lambda: rotary.frequencies(8, base=1), "base=1"),
    (lambda: rotary.frequencies(8, scaling={"factor": 8}), "scaling="),
    (lambda: rotary.Llama3Scaling(factor=0), "factor=0"),
    (lambda: rotary.Llama3Scaling(low_freq_factor=4.0, high_freq_factor=1.0),
     "high_freq_factor=1.0"),
    (lambda: rotary.Llama3Scaling(original_max_position_embeddings=0),
     "original_max_position_embeddings"),
])
def test_bad_values_are_named(call, message):
  with pytest.raises(ValueError, match=message):
    call()
