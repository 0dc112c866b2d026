"""Whole models: mtf model_dirs -> thattn model_dirs -> mtf, and their logits.

The mtf side is Mesh TensorFlow itself: the Bitransformer is built from a
gin config by `mesh_tensorflow.transformer`, initialized by mtf, saved as a
TF1 checkpoint under T5's variable names, and its logits are mtf's
(`thattn.mtf.models.logits`, one device, EVAL mode).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from thattn import models
from thattn.io import run_dir
from thattn.converters import model_dir as converters_model_dir
from thattn.data import tokenizers
from thattn.mtf import architecture
from thattn.mtf import convert
from thattn.mtf import models as mtf_models

TL = "@mesh_tensorflow.transformer.transformer_layers"
VOCAB = 1024  # the conftest SentencePiece model's 1000, padded as mtf pads

_COMMON = f"""
import mesh_tensorflow.transformer.transformer_layers
Bitransformer.shared_embedding = True
Unitransformer.d_model = 16
Unitransformer.positional_embedding = False
encoder/make_layer_stack.num_layers = 2
decoder/make_layer_stack.num_layers = 2
relative_attention_type = "bias_shared"
SelfAttention.relative_attention_type = %relative_attention_type
TalkingHeadsSelfAttention.relative_attention_type = %relative_attention_type
GeneralBilinearSelfAttention.relative_attention_type = %relative_attention_type
SelfAttention.relative_attention_num_buckets = 8
TalkingHeadsSelfAttention.relative_attention_num_buckets = 8
GeneralBilinearSelfAttention.relative_attention_num_buckets = 8
"""

# T5 1.0's layout (tied embeddings, ReLU): multi-head everywhere.
T5_1_0 = _COMMON + f"""
Unitransformer.shared_embedding_and_softmax_weights = True
encoder/make_layer_stack.layers = [{TL}.SelfAttention, {TL}.DenseReluDense]
decoder/make_layer_stack.layers = [
    {TL}.SelfAttention, {TL}.EncDecAttention, {TL}.DenseReluDense]
SelfAttention.num_heads = 2
SelfAttention.key_value_size = 8
EncDecAttention.num_heads = 2
EncDecAttention.key_value_size = 8
DenseReluDense.hidden_size = 32
"""

# The model: talking heads with h_k != h != h_v in both
# self-attentions, dynamic projections in the decoder's, multi-head enc-dec
# attention; T5.1.1's untied logits and gated GELU.
TALKING_HEADS = _COMMON + f"""
Unitransformer.shared_embedding_and_softmax_weights = False
encoder/make_layer_stack.layers = [
    {TL}.TalkingHeadsSelfAttention, {TL}.DenseReluDense]
decoder/make_layer_stack.layers = [
    [{TL}.TalkingHeadsSelfAttention,
     {{"dynamic_projections": ["x2l", "m2w"]}}],
    {TL}.EncDecAttention, {TL}.DenseReluDense]
TalkingHeadsSelfAttention.key_heads_dims = [("key_heads", 2)]
TalkingHeadsSelfAttention.softmax_heads_dims = [("heads", 3)]
TalkingHeadsSelfAttention.value_heads_dims = [("value_heads", 4)]
TalkingHeadsSelfAttention.key_size = 8
TalkingHeadsSelfAttention.value_size = 6
EncDecAttention.num_heads = 2
EncDecAttention.key_value_size = 8
DenseReluDense.hidden_size = 24
DenseReluDense.activation = ["gelu", "linear"]
"""

GENERAL_BILINEAR = _COMMON + f"""
Unitransformer.shared_embedding_and_softmax_weights = True
encoder/make_layer_stack.layers = [
    {TL}.GeneralBilinearSelfAttention, {TL}.DenseReluDense]
decoder/make_layer_stack.layers = [
    {TL}.GeneralBilinearSelfAttention, {TL}.GeneralBilinearEncDecAttention,
    {TL}.DenseReluDense]
