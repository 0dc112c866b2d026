"""--task=prefix_lm: the delimited rows and their batches against a
transcription by hand, a tf_keras run that learns, whose export and
thattn-generate continue a prefix as the loaded backbone does, and the
refusals. (Step for step on Keras 3: tests/training/keras3_tasks_test.py;
on Mesh TensorFlow's delimited LM: tests/mtf/train_backend_test.py; the
model: tests/models/prefix_lm_test.py.)"""

import json

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from thattn import models
from thattn.data import batches
from thattn.data import tokenizers

_EOS, _PAD = 2, 0
# [prefix, EOS, target, EOS, padding], width 9: prefix 7 8 9, target 4 5.
_ROW = np.array([[7, 8, 9, _EOS, 4, 5, _EOS, _PAD, _PAD]], np.int32)


def _batch(start_token):
  return {key: value.numpy() for key, value in next(iter(
      batches.prefix_lm_batches(_ROW, eos_id=_EOS, batch_size=1, seed=0,
                                shuffle=False,
                                start_token=start_token))).items()}


def test_a_batch_reads_the_prefix_both_ways_and_scores_the_target():
  batch = _batch(None)
  np.testing.assert_array_equal(batch["inputs"], [[7, 8, 9, 2, 4, 5, 2, 0]])
  np.testing.assert_array_equal(batch["targets"], [[8, 9, 2, 4, 5, 2, 0, 0]])
  # The prefix and the position that reads its end token (it predicts
  # the target's first token) attend both ways.
  np.testing.assert_array_equal(batch["causal_attention"],
                                [[1, 1, 1, 1, 0, 0, 0, 0]])
  # Scored: the target's tokens 4, 5 and its end token.
  np.testing.assert_array_equal(batch["loss_weights"],
                                [[0, 0, 0, 1, 1, 1, 0, 0]])


def test_a_t5_batch_reads_the_targets_after_the_start_token():
  """Mesh TensorFlow's delimited LM feed: the targets are the row, the
  region is its inputs part and one more position."""
  batch = _batch(0)
  np.testing.assert_array_equal(batch["targets"], [[7, 8, 9, 2, 4, 5, 2, 0]])
  np.testing.assert_array_equal(batch["inputs"], [[0, 7, 8, 9, 2, 4, 5, 2]])
  np.testing.assert_array_equal(batch["causal_attention"],
                                [[1, 1, 1, 1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch["loss_weights"],
                                [[0, 0, 0, 0, 1, 1, 1, 0]])


def test_the_rows_split_each_piece_of_a_document_once(sentencepiece_model):
  tokenizer = tokenizers.SentencepieceTokenizer(sentencepiece_model,
                                               num_sentinels=100)
  special = tokenizer.special
  documents = ["The function returns a list of the names it found. " * 4,
               "Short."]
  rows = batches.prefix_lm_rows(documents, tokenizer, 16, eos_id=special.eos,
                                pad_id=special.pad, seed=3)
  again = batches.prefix_lm_rows(documents, tokenizer, 16,
                                 eos_id=special.eos, pad_id=special.pad,
                                 seed=3)
  np.testing.assert_array_equal(rows, again)  # seeded
  assert rows.shape[1] == 16
  pieces = []
  for row in rows:
    ends = np.flatnonzero(row == special.eos)
    assert len(ends) == 2 and ends[0] >= 1 and ends[1] - ends[0] >= 2
    assert (row[ends[1] + 1:] == special.pad).all() and ends[1] <= 14
    pieces += list(row[:ends[0]]) + list(row[ends[0] + 1:ends[1]])
  want = tokenizer.tokenize(tf.constant(documents)).numpy()
  # Every token of both documents, in order (no piece was too short).
  assert pieces == [int(t) for ids in want for t in ids]
  with pytest.raises(ValueError, match="needs width >= 5"):
    batches.prefix_lm_rows(documents, tokenizer, 4, eos_id=special.eos,
                           pad_id=special.pad, seed=0)


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_flags):
  """A 30-step Llama-shaped prefix LM with talking heads, exported."""
  model_dir = tmp_path_factory.mktemp("prefix_lm") / "run"
  flags = [flag for flag in tiny_bert_flags
           if not flag.startswith(("--preset", "--noexport"))]
  stdout = cli.run_ok(cli.command(
      "train", f"--model_dir={model_dir}", "--task=prefix_lm",
      "--preset=lm_tiny", "--attention=talking_heads", "--train_steps=30",
      "--checkpoint_every=30", "--learning_rate=0.01", *flags))
  return model_dir, stdout


def test_the_run_learns_and_continues_a_prefix_as_its_backbone(run):
  model_dir, stdout = run
  assert "prefix_lm:" in stdout
  summary = json.loads((model_dir / "summary.json").read_text())
  assert summary["held_out_ln_ppl_after"] < summary["held_out_ln_ppl_before"]
  config = json.loads((model_dir / "run_config.json").read_text())
  assert config["overrides"]["prefix_lm"] is True
  backbone = models.load(str(model_dir))
  assert "decoder_causal_attention" in backbone.input
  tokenizer = tokenizers.load(str(model_dir / "tokenizer"))
  prompt = "The first"
  ids = tokenizer.tokenize(tf.constant([prompt])).numpy()[0].tolist()
  # The prompt is the prefix, ended by the end token as in training.
  want = models.generate(backbone, [ids + [config["eos_id"]]], max_length=32,
                         eos_id=config["eos_id"],
                         pad_id=config["pad_id"])["tokens"]
  served = tf.saved_model.load(str(model_dir / "export"))
  got = served.signatures["serving_default"](tf.constant([prompt]))
  np.testing.assert_array_equal(got["tokens"].numpy(), want.numpy())
  stdout = cli.run_ok(cli.command("generate", f"--model_dir={model_dir}",
                                  f"--prompt={prompt}"))
  assert stdout.splitlines()[-1] == got["text"].numpy()[0].decode()


def test_mtf_refuses_a_tokenizer_whose_end_token_is_not_1(tmp_path,
                                                         tiny_bert_flags):
  result = cli.run(cli.command(
      "train", f"--model_dir={tmp_path / 'x'}", "--task=prefix_lm",
      "--preset=t5_tiny_lm", "--backend=mtf", "--train_steps=1",
      *tiny_bert_flags[:2]))
  assert result.returncode != 0
  assert ("Mesh TensorFlow's prefix LM finds the prefix by the end token 1 "
          "and the padding by 0; the run's tokenizer has eos=2, pad=0"
          in result.stderr), result.stderr[-2000:]
