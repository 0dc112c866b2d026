"""Google's original BERT layout and Model Garden's TF2 one, against Model Garden.

The source is a TF1 checkpoint written here with google-research/bert's
variable names (random values; its masked-LM and next-sentence heads, an
optimizer slot and global_step beside the encoder), a bert_config.json and
a vocab.txt, as the released folders hold them. The reference is Model
Garden's own converter of that layout
(`official.nlp.tools.tf2_bert_encoder_checkpoint_converter`) restoring
Model Garden's BertEncoder: thattn's conversion of the same folder gives
its sequence and pooled outputs on a padded batch within 1e-5, as
multi-head attention and as talking heads started at the identity. The
tokenizer gives the ids of Model Garden's copy of BERT's original
tokenization code (`FullTokenizer`), uncased and cased. Model Garden's
converter's output, laid out as Model Garden's TF2 releases are (its
object-based checkpoint beside bert_config.json and vocab.txt), is itself
a source: converted, it gives the same outputs.
"""

import json
import shutil

import pytest

from tests.converters import checks
from tests.converters import model_garden_scripts
from thattn import converters
from thattn.data import tokenizers

converter = model_garden_scripts.script(
    "official.nlp.tools.tf2_bert_encoder_checkpoint_converter")
from official.legacy.bert import configs as model_garden_configs  # pylint: disable=g-import-not-at-top,wrong-import-position
from official.nlp.tools import tokenization  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = {"vocab_size": None, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "intermediate_size": 64,
           "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
           "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64,
           "type_vocab_size": 2, "initializer_range": 0.02}


def _shapes(config):
  """google-research/bert's variable names and shapes, heads included."""
  width, inner = config["hidden_size"], config["intermediate_size"]
  shapes = {"bert/embeddings/word_embeddings": [config["vocab_size"], width],
            "bert/embeddings/token_type_embeddings": [2, width],
            "bert/embeddings/position_embeddings": [64, width],
            "bert/pooler/dense/kernel": [width, width],
            "bert/pooler/dense/bias": [width],
            "cls/predictions/transform/dense/kernel": [width, width],
            "cls/predictions/output_bias": [config["vocab_size"]],
            "cls/seq_relationship/output_weights": [2, width]}
  norms = ["bert/embeddings/LayerNorm", "cls/predictions/transform/LayerNorm"]
  for index in range(config["num_hidden_layers"]):
    layer = f"bert/encoder/layer_{index}"
    for name, size in (("attention/self/query", [width, width]),
                       ("attention/self/key", [width, width]),
                       ("attention/self/value", [width, width]),
                       ("attention/output/dense", [width, width]),
                       ("intermediate/dense", [width, inner]),
                       ("output/dense", [inner, width])):
      shapes[f"{layer}/{name}/kernel"] = size
      shapes[f"{layer}/{name}/bias"] = size[-1:]
    norms += [f"{layer}/attention/output/LayerNorm", f"{layer}/output/LayerNorm"]
  for norm in norms:
    shapes[f"{norm}/gamma"] = shapes[f"{norm}/beta"] = [width]
  shapes["bert/encoder/layer_0/output/dense/kernel/adam_m"] = [inner, width]
  return shapes


def _write_release(folder, vocab, lower_case):
  """A folder laid out as google-research/bert's releases are."""
  folder.mkdir()
  config = dict(_CONFIG, vocab_size=len(vocab))
  (folder / "bert_config.json").write_text(json.dumps(config))
  if not lower_case:  # a cased vocabulary has upper-case tokens
    vocab = vocab + [token.capitalize() for token in vocab
                     if token.isalpha() and token.islower()][:20]
  (folder / "vocab.txt").write_text("".join(token + "\n" for token in vocab))
  checks.write_tf1_checkpoint(folder / "bert_model.ckpt", _shapes(config),
                              seed=0)
  return folder


@pytest.fixture(scope="module")
def vocab():
  texts = checks.sample_texts()
  return tokenizers.learn_wordpiece([text.lower() for text in texts], 200,
                                    num_sentinels=0).vocab


@pytest.fixture(scope="module")
def release(tmp_path_factory, vocab):
  return _write_release(tmp_path_factory.mktemp("google") / "uncased",
                        vocab, lower_case=True)


@pytest.fixture(scope="module")
def model_garden_release(tmp_path_factory, release):
  """Model Garden's converter's output, as its TF2 releases lay it out."""
  config = model_garden_configs.BertConfig.from_json_file(
      str(release / "bert_config.json"))
  out = tmp_path_factory.mktemp("model_garden")
  converter.convert_checkpoint(config, str(out / "ckpt"),
                               str(release / "bert_model.ckpt"),
                               checkpoint_model_name="encoder")
  for name in ("bert_config.json", "vocab.txt"):
    shutil.copy(release / name, out / name)
  return out


@pytest.fixture(scope="module")
def model_garden_outputs(release, model_garden_release):
  """Model Garden's BertEncoder, restored from its converter's output."""
  config = model_garden_configs.BertConfig.from_json_file(
      str(release / "bert_config.json"))
  return checks.restored_outputs(
      converter._create_bert_model(config), model_garden_release,  # pylint: disable=protected-access
      config.vocab_size)


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_bert_equals_model_gardens_conversion(release, model_garden_outputs,
                                              tmp_path, attention):
  assert converters.detect(str(release)) == converters.GOOGLE_BERT
  config = converters.convert(source=str(release),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert config.activation == "gelu_approximate"  # google-research/bert's
  checks.assert_same_outputs(tmp_path / "out", *model_garden_outputs)


def test_model_gardens_tf2_release_converts_to_the_same_model(
    model_garden_release, model_garden_outputs, tmp_path):
  assert converters.detect(str(model_garden_release)) == (
      converters.MODEL_GARDEN)
  converters.convert(source=str(model_garden_release),
                     model_dir=str(tmp_path / "out"),
                     attention="talking_heads", log=lambda _: None)
  checks.assert_same_outputs(tmp_path / "out", *model_garden_outputs)


@pytest.mark.parametrize("lower_case", [True, False])
def test_the_tokenizer_gives_bert_originals_ids(vocab, tmp_path, lower_case):
  folder = _write_release(tmp_path / "release", vocab, lower_case)
  converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  assert ours.lower_case == lower_case  # read from the vocabulary
  theirs = tokenization.FullTokenizer(str(folder / "vocab.txt"),
                                      do_lower_case=lower_case)
  texts = checks.sample_texts()
  expected = [theirs.convert_tokens_to_ids(theirs.tokenize(text))
              for text in texts]
  assert ours.tokenize(texts).to_list() == expected
