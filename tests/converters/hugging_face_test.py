"""Hugging Face BERT and ALBERT folders into thattn, against transformers.

Each source is a tiny model that transformers itself makes with random
weights and saves with `save_pretrained` (safetensors, and the tokenizer
as transformers 5 writes it: tokenizer.json and tokenizer_config.json).
The converted thattn backbone's sequence and pooled outputs on a padded
batch equal transformers' own forward pass (CPU PyTorch) within 1e-5, as
multi-head attention and as every projected variant started at the
identity; the converted tokenizer gives transformers' ids on the README's
sample and the docs/examples texts, lower-cased and cased; what thattn
cannot represent is refused by name, and nothing is written then.
"""

import json
import os
import sys

import pytest
import torch
import transformers

from tests import forkserver
from tests.converters import checks
from tests.keras3 import processes
from thattn import converters
from thattn.core import variants
from thattn.data import tokenizers

ROOT = checks.ROOT
_VOCAB = 200
_POSITIONS = 64
_BERT = dict(vocab_size=_VOCAB, hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=_POSITIONS, type_vocab_size=2)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  """A small WordPiece vocabulary learned from the sample texts (its
  special tokens first, as BERT's [PAD], [UNK], ... are placed by name)."""
  texts = checks.sample_texts()
  vocab = tokenizers.learn_wordpiece(
      texts + [text.lower() for text in texts], _VOCAB, lower_case=False,
      num_sentinels=0).vocab
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("".join(token + "\n" for token in vocab))
  return path, len(vocab)


def _save(folder, model, vocab_file=None, lower_case=True):
  model.save_pretrained(folder)
  if vocab_file is not None:
    transformers.BertTokenizer(str(vocab_file),
                               do_lower_case=lower_case).save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def bert(tmp_path_factory, vocab_file):
  torch.manual_seed(0)
  config = transformers.BertConfig(**dict(_BERT, vocab_size=vocab_file[1]))
  model = transformers.BertModel(config).eval()
  return model, _save(tmp_path_factory.mktemp("hf") / "bert", model,
                      vocab_file[0])


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
  torch.manual_seed(1)
  config = transformers.AlbertConfig(
      vocab_size=_VOCAB, embedding_size=16, hidden_size=32,
      num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
      max_position_embeddings=_POSITIONS)
  model = transformers.AlbertModel(config).eval()
  folder = _save(tmp_path_factory.mktemp("hf") / "albert", model)
  # The tokenizer as the Hub's ALBERT folders keep it: the SentencePiece
  # model itself.
  (folder / "spiece.model").write_bytes(checks.albert_sentencepiece(_VOCAB))
  return model, folder


def _assert_same_outputs(source_model, model_dir, vocab_size):
  batch = checks.padded_batch(vocab_size)
  with torch.no_grad():
    expected = source_model(
        input_ids=torch.tensor(batch["input_word_ids"], dtype=torch.long),
        attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
        token_type_ids=torch.tensor(batch["input_type_ids"],
                                    dtype=torch.long))
  checks.assert_same_outputs(model_dir, batch,
                             expected.last_hidden_state.numpy(),
                             expected.pooler_output.numpy())


