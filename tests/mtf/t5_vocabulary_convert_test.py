"""A T5-style mtf model_dir with T5's vocabulary layout: convert, run,
fine-tune with thattn-train, export and serve text.

The vocabulary is a SentencePiece model in T5's layout (<pad>=0, </s>=1,
<unk>=2, 100 sentinels past its 300 pieces: 400 ids, which mtf pads to 512
embedding rows), trained here; the model is the released T5 1.0 checkpoints'
layout (mtf's legacy LayerStack: `layer_norm` and `final_layer_norm`
scopes, dropout 0.1), built and saved by Mesh TensorFlow as T5 saves it.
"""

import io
import json
import os

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from tests import cli
from tests.mtf import model_convert_test
from tests.mtf import t5_layouts_convert_test as layouts
from thattn import models
from thattn.data import tokenizers
from thattn.mtf import convert
from thattn.mtf import models as mtf_models

_PIECES = 300
_VOCAB = _PIECES + 100  # mtf pads it to 512 rows (vocab_divisor 128)
_ROWS = 512


@pytest.fixture(scope="module")
def t5_vocabulary(tmp_path_factory, heldout_paragraphs):
  """The path of a SentencePiece model file in T5's layout."""
  model = io.BytesIO()
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(heldout_paragraphs[:2000]), model_writer=model,
      vocab_size=_PIECES, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
      bos_id=-1, num_threads=1, minloglevel=2)
  path = tmp_path_factory.mktemp("t5_vocabulary") / "spm.model"
  path.write_bytes(model.getvalue())
  return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory, t5_vocabulary):
  """(mtf model_dir, thattn model_dir, mtf variables)."""
  root = tmp_path_factory.mktemp("t5_vocabulary_convert")
  variables = layouts.save_as_t5(root / "mtf", layouts.T5_1_0,
                                 vocab_size=_VOCAB, seed=3)
  assert variables["shared/embedding"].shape[0] == _ROWS
  assert "encoder/final_layer_norm/scale" in variables
  convert.mtf_to_thattn(mtf_model_dir=str(root / "mtf"),
                        model_dir=str(root / "thattn"),
                        vocabulary=str(t5_vocabulary), sequence_length=32,
                        log=lambda line: None)
  return root / "mtf", root / "thattn", variables


def test_the_tokenizer_is_t5s_and_the_logits_are_mtfs(converted):
  _, thattn_dir, variables = converted
  tokenizer = tokenizers.load(str(thattn_dir / "tokenizer"))
  assert isinstance(tokenizer, tokenizers.T5SentencepieceTokenizer)
  assert tokenizer.vocab_size == _ROWS
  assert tokenizer.special.sentinels[0] == _VOCAB - 1
  with open(thattn_dir / "run_config.json") as f:
    config = json.load(f)
  assert config["eos_id"] == 1 and config["overrides"]["vocab_size"] == _ROWS
  # Text in, through the tokenizer: the ids T5's vocabulary gives.
  ids = tokenizer.tokenize(tf.constant([
      "Return a list of the names.", "Keys map to values."])).to_tensor()
  inputs = np.pad(ids.numpy(), [(0, 0), (0, 1)])  # room for padding
  targets = np.array([[tokenizer.special.sentinels[0], 5, 1],
                      [tokenizer.special.sentinels[1], 1, 0]], np.int32)
  expected = mtf_models.logits(gin_text=layouts.T5_1_0,
                               vocab_size=_VOCAB, variables=variables,
                               inputs=inputs, targets=targets)
  got = model_convert_test._thattn_logits(  # pylint: disable=protected-access
      models.load(str(thattn_dir)), inputs, targets)
  model_convert_test._assert_logits_equal(  # pylint: disable=protected-access
      expected, got, targets)


