"""Mesh TensorFlow Unitransformers <-> thattn's one-stack T5 models.

A decoder-only language model ("lm": talking heads with h_k != h != h_v,
dynamic projections in one layer, untied logits) and an encoder-only
"aligned" model (general bilinear, tied), built, initialized and saved by
Mesh TensorFlow itself; their logits against thattn's after conversion, and
both round trips.
"""

import numpy as np
import pytest

from tests.mtf import model_convert_test
from thattn import models
from thattn.io import run_dir
from thattn.mtf import architecture
from thattn.mtf import convert
from thattn.mtf import model_map
from thattn.mtf import models as mtf_models

TL = model_convert_test.TL
VOCAB = 128

_COMMON = f"""
import mesh_tensorflow.transformer.transformer_layers
Unitransformer.d_model = 16
Unitransformer.positional_embedding = False
make_layer_stack.num_layers = 2
DenseReluDense.hidden_size = 24
"""

LANGUAGE_MODEL = _COMMON + f"""
utils.run.model_type = 'lm'
Unitransformer.shared_embedding_and_softmax_weights = False
make_layer_stack.block_scope = False
make_layer_stack.num_layers = 1
make_layer_stack.layers = [
    [{TL}.TalkingHeadsSelfAttention, "block_000/layer_000", {{}}],
    [{TL}.DenseReluDense, "block_000/layer_001", {{}}],
    [{TL}.TalkingHeadsSelfAttention, "block_001/layer_000",
     {{"dynamic_projections": ["x2w", "m2l"]}}],
    [{TL}.DenseReluDense, "block_001/layer_001", {{}}],
]
TalkingHeadsSelfAttention.key_heads_dims = [("key_heads", 2)]
TalkingHeadsSelfAttention.softmax_heads_dims = [("heads", 3)]
TalkingHeadsSelfAttention.value_heads_dims = [("value_heads", 4)]
TalkingHeadsSelfAttention.key_size = 8
TalkingHeadsSelfAttention.value_size = 6
TalkingHeadsSelfAttention.relative_attention_type = "bias_shared"
TalkingHeadsSelfAttention.relative_attention_num_buckets = 8
DenseReluDense.activation = ["gelu", "linear"]
"""

ALIGNED = _COMMON + f"""
utils.run.model_type = 'aligned'
Unitransformer.shared_embedding_and_softmax_weights = True
make_layer_stack.layers = [
    {TL}.GeneralBilinearSelfAttention, {TL}.DenseReluDense]
GeneralBilinearSelfAttention.heads_dims = [("heads", 2)]
GeneralBilinearSelfAttention.relative_attention_type = "bias_shared"
GeneralBilinearSelfAttention.relative_attention_num_buckets = 8
"""

GIN = {"lm": LANGUAGE_MODEL, "aligned": ALIGNED}


def _tokens(seed, kind):
  """(inputs or None, targets): padding (0) at the end of one row."""
  rng = np.random.default_rng(seed)
  targets = rng.integers(2, VOCAB, size=(2, 6)).astype(np.int32)
  targets[1, 4:] = 0
  return (targets.copy() if kind == "aligned" else None), targets


def _thattn_logits(model, kind, inputs, targets):
  if kind == "aligned":
    return model({"encoder_input_tokens": inputs}).numpy()
  shifted = np.pad(targets, [(0, 0), (1, 0)])[:, :-1]  # the LM reads these
  return model({"decoder_input_tokens": shifted}).numpy()


@pytest.fixture(scope="module", params=sorted(GIN))
def converted(request, tmp_path_factory):
  """(kind, mtf variables, thattn model_dir)."""
  folder = tmp_path_factory.mktemp(request.param)
  gin_text = GIN[request.param]
  variables = mtf_models.initial_variables(gin_text=gin_text,
                                           vocab_size=VOCAB, seed=5)
  mtf_models.write_model_dir(mtf_model_dir=str(folder / "mtf"),
                             gin_text=gin_text, variables=variables, step=20)
  convert.mtf_to_thattn(mtf_model_dir=str(folder / "mtf"),
                        model_dir=str(folder / "thattn"), log=lambda _: None)
  return request.param, variables, str(folder / "thattn")