GeneralBilinearSelfAttention.heads_dims = [("heads", 2)]
GeneralBilinearEncDecAttention.heads_dims = [("heads", 3)]
DenseReluDense.hidden_size = 32
"""

GIN = {"t5_1_0": T5_1_0, "talking_heads": TALKING_HEADS,
       "general_bilinear": GENERAL_BILINEAR}


def _tokens(seed):
  """Encoder inputs and decoder targets with padding (0) at the ends."""
  rng = np.random.default_rng(seed)
  inputs = rng.integers(2, VOCAB, size=(2, 7)).astype(np.int32)
  targets = rng.integers(2, VOCAB, size=(2, 5)).astype(np.int32)
  inputs[1, 5:] = 0
  targets[1, 3:] = 0
  return inputs, targets


def _mtf_model_dir(folder, gin_text, seed=1, step=1000):
  variables = mtf_models.initial_variables(gin_text=gin_text,
                                           vocab_size=VOCAB, seed=seed)
  mtf_models.write_model_dir(mtf_model_dir=str(folder), gin_text=gin_text,
                             variables=variables, step=step)
  return variables


def _thattn_logits(model, inputs, targets):
  decoder_inputs = np.pad(targets, [(0, 0), (1, 0)])[:, :-1]  # shift right
  return model({"encoder_input_tokens": inputs,
                "decoder_input_tokens": decoder_inputs}).numpy()


def _assert_logits_equal(expected, got, targets, atol=1e-4):
  # mtf zeroes padded positions, which thattn does not: compare the rest.
  keep = targets != 0
  difference = np.abs(expected[keep] - got[keep]).max()
  assert difference <= atol, difference
  return difference


@pytest.fixture(scope="module", params=sorted(GIN))
def converted(request, tmp_path_factory):
  """(gin, mtf variables, thattn model_dir) of each mtf model, converted."""
  folder = tmp_path_factory.mktemp(request.param)
  variables = _mtf_model_dir(folder / "mtf", GIN[request.param])
  convert.mtf_to_thattn(mtf_model_dir=str(folder / "mtf"),
                        model_dir=str(folder / "thattn"), log=lambda _: None)
  return GIN[request.param], variables, str(folder / "thattn")


def test_converted_model_gives_mtf_logits(converted):
  gin_text, variables, model_dir = converted
  inputs, targets = _tokens(0)
  expected = mtf_models.logits(gin_text=gin_text, vocab_size=VOCAB,
                               variables=variables, inputs=inputs,
                               targets=targets)
  got = _thattn_logits(models.load(model_dir), inputs, targets)
  assert got.shape == expected.shape == (2, 5, VOCAB)
  difference = _assert_logits_equal(expected, got, targets)
  print(f"max |thattn - mtf| logits: {difference:.2e}")


def test_thattn_to_mtf_to_thattn_is_bit_exact(converted, tmp_path):
  _, _, model_dir = converted
  convert.thattn_to_mtf(model_dir=model_dir, mtf_model_dir=str(tmp_path / "m"),
                        log=lambda _: None)
  assert_converts_back_bit_exact(str(tmp_path / "m"), model_dir, tmp_path)


def assert_converts_back_bit_exact(mtf_model_dir, model_dir, tmp_path):
  """mtf_model_dir (written from model_dir) converts to model_dir's weights."""
  convert.mtf_to_thattn(mtf_model_dir=mtf_model_dir,
                        model_dir=str(tmp_path / "t"), log=lambda _: None)
  before, after = models.load(model_dir), models.load(str(tmp_path / "t"))
  assert [w.name for w in before.weights] == [w.name for w in after.weights]
  for a, b in zip(before.weights, after.weights):
    assert np.array_equal(a.numpy(), b.numpy()), a.name


def test_mtf_to_thattn_to_mtf_keeps_every_variable(converted, tmp_path):
  gin_text, variables, model_dir = converted
  written = convert.thattn_to_mtf(
      model_dir=model_dir, mtf_model_dir=str(tmp_path / "m"),
      log=lambda _: None)
  back = mtf_models.read_checkpoint(
      mtf_models.latest_checkpoint(str(tmp_path / "m")))
  assert sorted(back) == sorted(variables)
  for name, value in variables.items():
    assert np.array_equal(back[name], value), name
  # The written gin config builds an mtf model with the same logits.
  inputs, targets = _tokens(1)
  original = mtf_models.logits(gin_text=gin_text, vocab_size=VOCAB,
                               variables=variables, inputs=inputs,
                               targets=targets)
  again = mtf_models.logits(gin_text=written, vocab_size=VOCAB,
                            variables=back, inputs=inputs, targets=targets)
  _assert_logits_equal(original, again, targets, atol=1e-6)


def test_t5_1_0_checkpoint_has_t5_variable_names(tmp_path):
  variables = _mtf_model_dir(tmp_path, T5_1_0)
  for name, shape in {
      "shared/embedding": (VOCAB, 16),
      "encoder/block_000/layer_000/SelfAttention/q": (16, 16),
      "encoder/block_000/layer_000/SelfAttention/relative_attention_bias":
          (2, 8),
      "encoder/block_001/layer_001/DenseReluDense/wi/kernel": (16, 32),
      "decoder/block_001/layer_001/EncDecAttention/o": (16, 16),
      "decoder/block_000/layer_002/rms_norm/scale": (16,),
      "decoder/rms_norm/scale": (16,)}.items():
    assert variables[name].shape == shape, name
  assert "encoder/block_001/layer_000/SelfAttention/relative_attention_bias" \
      not in variables  # "bias_shared": block 0 owns the stack's bias