def test_a_vocabulary_of_another_size_is_refused(tmp_path, t5_vocabulary,
                                                 converted):
  mtf_dir, _, _ = converted
  gin_text = model_convert_test.T5_1_0
  small = mtf_models.initial_variables(gin_text=gin_text, vocab_size=100,
                                       seed=3)  # 128 rows: too few
  mtf_models.write_model_dir(mtf_model_dir=str(tmp_path / "small"),
                             gin_text=gin_text, variables=small, step=1)
  with pytest.raises(ValueError, match=r"spm.model: vocab_size=128 is "
                     r"smaller than the model's 300 pieces"):
    convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "small"),
                          model_dir=str(tmp_path / "out"),
                          vocabulary=str(t5_vocabulary))
  assert not os.path.exists(tmp_path / "out")
  assert os.path.isdir(mtf_dir)


def test_fine_tunes_exports_and_serves_text(converted, tiny_bert_flags,
                                            tmp_path):
  _, thattn_dir, _ = converted
  train_files = tiny_bert_flags[0]
  run = tmp_path / "fine_tuned"
  stdout = cli.run_ok(cli.command(
      "train", "--task=span_corruption", f"--init_checkpoint={thattn_dir}",
      f"--model_dir={run}", train_files, "--train_steps=2", "--batch_size=2",
      "--sequence_length=32", "--eval_steps=1", "--warmup_steps=1",
      "--log_every=1"), env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert "Backbone initialized from" in stdout
  assert "the --init_checkpoint run's" in stdout  # its tokenizer
  served = tf.saved_model.load(str(run / "export"))
  out = served.signatures["serving_default"](
      text=tf.constant(["Return a list of the names."]))
  assert out["text"].shape == (1,)
  tokens = out["tokens"].numpy()
  assert tokens.shape[0] == 1 and tokens.max() < _ROWS


def test_thattns_own_vocabulary_on_padded_rows_fine_tunes(
    tmp_path, sentencepiece_model, tiny_bert_flags):
  """thattn's SentencePiece layout (1,000 ids, 100 of them sentinels) on an
  mtf model whose embedding mtf padded to 1,024 rows: the converted
  tokenizer keeps the rows as its vocab_size (so the fine-tuned model has
  the checkpoint's shape) and produces, and draws random tokens from, its
  1,000 ids only."""
  vocabulary = tmp_path / "thattn_spm.model"
  vocabulary.write_bytes(sentencepiece_model)
  layouts.save_as_t5(tmp_path / "mtf", layouts.T5_1_0, vocab_size=1000,
                     seed=4)
  convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                        model_dir=str(tmp_path / "thattn"),
                        vocabulary=str(vocabulary), sequence_length=32,
                        log=lambda line: None)
  tokenizer = tokenizers.load(str(tmp_path / "thattn" / "tokenizer"))
  assert isinstance(tokenizer, tokenizers.SentencepieceTokenizer)
  assert (tokenizer.vocab_size, tokenizer.token_count) == (1024, 1000)
  # The same vocabulary given as a thattn tokenizer folder (saved unpadded).
  tokenizers.SentencepieceTokenizer(
      sentencepiece_model, num_sentinels=100).save(str(tmp_path / "folder"))
  convert.mtf_to_thattn(mtf_model_dir=str(tmp_path / "mtf"),
                        model_dir=str(tmp_path / "from_folder"),
                        vocabulary=str(tmp_path / "folder"),
                        sequence_length=32, log=lambda line: None)
  from_folder = tokenizers.load(str(tmp_path / "from_folder" / "tokenizer"))
  assert (from_folder.vocab_size, from_folder.token_count) == (1024, 1000)
  stdout = cli.run_ok(cli.command(
      "train", "--task=span_corruption",
      f"--init_checkpoint={tmp_path / 'thattn'}",
      f"--model_dir={tmp_path / 'fine_tuned'}", tiny_bert_flags[0],
      "--train_steps=2", "--batch_size=2", "--sequence_length=32",
      "--eval_steps=1", "--warmup_steps=1", "--log_every=1", "--noexport"),
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
  assert "Backbone initialized from" in stdout
  assert "step      2/2" in stdout
