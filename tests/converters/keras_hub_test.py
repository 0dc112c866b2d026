"""KerasHub BERT and ALBERT presets into thattn, against KerasHub itself.

The source is a tiny `BertBackbone` that KerasHub makes with random weights
and saves with `save_to_preset`, with a `BertTokenizer` saved beside it.
The converted thattn backbone's sequence and pooled outputs on a padded
batch equal KerasHub's own forward pass within 1e-5 (KerasHub's BERT uses
GELU's tanh form, which carries over), as multi-head attention and as
talking heads started at the identity; the converted tokenizer gives
KerasHub's ids on the README's sample and the docs/examples texts (KerasHub
lower-cases and keeps accents). An `AlbertBackbone` (embedding width, one
shared layer) converts the same way, its `AlbertTokenizer` giving
KerasHub's ids (SentencePiece alone, nothing lower-cased), and one with
several groups is refused by name. KerasHub is the Keras 3 anchor
(benchmarks/requirements-anchors.txt), which .ci/run installs and checks.
"""

import json

import numpy as np
import pytest

from tests.converters import checks
from thattn import converters
from thattn.data import tokenizers

keras_hub = pytest.importorskip(
    "keras_hub", reason="KerasHub is not installed; see benchmarks/README.md")


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
  texts = checks.sample_texts()
  vocab = tokenizers.learn_wordpiece(
      texts + [text.lower() for text in texts], 200, lower_case=False,
      num_sentinels=0).vocab
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=len(vocab), num_layers=2, num_heads=4, hidden_dim=32,
      intermediate_dim=64, max_sequence_length=64, num_segments=2)
  folder = tmp_path_factory.mktemp("keras_hub") / "bert"
  backbone.save_to_preset(str(folder))
  tokenizer = keras_hub.models.BertTokenizer(vocabulary=vocab, lowercase=True)
  tokenizer.save_to_preset(str(folder))
  return backbone, tokenizer, folder


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_bert_equals_keras_hub(preset, tmp_path, attention):
  backbone, _, folder = preset
  assert converters.detect(str(folder)) == converters.KERAS_HUB
  config = converters.convert(source=str(folder),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert config.activation == "gelu_approximate"
  batch = checks.padded_batch(config.vocab_size)
  expected = backbone({"token_ids": batch["input_word_ids"],
                       "segment_ids": batch["input_type_ids"],
                       "padding_mask": batch["input_mask"]})
  checks.assert_same_outputs(tmp_path / "out", batch,
                             *checks.encoder_outputs(expected))


def test_the_tokenizer_gives_keras_hub_ids(preset, tmp_path):
  _, theirs, folder = preset
  converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  texts = checks.sample_texts() + ["Crème Brûlée, À LA CARTE"]
  expected = [np.asarray(theirs(text)).tolist() for text in texts]
  assert ours.tokenize(texts).to_list() == expected
  assert ours.special.cls == theirs.token_to_id("[CLS]")


@pytest.fixture(scope="module")
def albert_preset(tmp_path_factory):
  backbone = keras_hub.models.AlbertBackbone(
      vocabulary_size=120, num_layers=3, num_heads=4, embedding_dim=16,
      hidden_dim=32, intermediate_dim=64, max_sequence_length=64)
  folder = tmp_path_factory.mktemp("keras_hub") / "albert"
  backbone.save_to_preset(str(folder))
  tokenizer = keras_hub.models.AlbertTokenizer(
      proto=checks.albert_sentencepiece(120))
  tokenizer.save_to_preset(str(folder))
  return backbone, folder, tokenizer


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_albert_equals_keras_hub(albert_preset, tmp_path, attention):
  backbone, folder, _ = albert_preset
  config = converters.convert(source=str(folder),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert (config.share_layers, config.embedding_size) == (True, 16)
  batch = checks.padded_batch(120)
  expected = backbone({"token_ids": batch["input_word_ids"],
                       "segment_ids": batch["input_type_ids"],
                       "padding_mask": batch["input_mask"]})
  checks.assert_same_outputs(tmp_path / "out", batch,
                             *checks.encoder_outputs(expected))


def test_the_albert_tokenizer_gives_keras_hub_ids(albert_preset, tmp_path):
  _, folder, theirs = albert_preset
  converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  texts = checks.sample_texts() + list(checks.ALBERT_TEXTS)
  assert ours.tokenize(texts).to_list() == [
      np.asarray(theirs(text)).tolist() for text in texts]
  assert (ours.special.cls, ours.special.mask) == (
      theirs.token_to_id("[CLS]"), theirs.token_to_id("[MASK]"))


def test_an_albert_with_several_groups_is_refused(albert_preset, tmp_path):
  folder = tmp_path / "groups"
  folder.mkdir()
  for path in albert_preset[1].iterdir():
    if path.is_file():
      (folder / path.name).write_bytes(path.read_bytes())
  preset = json.loads((folder / "config.json").read_text())
  preset["config"]["num_groups"] = 3
  (folder / "config.json").write_text(json.dumps(preset))
  with pytest.raises(ValueError, match="num_groups=3"):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)