def test_per_layer_attention_configs_convert_both_ways(tmp_path):
  # A thattn T5 whose encoder layers differ (dynamic projections in one):
  # the written gin lists every layer with its own arguments.
  config = models.model_config(
      "t5_tiny", vocab_size=128, relative_max_distance=128,
      encoder_self_attention=[
          {"variant": "talking_heads", "num_key_heads": 2},
          {"variant": "talking_heads", "dynamic_projections": ["m2l"]}])
  model = models.build_model(config)
  tf.train.CheckpointManager(tf.train.Checkpoint(backbone=model),
                             str(tmp_path / "t" / "checkpoints"),
                             max_to_keep=1).save(checkpoint_number=7)
  run_dir.write_json(str(tmp_path / "t" / "run_config.json"), {
      "task": "span_corruption", "preset": "t5_tiny",
      "overrides": converters_model_dir.overrides(config)})
  gin_text = convert.thattn_to_mtf(model_dir=str(tmp_path / "t"),
                                   mtf_model_dir=str(tmp_path / "m"),
                                   log=lambda _: None)
  assert "dynamic_projections': ['m2l']" in gin_text
  back = mtf_models.read_checkpoint(
      mtf_models.latest_checkpoint(str(tmp_path / "m"), step=7))
  inputs, targets = _tokens(2)
  inputs, targets = inputs % 128, targets % 128
  expected = mtf_models.logits(gin_text=gin_text, vocab_size=128,
                               variables=back, inputs=inputs, targets=targets)
  _assert_logits_equal(expected, _thattn_logits(model, inputs, targets),
                       targets)


# ---- refused inputs: a ValueError naming the problem, nothing written -----


def _refused(tmp_path, match, **kwargs):
  out = tmp_path / "out"
  with pytest.raises(ValueError, match=match):
    convert.mtf_to_thattn(model_dir=str(out), log=lambda _: None, **kwargs)
  assert not out.exists()
  assert not [p for p in os.listdir(tmp_path) if "incomplete" in p]


def test_refuses_a_folder_without_operative_config(tmp_path):
  (tmp_path / "mtf").mkdir()
  _refused(tmp_path, "operative_config.gin", mtf_model_dir=str(tmp_path / "mtf"))


def test_refuses_an_unknown_layer_class(tmp_path):
  gin_text = T5_1_0.replace(
      f"encoder/make_layer_stack.layers = [{TL}.SelfAttention",
      f"encoder/make_layer_stack.layers = [{TL}.LocalSelfAttention")
  # The architecture is refused before any variable is looked at.
  variables = mtf_models.initial_variables(gin_text=T5_1_0, vocab_size=VOCAB,
                                           seed=0)
  mtf_models.write_model_dir(mtf_model_dir=str(tmp_path / "mtf"),
                             gin_text=gin_text, variables=variables, step=1)
  _refused(tmp_path, "LocalSelfAttention", mtf_model_dir=str(tmp_path / "mtf"))


def test_refuses_a_truncated_checkpoint(tmp_path):
  _mtf_model_dir(tmp_path / "mtf", T5_1_0)
  data, = [p for p in (tmp_path / "mtf").iterdir() if ".data-" in p.name]
  data.write_bytes(data.read_bytes()[:100])
  _refused(tmp_path, "model.ckpt-1000", mtf_model_dir=str(tmp_path / "mtf"))


def test_refuses_a_vocabulary_of_another_size(tmp_path, sentencepiece_model):
  gin_text = T5_1_0.replace("Unitransformer.d_model = 16",
                            "Unitransformer.d_model = 16\n"
                            "Unitransformer.vocab_divisor = 1")
  variables = mtf_models.initial_variables(gin_text=gin_text, vocab_size=900,
                                           seed=0)
  mtf_models.write_model_dir(mtf_model_dir=str(tmp_path / "mtf"),
                             gin_text=gin_text, variables=variables, step=1)
  (tmp_path / "spm.model").write_bytes(sentencepiece_model)
  # The checkpoint's 900 rows cannot hold the vocabulary's 1000 ids.
  _refused(tmp_path, r"spm.model: vocab_size=900 is smaller than the "
           r"model's 1000 pieces",
           mtf_model_dir=str(tmp_path / "mtf"),
           vocabulary=str(tmp_path / "spm.model"))


def test_refuses_an_output_that_is_not_empty(tmp_path):
  _mtf_model_dir(tmp_path / "mtf", T5_1_0)
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="exists and is not empty"):
    convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                          model_dir=str(tmp_path / "out"), log=lambda _: None)
  assert os.listdir(tmp_path / "out") == ["notes.txt"]


def test_the_vocabulary_becomes_the_tokenizer(tmp_path, sentencepiece_model):
  _mtf_model_dir(tmp_path / "mtf", T5_1_0)
  (tmp_path / "spm.model").write_bytes(sentencepiece_model)
  convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                        model_dir=str(tmp_path / "out"),
                        vocabulary=str(tmp_path / "spm.model"),
                        log=lambda _: None)
  tokenizer = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  # The checkpoint's 1024 rows (mtf padded 1000 ids), 1000 of them produced.
  assert (tokenizer.vocab_size, tokenizer.token_count) == (1024, 1000)
  config = run_dir.read_run_config(str(tmp_path / "out"))
  assert config["converted_from"]["step"] == 1000
  assert architecture.MTF_MAX_DISTANCE == config["overrides"][
      "relative_max_distance"]
