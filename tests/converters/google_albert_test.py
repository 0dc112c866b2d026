"""Google's original ALBERT layout into thattn, against Model Garden.

As tests/converters/google_bert_test.py does for BERT: a TF1 checkpoint
written here with google-research/albert's variable names (random values;
its heads and global_step beside the encoder, saved as `model.ckpt-best`
with no `checkpoint` state file, as the releases are), converted by Model
Garden's own converter of that layout into its AlbertEncoder, whose
outputs on a padded batch thattn's conversion equals within 1e-5, as
multi-head attention and as talking heads started at the identity; its
tokenizer (a SentencePiece model trained here as 30k-clean.model was)
gives google-research/albert's ids; and the structures thattn does not
build refused by name.
"""

import json

import pytest

from tests.converters import google_bert_test
from tests.converters import checks
from tests.converters import model_garden_scripts
from thattn import converters
from thattn.data import albert_tokenizer
from thattn.data import tokenizers

converter = model_garden_scripts.script(
    "official.nlp.tools.tf2_albert_encoder_checkpoint_converter")
from official.legacy.albert import configs as model_garden_configs  # pylint: disable=g-import-not-at-top,wrong-import-position
from official.nlp.tools import tokenization as model_garden_tokenization  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = dict(google_bert_test._CONFIG, vocab_size=120, embedding_size=16,  # pylint: disable=protected-access
               num_hidden_layers=3, num_hidden_groups=1, inner_group_num=1,
               net_structure_type=0)
_LAYER = "bert/encoder/transformer/group_0/inner_group_0"


def _shapes():
  width, inner, embedding = 32, 64, 16
  shapes = {"bert/embeddings/word_embeddings": [120, embedding],
            "bert/embeddings/token_type_embeddings": [2, embedding],
            "bert/embeddings/position_embeddings": [64, embedding],
            "bert/encoder/embedding_hidden_mapping_in/kernel": [embedding,
                                                                width],
            "bert/encoder/embedding_hidden_mapping_in/bias": [width],
            "bert/pooler/dense/kernel": [width, width],
            "bert/pooler/dense/bias": [width],
            "cls/predictions/output_bias": [120],
            "cls/seq_relationship/output_weights": [2, width]}
  for name, size in (("attention_1/self/query", [width, width]),
                     ("attention_1/self/key", [width, width]),
                     ("attention_1/self/value", [width, width]),
                     ("attention_1/output/dense", [width, width]),
                     ("ffn_1/intermediate/dense", [width, inner]),
                     ("ffn_1/intermediate/output/dense", [inner, width])):
    shapes[f"{_LAYER}/{name}/kernel"] = size
    shapes[f"{_LAYER}/{name}/bias"] = size[-1:]
  for norm, size in (("bert/embeddings/LayerNorm", embedding),
                     (f"{_LAYER}/LayerNorm", width),
                     (f"{_LAYER}/LayerNorm_1", width)):
    shapes[f"{norm}/gamma"] = shapes[f"{norm}/beta"] = [size]
  return shapes


@pytest.fixture(scope="module")
def release(tmp_path_factory):
  folder = tmp_path_factory.mktemp("google") / "albert_base"
  folder.mkdir()
  (folder / "albert_config.json").write_text(json.dumps(_CONFIG))
  checks.write_tf1_checkpoint(folder / "model.ckpt-best", _shapes(), seed=1,
                              state=False)
  (folder / "30k-clean.model").write_bytes(checks.albert_sentencepiece(120))
  return folder


@pytest.fixture(scope="module")
def model_garden_outputs(tmp_path_factory, release):
  config = model_garden_configs.AlbertConfig.from_json_file(
      str(release / "albert_config.json"))
  out = tmp_path_factory.mktemp("model_garden")
  converter.convert_checkpoint(config, str(out / "ckpt"),
                               str(release / "model.ckpt-best"),
                               checkpoint_model_name="encoder")
  return checks.restored_outputs(
      converter._create_albert_model(config), out, config.vocab_size)  # pylint: disable=protected-access


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_albert_equals_model_gardens_conversion(release, model_garden_outputs,
                                                tmp_path, attention):
  assert converters.detect(str(release)) == converters.GOOGLE_ALBERT
  config = converters.convert(source=str(release),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert (config.share_layers, config.embedding_size) == (True, 16)
  checks.assert_same_outputs(tmp_path / "out", *model_garden_outputs)


def _google_ids(model_path, text):
  """google-research/albert's FullTokenizer (do_lower_case, its default):
  Model Garden keeps its preprocess_text (spaces, NFKD, accents, case) and
  encode_pieces (the digit-comma split); google-research/albert also
  replaces `` and '' with " first, which Model Garden's copy dropped."""
  full = model_garden_tokenization.FullSentencePieceTokenizer(model_path)
  text = " ".join(text.split()).replace("``", '"').replace("''", '"')
  return full.convert_tokens_to_ids(full.tokenize(
      model_garden_tokenization.preprocess_text(text, lower=True)))


def test_the_tokenizer_gives_google_albert_ids(release, tmp_path):
  converters.convert(source=str(release), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  texts = checks.sample_texts() + list(checks.ALBERT_TEXTS)
  expected = [_google_ids(str(release / "30k-clean.model"), text)
              for text in texts]
  assert ours.tokenize(texts).to_list() == expected
  # The texts exercise the digit-comma split: without it, ids differ.
  unsplit = albert_tokenizer.AlbertSentencepieceTokenizer(
      ours.model, split_digit_comma=False)
  assert unsplit.tokenize(texts).to_list() != expected


@pytest.mark.parametrize("field", ["num_hidden_groups", "inner_group_num",
                                   "net_structure_type"])
def test_structures_thattn_does_not_build_are_refused(release, tmp_path,
                                                      field):
  folder = tmp_path / "changed"
  folder.mkdir()
  for path in release.iterdir():
    (folder / path.name).write_bytes(path.read_bytes())
  (folder / "albert_config.json").write_text(
      json.dumps(dict(_CONFIG, **{field: 2})))
  with pytest.raises(ValueError, match=f"{field}=2"):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)
  assert not (tmp_path / "out").exists()
