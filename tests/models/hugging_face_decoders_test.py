"""Hugging Face GPT-2, Llama, GPT-NeoX and DiffLlama folders into thattn's
decoder-only LM, against transformers.

Each source is a tiny model that transformers makes and saves with
`save_pretrained`, its weights redrawn at a scale where attention is not
uniform and continuations vary: GPT-2 (learned positions, tied), Llama (4 query heads over 2 key
and value heads, the `llama3` rope scaling, untied) and GPT-NeoX (a quarter
of each head rotated, the parallel residual, biases). The thattn model the
map fills gives transformers' logits within 1e-5 of their scale, as
multi-head attention and as the projected variants started at the
identity, and its greedy and beam-search continuations (with the caches)
are transformers' `generate`'s; what thattn cannot represent is refused by
name. A DiffLlama (differential attention over shared key and value heads,
its own rms_norm_eps) converts as differential attention only, with the
same logits and continuations, through `thattn-convert`'s
`converters.convert` too.
"""

import json

import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers

from thattn import converters
from thattn import models
from thattn.core import weight_maps
from thattn.models import hugging_face_decoders

VOCAB = 96
_LLAMA_SCALING = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                      low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)
SOURCES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters=_LLAMA_SCALING, tie_word_embeddings=False)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(
        transformers.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, use_parallel_residual=True,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                 partial_rotary_factor=0.25))),
}
# Sources of another variant than multi-head, converted as that variant:
# DiffLlama, 4 maps over 2 key and value heads, three layers (three
# lambda_init), rms_norm_eps 1e-6 (its heads' RMSNorm's too); Qwen3-Next
# with full attention and dense MLPs in every layer (the gate in q_proj,
# the q/k norms, a quarter of each head rotated, the (1 + w) norms).
HELD_SOURCES = {
    "diffllama": lambda: transformers.DiffLlamaForCausalLM(
        transformers.DiffLlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
            num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            rms_norm_eps=1e-6, tie_word_embeddings=False)),
    "qwen3_next": lambda: transformers.Qwen3NextForCausalLM(
        transformers.Qwen3NextConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            layer_types=["full_attention"] * 2, num_experts=0,
            rms_norm_eps=1e-6, tie_word_embeddings=False)),
}


def _saved(model_type, tmp_path_factory):
  """(model_type, the transformers model, its saved folder)."""
  torch.manual_seed(0)
  model = {**SOURCES, **HELD_SOURCES}[model_type]().eval()
  with torch.no_grad():
    for name, weight in model.named_parameters():
      # Biases small: at the weights' scale they would pick one token
      # whatever the input (GPT-NeoX's greedy continuations all 57).
      weight.normal_(0.0, 0.05 if name.endswith("bias") else 0.3)
  folder = tmp_path_factory.mktemp("hf") / model_type
  model.save_pretrained(folder)
  return model_type, model, folder