def test_the_config_has_one_stack(converted):
  kind, variables, model_dir = converted
  config = run_dir.read_run_config(model_dir)
  overrides = config["overrides"]
  # A language model is the causal LM's backbone; an aligned model's task
  # (masked LM's targets are not in the checkpoint) is the caller's to name.
  assert config["task"] == ("causal_lm" if kind == "lm" else None)
  if kind == "lm":
    assert overrides["stacks"] == "decoder"
    assert [layer["dynamic_projections"] for layer in
            overrides["decoder_self_attention"]] == [[], ["m2l", "x2w"]]
    assert not overrides["tie_embeddings"]
    assert "transformer/logits/kernel" in variables
  else:
    assert overrides["stacks"] == "encoder"
    assert overrides["encoder_self_attention"]["variant"] == (
        "general_bilinear")
  assert "transformer/embedding" in variables


def test_converted_model_gives_mtf_logits(converted):
  kind, variables, model_dir = converted
  inputs, targets = _tokens(0, kind)
  expected = mtf_models.logits(gin_text=GIN[kind], vocab_size=VOCAB,
                               variables=variables, inputs=inputs,
                               targets=targets)
  got = _thattn_logits(models.load(model_dir), kind, inputs, targets)
  assert got.shape == expected.shape == (2, 6, VOCAB)
  difference = model_convert_test._assert_logits_equal(  # pylint: disable=protected-access
      expected, got, targets)
  print(f"{kind}: max |thattn - mtf| logits: {difference:.2e}")


def test_round_trips(converted, tmp_path):
  kind, variables, model_dir = converted
  written = convert.thattn_to_mtf(model_dir=model_dir,
                                  mtf_model_dir=str(tmp_path / "m"),
                                  log=lambda _: None)
  assert f"utils.run.model_type = {kind!r}" in written
  back = mtf_models.read_checkpoint(
      mtf_models.latest_checkpoint(str(tmp_path / "m")))
  assert sorted(back) == sorted(variables)
  for name, value in variables.items():
    assert np.array_equal(back[name], value), name
  # The written gin builds an mtf model with the same logits.
  inputs, targets = _tokens(1, kind)
  model_convert_test._assert_logits_equal(  # pylint: disable=protected-access
      mtf_models.logits(gin_text=GIN[kind], vocab_size=VOCAB,
                        variables=variables, inputs=inputs, targets=targets),
      mtf_models.logits(gin_text=written, vocab_size=VOCAB, variables=back,
                        inputs=inputs, targets=targets),
      targets, atol=1e-6)
  # thattn -> mtf -> thattn is bit-exact.
  model_convert_test.assert_converts_back_bit_exact(str(tmp_path / "m"),
                                                    model_dir, tmp_path)


def test_a_thattn_language_model_runs_in_mtf():
  config = models.model_config("t5_tiny", vocab_size=VOCAB, stacks="decoder",
                               decoder_self_attention="talking_heads")
  model = models.build_model(config)
  assert sorted(model.input) == ["decoder_input_tokens"]
  gin_text = architecture.gin_text(config)
  assert "utils.run.model_type = 'lm'" in gin_text
  mtf_model = mtf_models.build_model(gin_text=gin_text, vocab_size=VOCAB)
  variables = model_map.keras_to_mtf(mtf_model=mtf_model, keras_model=model)
  _, targets = _tokens(2, "lm")
  expected = mtf_models.logits(gin_text=gin_text, vocab_size=VOCAB,
                               variables=variables, targets=targets)
  model_convert_test._assert_logits_equal(  # pylint: disable=protected-access
      expected, _thattn_logits(model, "lm", None, targets), targets)


def test_a_one_stack_config_is_checked():
  with pytest.raises(ValueError, match="unknown stacks 'decoder_only'"):
    models.model_config("t5_tiny", stacks="decoder_only")