@pytest.mark.parametrize("attention", variants.identity_starts())
def test_bert_equals_transformers(bert, tmp_path, attention):
  source_model, folder = bert
  config = converters.convert(source=str(folder),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert config.attention.variant == attention
  assert config.activation == "gelu"  # BERT's exact GELU
  _assert_same_outputs(source_model, tmp_path / "out",
                       source_model.config.vocab_size)


@pytest.mark.parametrize("attention", ["multi_head", "talking_heads"])
def test_albert_equals_transformers(albert, tmp_path, attention):
  source_model, folder = albert
  config = converters.convert(source=str(folder),
                              model_dir=str(tmp_path / "out"),
                              attention=attention, log=lambda _: None)
  assert (config.share_layers, config.embedding_size) == (True, 16)
  assert config.activation == "gelu_approximate"  # ALBERT's gelu_new
  _assert_same_outputs(source_model, tmp_path / "out", _VOCAB)


@pytest.mark.parametrize("lower_case", [True, False])
def test_the_tokenizer_gives_transformers_ids(vocab_file, tmp_path,
                                              lower_case):
  torch.manual_seed(0)
  model = transformers.BertModel(transformers.BertConfig(
      **dict(_BERT, vocab_size=vocab_file[1])))
  folder = _save(tmp_path / "bert", model, vocab_file[0], lower_case)
  converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
  texts = checks.sample_texts()
  expected = [theirs(text, add_special_tokens=False)["input_ids"]
              for text in texts]
  assert ours.tokenize(texts).to_list() == expected
  assert sum(ids.count(ours.special.unk) for ids in expected) < len(texts)
  for name in ("pad", "unk", "cls", "sep", "mask"):
    token = getattr(theirs, f"{name}_token")
    assert getattr(ours.special, name) == theirs.convert_tokens_to_ids(token)


@pytest.mark.parametrize("files, lower_case", [
    ("spiece.model", True), ("tokenizer.json", True),
    ("tokenizer.json", False)])
def test_the_albert_tokenizer_gives_transformers_ids(albert, tmp_path, files,
                                                     lower_case):
  """From spiece.model, and from tokenizer.json alone (what transformers 5
  saves), lower-cased and accent-stripped or neither."""
  folder = albert[1]
  if files == "tokenizer.json":
    folder = _save(tmp_path / "albert", albert[0])
    transformers.AlbertTokenizer.from_pretrained(
        str(albert[1]), do_lower_case=lower_case,
        keep_accents=not lower_case).save_pretrained(folder)
    assert not (folder / "spiece.model").exists()
  converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                     log=lambda _: None)
  ours = tokenizers.load(str(tmp_path / "out" / "tokenizer"))
  theirs = transformers.AlbertTokenizer.from_pretrained(str(folder))
  texts = checks.sample_texts() + list(checks.ALBERT_TEXTS)
  expected = [theirs(text, add_special_tokens=False)["input_ids"]
              for text in texts]
  assert ours.tokenize(texts).to_list() == expected
  assert ours.vocab_size == _VOCAB
  for name in ("pad", "unk", "cls", "sep", "mask"):
    token = getattr(theirs, f"{name}_token")
    assert getattr(ours.special, name) == theirs.convert_tokens_to_ids(token)


def _config(folder):
  return json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize("change, field", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"hidden_act": "silu"}, "hidden_act"),
])
def test_what_thattn_cannot_represent_is_refused(bert, tmp_path, change,
                                                 field):
  folder = tmp_path / "changed"
  _save(folder, bert[0])
  (folder / "config.json").write_text(json.dumps(dict(_config(folder),
                                                      **change)))
  with pytest.raises(ValueError, match=field):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_groups": 2}, "num_hidden_groups=2"),
    ({"embedding_size": 32}, "embedding size 32 is not below"),
])
def test_an_albert_thattn_cannot_build_is_refused(albert, tmp_path, change,
                                                  message):
  folder = tmp_path / "changed"
  _save(folder, albert[0])
  (folder / "config.json").write_text(json.dumps(dict(_config(folder),
                                                      **change)))
  with pytest.raises(ValueError, match=message):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)


def test_a_model_saved_without_its_pooler_is_refused(tmp_path):
  model = transformers.BertModel(transformers.BertConfig(**_BERT),
                                 add_pooling_layer=False)
  folder = _save(tmp_path / "no_pooler", model)
  with pytest.raises(ValueError, match="pooler.dense.weight"):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)
  assert not (tmp_path / "out").exists()


def test_general_bilinear_and_an_existing_output_are_refused(bert, tmp_path):
  with pytest.raises(ValueError, match="starts only .* at its own outputs; "
                     "general_bilinear has weights"):
    converters.convert(source=str(bert[1]), model_dir=str(tmp_path / "a"),
                       attention="general_bilinear", log=lambda _: None)
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "mine.txt").write_text("kept")
  with pytest.raises(ValueError, match="not empty"):
    converters.convert(source=str(bert[1]), model_dir=str(tmp_path / "b"),
                       log=lambda _: None)
  assert (tmp_path / "b" / "mine.txt").read_text() == "kept"


