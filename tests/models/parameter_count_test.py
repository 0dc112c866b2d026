"""count_params() of the base presets equals the published parameter counts
(BERT, ALBERT, T5, and the decoder-only GPT-2, Pythia and Llama 3.2).

Each published number is also derived here term by term (the `*_count`
functions), so a mismatch shows which part of the architecture is off.
Building a base model takes a few seconds; none is run on data.
"""

import gc

import pytest
import tf_keras

from thattn import models

PUBLISHED = {
    # BERT-Base uncased with its pooler (vocab 30522, 512 positions, 2 types).
    "bert_base": 109_482_240,
    # ALBERT-base: E=128, one shared layer, vocab 30000.
    "albert_base": 11_683_584,
    # T5-Base: 12+12 layers, tied embeddings, vocab 32128.
    "t5_base": 222_903_552,
}
# Attention layers with their own weights: ALBERT shares one across layers.
ATTENTION_LAYERS = {"bert_base": 12, "albert_base": 1, "t5_base": 36}


def bert_count(vocab, positions, types, d, d_ff, layers, embedding=None,
               shared=False):
  """BERT / ALBERT parameters with biases, LayerNorms and the pooler."""
  e = embedding or d
  embeddings = (vocab + positions + types) * e + 2 * e  # tables + LayerNorm
  projection = e * d + d if e != d else 0  # ALBERT's E -> H
  attention = 4 * (d * d + d)  # P_q, P_k, P_v, P_o and their biases
  feed_forward = (d * d_ff + d_ff) + (d_ff * d + d)
  layer = attention + feed_forward + 2 * (2 * d)  # two LayerNorms
  pooler = d * d + d
  return embeddings + projection + (1 if shared else layers) * layer + pooler


def t5_count(vocab, d, d_ff, layers, heads, d_kv, buckets, gated=False,
             tied=True):
  """T5 parameters: no biases, scale-only RMSNorms, one bias table a stack."""
  attention = 4 * d * heads * d_kv
  feed_forward = (3 if gated else 2) * d * d_ff
  encoder = layers * (attention + feed_forward + 2 * d) + buckets * heads + d
  decoder = (layers * (2 * attention + feed_forward + 3 * d) +
             buckets * heads + d)
  return vocab * d * (1 if tied else 2) + encoder + decoder


def test_the_derivations_give_the_published_numbers():
  assert bert_count(30522, 512, 2, 768, 3072, 12) == PUBLISHED["bert_base"]
  assert bert_count(30000, 512, 2, 768, 3072, 12, embedding=128,
                    shared=True) == PUBLISHED["albert_base"]
  assert t5_count(32128, 768, 3072, 12, 12, 64, 32) == PUBLISHED["t5_base"]


def _attention_layers(model):
  """Every attention layer of a built model, each once."""
  found = {}
  for layer in model.submodules:
    if isinstance(layer, models.PostNormBlock):
      found[id(layer.attention)] = layer.attention
    if isinstance(layer, models.PreNormBlock):
      for attention in (layer.self_attention, layer.cross_attention):
        if attention is not None:
          found[id(attention)] = attention
  return list(found.values())


def _mixes(weights):
  """The head mixes P_l and P_w among `weights`."""
  return [weight for weight in weights if "_softmax_projection" in weight.name]


def _size(weights):
  return sum(int(weight.shape.num_elements()) for weight in weights)


def _build_and_measure(preset, **overrides):
  model = models.create_model(preset, **overrides)
  attention = _attention_layers(model)
  mixes = _mixes(model.weights)
  measured = {
      "total": model.count_params(),
      "attention_layers": len(attention),
      "per_attention_layer": {layer.count_params() for layer in attention},
      # Each layer less its own P_l and P_w: the multi-head layer's count.
      "per_attention_layer_without_mixes": {
          layer.count_params() - _size(_mixes(layer.weights))
          for layer in attention},
      "pre_softmax_projections": sum(
          "pre_softmax_projection" in weight.name for weight in mixes),
      "mix_shapes": {tuple(weight.shape) for weight in mixes},
      "mix_parameters": _size(mixes),
  }
  del model, attention, mixes
  tf_keras.backend.clear_session()
  gc.collect()
  return measured


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_published_count_and_twelve_talking_heads_add_2_h_squared(preset):
  """One build, with talking heads (a base model takes seconds to build
  on 2 cores): without its P_l and P_w it has the published multi-head
  count, and they add 2 h^2 per attention layer, nothing else."""
  talking = _build_and_measure(preset, attention="talking_heads")
  assert talking["attention_layers"] == ATTENTION_LAYERS[preset]
  # P_l[12, 12] and P_w[12, 12] in every attention layer.
  assert talking["pre_softmax_projections"] == ATTENTION_LAYERS[preset]
  assert talking["mix_shapes"] == {(12, 12)}
  assert talking["mix_parameters"] == ATTENTION_LAYERS[preset] * 2 * 12 * 12
  assert talking["total"] - talking["mix_parameters"] == PUBLISHED[preset]
  if preset == "t5_base":
    # The paper's Table 1, "parameters per att. layer" (no biases in T5).
    # Both columns: talking heads', and multi-head's without P_l and P_w.
    assert talking["per_attention_layer"] == {2_359_584}
    assert talking["per_attention_layer_without_mixes"] == {2_359_296}
  else:  # BERT and ALBERT add the four projection biases.
    assert talking["per_attention_layer"] == {
        4 * 768 * 768 + 4 * 768 + 2 * 12 * 12}
    assert talking["per_attention_layer_without_mixes"] == {
        4 * 768 * 768 + 4 * 768}