@pytest.fixture(scope="module", params=sorted(SOURCES))
def source(request, tmp_path_factory):
  return _saved(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  return _saved("llama", tmp_path_factory)


def _tokens():
  return np.random.default_rng(0).integers(0, VOCAB, size=(2, 9),
                                           dtype=np.int32)


def _reference_logits(model, tokens):
  with torch.no_grad():
    return model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


def _converted(folder, attention="multi_head"):
  read = hugging_face_decoders.read(str(folder), attention)
  model = models.create_model(read.config)
  values = weight_maps.plan(model, read.arrays, read.rules,
                            dropped=read.dropped, source=str(folder))
  weight_maps.assign(model, values)
  return read.config, model


def _assert_close(got, want):
  np.testing.assert_allclose(got, want, rtol=0,
                             atol=1e-5 * np.abs(want).max())


def test_the_config_carries_the_shape_over(source):
  model_type, _, folder = source
  config, _ = _converted(folder)
  expected = {
      "gpt2": dict(position_embedding="learned", norm="layer_norm",
                   activation="gelu_approximate", tie_embeddings=True,
                   parallel_residual=False),
      "llama": dict(position_embedding="rotary", norm="rms_norm",
                    activation="silu", gated_feed_forward=True,
                    use_bias=False, tie_embeddings=False,
                    rotary_base=500000.0),
      "gpt_neox": dict(position_embedding="rotary", norm="layer_norm",
                       activation="gelu", parallel_residual=True,
                       rotary_pct=0.25, tie_embeddings=False),
  }[model_type]
  assert {name: getattr(config, name) for name in expected} == expected
  if model_type == "llama":
    assert config.attention.num_key_value_heads == 2
    assert config.rotary_scaling["factor"] == 32.0


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_logits_equal_transformers(source, attention):
  _, reference, folder = source
  tokens = _tokens()
  want = _reference_logits(reference, tokens)
  _, model = _converted(folder, attention)
  got = model({"decoder_input_tokens": tf.constant(tokens)}).numpy()
  _assert_close(got, want)


@pytest.mark.parametrize("attention", ["project_logits", "project_weights",
                                       "dynamic", "dcmha"])
def test_every_projected_variant_starts_at_the_llama_logits(llama,
                                                           attention):
  """On the grouped-query source, the one with the most to check."""
  _, reference, folder = llama
  tokens = _tokens()
  _, model = _converted(folder, attention)
  got = model({"decoder_input_tokens": tf.constant(tokens)}).numpy()
  _assert_close(got, _reference_logits(reference, tokens))


def test_a_missing_weight_is_named_and_nothing_assigned(source, tmp_path):
  model_type, _, folder = source
  read = hugging_face_decoders.read(str(folder), "multi_head")
  arrays = dict(read.arrays)
  name = sorted(arrays)[0]
  del arrays[name]
  model = models.create_model(read.config)
  with pytest.raises(ValueError, match=f"has no {name}"):
    weight_maps.plan(model, arrays, read.rules, dropped=read.dropped,
                     source=model_type)


@pytest.mark.parametrize("change, message", [
    (dict(model_type="llama", rope_scaling={"rope_type": "yarn",
                                            "factor": 4.0}),
     "rope_type='yarn'"),
    (dict(model_type="llama", sliding_window=4096), "sliding_window=4096"),
    (dict(model_type="llama", attention_bias=True, mlp_bias=False),
     "attention_bias, mlp_bias"),
    (dict(model_type="gpt2", scale_attn_by_inverse_layer_idx=True),
     "scale_attn_by_inverse_layer_idx=True"),
    (dict(model_type="gpt2", activation_function="swish"),
     "activation_function='swish'"),
    (dict(model_type="gpt_neox", attention_bias=False), "attention_bias"),
    (dict(model_type="mistral"), "model_type='mistral'"),
    (dict(model_type="qwen3_next", layer_types=["linear_attention"]),
     r"layer_types=\['linear_attention'\].*layers \[0\] are not"),
    (dict(model_type="qwen3_next", num_experts=4),
     r"num_experts=4.*layers \[0\] would be mixtures of experts"),
])
def test_what_thattn_cannot_represent_is_refused_by_name(change, message):
  base = {
      "gpt2": transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4),
      "llama": transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4,
                                        intermediate_size=64),
      "gpt_neox": transformers.GPTNeoXConfig(hidden_size=32,
                                             num_hidden_layers=1,
                                             num_attention_heads=4,
                                             intermediate_size=64),
      "qwen3_next": transformers.Qwen3NextConfig(
          hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
          intermediate_size=64, layer_types=["full_attention"],
          num_experts=0),
  }.get(change["model_type"], transformers.LlamaConfig()).to_dict()
  hf_config = dict(base, **change)
  attention = hugging_face_decoders.SOURCE_ATTENTION.get(
      change["model_type"], "multi_head")
  with pytest.raises(ValueError, match=message):
    hugging_face_decoders.decoder_config(hf_config, "/some/folder",
                                         attention)


def test_the_released_files_rope_keys_read_as_transformers_5s():
  """Released Llama 3.2 and Pythia config.json files spell the rotary
  settings as rope_theta / rope_scaling and rotary_emb_base / rotary_pct."""
  released_llama = dict(
      rope_theta=500000.0,
      rope_scaling=dict(factor=32.0, high_freq_factor=4.0,
                        low_freq_factor=1.0,
                        original_max_position_embeddings=8192,
                        rope_type="llama3"))
  assert hugging_face_decoders.rotary_settings(released_llama, "x") == (
      500000.0, 1.0, dict(factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0,
                          original_max_position_embeddings=8192))
  released_pythia = dict(rotary_emb_base=10000, rotary_pct=0.25)
  assert hugging_face_decoders.rotary_settings(released_pythia, "x") == (
      10000.0, 0.25, None)


def _reference_continuation(model, prompt, steps, **options):
  with torch.no_grad():
    out = model.generate(torch.from_numpy(prompt.astype(np.int64)),
                         max_new_tokens=steps, do_sample=False,
                         eos_token_id=None, pad_token_id=0, **options)
  return out.numpy()[:, prompt.shape[1]:]


def test_greedy_and_beam_continuations_equal_transformers_generate(source):
  """Greedy and 3-beam search (no end token, so every beam is as long and
  no length penalty can reorder them) after the converted talking-heads
  model's prompt pass: transformers' tokens, decoded with the caches."""
  _, reference, folder = source
  _, model = _converted(folder, "talking_heads")
  prompt = np.random.default_rng(3).integers(0, VOCAB, size=(2, 4),
                                             dtype=np.int32)
  greedy = _reference_continuation(reference, prompt, 6)
  assert len(np.unique(greedy)) > 2  # not one token over and over
  np.testing.assert_array_equal(
      models.generate(model, prompt, max_length=6)["tokens"].numpy(),
      greedy)
  beams = _reference_continuation(reference, prompt, 5, num_beams=3,
                                  length_penalty=0.0, early_stopping=True)
  np.testing.assert_array_equal(
      models.generate(model, prompt, max_length=5, method="beam",
                      beam_size=3)["tokens"].numpy(), beams)