def test_an_unknown_folder_names_the_formats(tmp_path):
  with pytest.raises(ValueError, match="config.json.*operative_config.gin"):
    converters.detect(str(tmp_path))


def _run(program, *flags):
  env = processes.train_environment()
  return forkserver.run(
      [os.path.join(os.path.dirname(sys.executable), program), *flags],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
      env=env)


def test_converted_bert_fine_tunes_with_both_backends(bert, tmp_path):
  """`thattn-convert --source` as a user runs it, then the README's SST-2
  fine-tuning from it with --backend=keras and --backend=keras3 (2 steps:
  the converted weights, tokenizer and run_config.json are what they read),
  and `thattn-export` of the converted model_dir."""
  out = tmp_path / "converted"
  result = _run("thattn-convert", f"--source={bert[1]}",
                f"--model_dir={out}", "--attention=talking_heads")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "with talking_heads attention, tokenizer written" in result.stdout
  for backend in ("keras", "keras3"):
    result = _run(
        "thattn-train", "--task=classification", "--glue_task=sst2",
        "--train_files=docs/examples/sst2_sample/train.tsv",
        "--eval_files=docs/examples/sst2_sample/dev.tsv",
        f"--init_checkpoint={out}", f"--backend={backend}",
        f"--model_dir={tmp_path / backend}", f"--sequence_length={_POSITIONS}",
        "--batch_size=4", "--train_steps=2", "--eval_steps=1",
        "--eval_every=0", "--log_every=1", "--noexport")
    assert result.returncode == 0, (backend, result.stderr[-3000:])
    assert "talking_heads" in result.stdout, result.stdout[-2000:]
  result = _run("thattn-export", f"--model_dir={out}",
                f"--export_dir={tmp_path / 'served'}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "served" / "saved_model.pb").exists()


def test_converted_albert_trains_squad_and_masked_lm(albert, tmp_path):
  """A converted ALBERT with its SentencePiece tokenizer: SQuAD (answer
  spans through the tokenizer's offsets) with --backend=keras3 and masked
  LM on a text file with --backend=keras, 2 steps each."""
  out = tmp_path / "converted"
  result = _run("thattn-convert", f"--source={albert[1]}",
                f"--model_dir={out}", "--attention=talking_heads")
  assert result.returncode == 0, result.stderr[-3000:]
  text = tmp_path / "text.txt"
  text.write_text("\n".join(checks.sample_texts()) + "\n")
  for task, backend, data in (
      ("squad", "keras3", ["--train_files=docs/examples/squad_sample/"
                           "train.json", "--eval_files=docs/examples/"
                           "squad_sample/dev.json", "--on_overflow=window"]),
      ("mlm", "keras", [f"--train_files={text}", f"--eval_files={text}"])):
    result = _run(
        "thattn-train", f"--task={task}", *data, f"--init_checkpoint={out}",
        f"--backend={backend}", f"--model_dir={tmp_path / task}",
        f"--sequence_length={_POSITIONS}", "--batch_size=4",
        "--train_steps=2", "--eval_steps=1", "--eval_every=0",
        "--log_every=1", "--noexport")
    assert result.returncode == 0, (task, result.stderr[-3000:])
    assert "talking_heads" in result.stdout, result.stdout[-2000:]


def test_weights_that_do_not_match_the_config_are_named(bert, tmp_path):
  folder = tmp_path / "mismatched"
  _save(folder, bert[0])
  (folder / "config.json").write_text(json.dumps(dict(
      _config(folder), intermediate_size=48)))
  with pytest.raises(ValueError, match=(
      r"encoder\.layer\.0\.intermediate\.dense\.weight \[64, 32\] gives "
      r"\[32, 64\] for block_0/feed_forward/input/kernel, which is "
      r"\[32, 48\]")):
    converters.convert(source=str(folder), model_dir=str(tmp_path / "out"),
                       log=lambda _: None)
  assert not (tmp_path / "out").exists()