def test_the_multi_head_preset_has_no_head_mixes():
  multi_head = _build_and_measure("albert_base")  # the fastest to build
  assert multi_head["total"] == PUBLISHED["albert_base"]
  assert multi_head["pre_softmax_projections"] == 0
  assert multi_head["mix_parameters"] == 0


def test_fixed_head_size_preset_matches_bhojanapalli_table_3a():
  # 24 layers of width 768 with 8 heads of size 128: "214M" in their
  # Table 3(A), which counts BERT's pre-training head too: a 768 x 768
  # transform with bias, its LayerNorm, and the output bias over the vocab.
  measured = _build_and_measure("bert_fixed_head_128_h8")
  masked_lm_head = 768 * 768 + 768 + 2 * 768 + 30522
  assert round((measured["total"] + masked_lm_head) / 1e6) == 214
  # P_q, P_k, P_v: [768, 8, 128] and biases; P_o: [8, 128, 768] and bias.
  assert measured["per_attention_layer"] == {4 * 768 * 1024 + 3 * 1024 + 768}


# ---- decoder-only LMs -------------------------------------------------------
# transformers 5.24's count of each released model (GPT2LMHeadModel,
# GPTNeoXForCausalLM, LlamaForCausalLM built from its config.json on the
# meta device; a tied table once).
DECODER_PUBLISHED = {
    "gpt2": 124_439_808,
    "pythia_160m": 162_322_944,
    "pythia_410m": 405_334_016,
    "llama_3_2_1b": 1_235_814_400,
}


def decoder_count(vocab, d, d_ff, layers, heads, d_k, kv_heads=None,
                  positions=0, biases=True, gated=False, norm_weights=2,
                  tied=True):
  """A decoder-only LM's parameters: the tables (tokens, learned positions,
  an untied output), per layer P_q and P_o over h heads and P_k and P_v
  over h_kv, the feed-forward network, two norms (LayerNorm: scale and
  bias, `norm_weights`=2; RMSNorm: 1), and the final norm."""
  kv_heads = kv_heads or heads
  attention = 2 * d * heads * d_k + 2 * d * kv_heads * d_k
  if biases:  # P_q's [h, d_k], P_k's and P_v's [h_kv, d_k], P_o's [d]
    attention += heads * d_k + 2 * kv_heads * d_k + d
  feed_forward = (3 if gated else 2) * d * d_ff
  if biases:
    feed_forward += d_ff + d
  layer = attention + feed_forward + 2 * norm_weights * d
  tables = vocab * d * (1 if tied else 2) + positions * d
  return tables + layers * layer + norm_weights * d


def test_the_decoder_derivations_give_the_published_numbers():
  assert decoder_count(50257, 768, 3072, 12, 12, 64,
                       positions=1024) == DECODER_PUBLISHED["gpt2"]
  assert decoder_count(50304, 768, 3072, 12, 12, 64,
                       tied=False) == DECODER_PUBLISHED["pythia_160m"]
  assert decoder_count(50304, 1024, 4096, 24, 16, 64,
                       tied=False) == DECODER_PUBLISHED["pythia_410m"]
  assert decoder_count(128256, 2048, 8192, 16, 32, 64, kv_heads=8,
                       biases=False, gated=True,
                       norm_weights=1) == DECODER_PUBLISHED["llama_3_2_1b"]


def _count(preset, **overrides):
  model = models.create_model(preset, **overrides)
  total = model.count_params()
  del model
  tf_keras.backend.clear_session()
  gc.collect()
  return total


@pytest.mark.parametrize("preset", ["gpt2", "pythia_160m"])
def test_the_small_decoder_presets_have_the_published_count(preset):
  assert _count(preset) == DECODER_PUBLISHED[preset]


@pytest.mark.parametrize("preset, layers", [("pythia_410m", 24),
                                            ("llama_3_2_1b", 16)])
def test_the_large_decoder_presets_count_layer_by_layer(preset, layers):
  """Built with one and with two of their layers (the whole tables, every
  layer alike): what is fixed plus `layers` times one layer is the
  published count, as a whole build would give it."""
  one, two = _count(preset, num_layers=1), _count(preset, num_layers=2)
  assert one + (layers - 1) * (two - one) == DECODER_PUBLISHED[preset]


def test_talking_heads_on_llama_adds_two_h_squared_a_layer():
  """P_l[h_k, h] and P_w[h, h_v] mix all 32 query heads, over the 8
  shared key and value heads: 2 * 32^2 per layer."""
  multi_head = _count("llama_3_2_1b", num_layers=1, vocab_size=8)
  talking = _count("llama_3_2_1b", num_layers=1, vocab_size=8,
                   attention="talking_heads")
  assert talking - multi_head == 2 * 32 * 32


def test_dcformer_2p8b_counts_its_state_dict():
  """DCFormer-2.8B's state dict (docs/family_sources.md, 1.2), without the
  derived dw_m and qkw_m and the identity buffers: a Llama-shaped LM
  with untied tables, and per layer DCMHA's dw1, qkw and dd (1,703,936)
  and the q/k norms' scales (2 * 80). Built with one and two layers and
  a vocabulary of 8; the whole model is 2,849,567,232."""
  def released(vocab, layers):
    return (decoder_count(vocab, 2560, 6912, layers, 32, 80, biases=False,
                          gated=True, norm_weights=1, tied=False) +
            layers * (1_703_936 + 2 * 80))
  assert released(50257, 32) == 2_849_567_232
  one = _count("dcformer_2p8b", num_layers=1, vocab_size=8)
  two = _count("dcformer_2p8b", num_layers=2, vocab_size=8)
  assert (one, two) == (released(8, 1), released(8, 2))