# ---- DiffLlama: differential attention, converted as itself -----------------


@pytest.fixture(scope="module")
def diff_llama(tmp_path_factory):
  """(the transformers DiffLlamaForCausalLM, its saved folder)."""
  _, model, folder = _saved("diffllama", tmp_path_factory)
  return model, folder


def test_a_diff_llama_folder_gives_transformers_logits_and_continuations(
    diff_llama):
  reference, folder = diff_llama
  config, model = _converted(folder, "differential")
  assert (config.attention.variant, config.layer_norm_epsilon) == (
      "differential", 1e-6)
  # lambda_init by depth; the heads' RMSNorm takes rms_norm_eps.
  assert [(layer.layer_index, layer.norm_epsilon) for layer in
          model.submodules if type(layer).__name__ ==
          "DifferentialAttention"] == [(0, 1e-6), (1, 1e-6), (2, 1e-6)]
  tokens = _tokens()
  _assert_close(model({"decoder_input_tokens": tf.constant(tokens)}).numpy(),
                _reference_logits(reference, tokens))
  prompt = np.random.default_rng(3).integers(0, VOCAB, size=(2, 4),
                                             dtype=np.int32)
  np.testing.assert_array_equal(
      models.generate(model, prompt, max_length=6)["tokens"].numpy(),
      _reference_continuation(reference, prompt, 6))


def test_a_diff_llama_folder_converts_as_differential_only(diff_llama,
                                                          tmp_path):
  reference, folder = diff_llama
  out = tmp_path / "converted"
  config = converters.convert(source=str(folder), model_dir=str(out),
                              log=lambda line: None)
  assert config.attention.variant == "differential"
  run_config = json.loads((out / "run_config.json").read_text())
  assert run_config["converted_from"]["attention"] == "differential"
  tokens = _tokens()
  _assert_close(
      models.load(str(out))({"decoder_input_tokens": tf.constant(tokens)})
      .numpy(), _reference_logits(reference, tokens))
  with pytest.raises(ValueError, match=r"holds differential attention, "
                     r"which converts only as itself"):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "th"),
                       attention="talking_heads")
  with pytest.raises(ValueError, match="attention='multi_head'; thattn "
                     "represents only DiffLlama's differential attention"):
    hugging_face_decoders.read(str(folder), "multi_head")
  assert not (tmp_path / "th").exists()


# ---- Qwen3-Next: gated attention, converted as itself ----------------------


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
  """(the transformers Qwen3NextForCausalLM, its saved folder)."""
  _, model, folder = _saved("qwen3_next", tmp_path_factory)
  return model, folder


def test_a_qwen3_next_folder_converts_as_gated_attention(qwen3_next,
                                                         tmp_path):
  reference, folder = qwen3_next
  out = tmp_path / "converted"
  config = converters.convert(source=str(folder), model_dir=str(out),
                              log=lambda line: None)
  assert (config.attention.variant, config.query_key_norm,
          config.rotary_pct) == ("gated", True, 0.25)
  model = models.load(str(out))
  tokens = _tokens()
  _assert_close(model({"decoder_input_tokens": tf.constant(tokens)}).numpy(),
                _reference_logits(reference, tokens))
  prompt = np.random.default_rng(3).integers(0, VOCAB, size=(2, 4),
                                             dtype=np.int32)
  np.testing.assert_array_equal(
      models.generate(model, prompt, max_length=6)["tokens"].numpy(),
      _reference_continuation(reference, prompt, 6))
  with pytest.raises(ValueError, match=r"holds gated attention, which "
                     r"converts only as itself"):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "mh"),
                       attention="multi_head")



# ---- Qwen3 (transformers'): multi-head attention with the q/k norm --------


@pytest.mark.parametrize("attention", ["multi_head", "dcmha"])
def test_a_qwen3_folder_gives_transformers_logits(attention,
                                                  tmp_path_factory):
  """transformers' Qwen3: Llama's layout with the queries' and keys'
  RMSNorm, plain scales (not Qwen3-Next's 1 + w); a multi-head source, so
  DCMHA starts at its logits too. The gated-attention paper's Qwen3
  folders, which carve a gate from q_proj: tests/models/
  qwen3_gated_test.py."""
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6,
      tie_word_embeddings=False)).eval()
  with torch.no_grad():
    for name, weight in model.named_parameters():
      if name.endswith("norm.weight"):
        weight.copy_(1.0 + 0.1 * torch.randn(weight.shape))
      else:
        weight.normal_(0.0, 0.3)
  folder = tmp_path_factory.mktemp("hf") / "qwen3"
  model.save_pretrained(folder)
  assert hugging_face_decoders.source_attention(str(folder)) == "multi_head"
  config, converted = _converted(folder, attention)
  assert (config.query_key_norm, config.query_key_norm_epsilon()) == (True,
                                                                      1e-6)
  tokens = _tokens()
  _assert_close(
      converted({"decoder_input_tokens": tf.constant(tokens)}).numpy(),
      _reference_logits(model, tokens))
