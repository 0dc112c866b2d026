"""The trainer: learning, summaries, checkpoints, resume, tasks and errors."""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import tasks
from thattn.data import corpus
from thattn.data import tokenizers
from thattn.training import options as options_lib
from thattn.training import trainer

TINY_BERT = dict(d_model=32, num_layers=1, d_ff=64, num_heads=4,
                 dropout_rate=0.0, attention="talking_heads")


class _Crash(Exception):
  pass


@pytest.fixture(scope="module")
def text_data(tmp_path_factory, corpus_cache, sentencepiece_model):
  """A small text corpus (the held-out split) and a saved tokenizer."""
  folder = tmp_path_factory.mktemp("text_data")
  documents = corpus.documents("heldout", corpus_cache)
  (folder / "train.txt").write_text("\n\n".join(documents[:40]))
  tokenizers.SentencepieceTokenizer(
      sentencepiece_model, num_sentinels=100).save(str(folder / "tokenizer"))
  return tasks.DataOptions(train_files=str(folder / "train.txt"),
                                tokenizer=str(folder / "tokenizer"))


def _options(**kwargs):
  defaults = dict(train_steps=20, batch_size=8, sequence_length=32,
                  warmup_steps=5, log_every=5, checkpoint_every=10,
                  eval_steps=2)
  return options_lib.TrainOptions(**dict(defaults, **kwargs))


def _mlm(model_dir, text_data, log=print, preset="bert_tiny", **kwargs):
  return trainer.train(
      model_dir=str(model_dir), task="mlm", data=text_data,
      model=tasks.ModelOptions(preset=preset, overrides=TINY_BERT),
      options=_options(**kwargs), log=log)


def _events(folder):
  tags = set()
  for path in glob.glob(os.path.join(folder, "events.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags


def test_mlm_lowers_held_out_ln_ppl_and_writes_everything(tmp_path,
                                                          text_data):
  lines = []
  summary = _mlm(tmp_path, text_data, log=lines.append, train_steps=60,
                 eval_every=30, learning_rate=0.03)
  assert summary["held_out_ln_ppl_after"] < (
      summary["held_out_ln_ppl_before"] - 0.25)
  assert summary["steps"] == 60
  with open(tmp_path / "summary.json") as f:
    assert json.load(f) == summary
  with open(tmp_path / "run_config.json") as f:
    assert json.load(f)["preset"] == "bert_tiny"
  assert os.path.exists(tmp_path / "tokenizer" / "tokenizer.json")
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
  assert {"loss", "learning_rate", "tokens_per_second"} <= _events(
      tmp_path / "train")
  assert "ln_ppl" in _events(tmp_path / "eval")
  assert any("tokens/s" in line and "ETA" in line for line in lines)
  assert any("step     30/60  held-out ln_ppl" in line for line in lines)


def test_resume_after_a_crash_runs_each_step_once(tmp_path, text_data):
  def crash_at_step_15(line):
    if line.startswith("step     15/"):
      raise _Crash()

  with pytest.raises(_Crash):
    _mlm(tmp_path, text_data, log=crash_at_step_15)
  lines = []
  resumed = _mlm(tmp_path, text_data, log=lines.append)
  assert resumed["resumed_from_step"] == 10 and resumed["steps"] == 20
  assert any("Resumed from" in line for line in lines)
  steps = [line.split()[1] for line in lines if line.startswith("step")]
  assert steps == ["15/20", "20/20"]
  # The held-out loss at step 0 survives the crash.
  assert np.isfinite(resumed["held_out_ln_ppl_before"])
  # A rerun with other settings would see other batches: refused.
  with pytest.raises(ValueError, match="batch_size: 8 -> 4"):
    _mlm(tmp_path, text_data, batch_size=4)


def test_span_corruption_trains_a_t5(tmp_path, text_data):
  summary = trainer.train(
      model_dir=str(tmp_path), task="span_corruption", data=text_data,
      model=tasks.ModelOptions(preset="t5_tiny", overrides=dict(
          attention="talking_heads", dropout_rate=0.0)),
      options=_options(train_steps=30, learning_rate=0.03),
      log=lambda line: None)
  assert summary["held_out_ln_ppl_after"] < summary["held_out_ln_ppl_before"]


def _write_tsv(path, rows):
  path.write_text("sentence\tlabel\n" + "".join(
      f"{text}\t{label}\n" for text, label in rows))


def test_classification_fine_tunes_a_pretrained_backbone(tmp_path, text_data):
  pretrained = tmp_path / "pretrained"
  _mlm(pretrained, text_data, train_steps=2, log=lambda line: None)
  rows = [(f"this is a {word} example", label) for word, label in
          (("good", 1), ("bad", 0), ("great", 1), ("awful", 0))] * 8
  _write_tsv(tmp_path / "train.tsv", rows)
  lines = []
  summary = trainer.train(
      model_dir=str(tmp_path / "finetuned"), task="classification",
      data=tasks.DataOptions(train_files=str(tmp_path / "train.tsv"),
                                  glue_task="sst2"),
      # No preset: the model of the init checkpoint's run.
      model=tasks.ModelOptions(preset=None,
                                    overrides={"dropout_rate": 0.0}),
      options=_options(train_steps=30, init_checkpoint=str(pretrained),
                       learning_rate=0.05),
      log=lines.append)
  assert any("Backbone initialized from" in line for line in lines)
  assert any(line.startswith("Model: bert_tiny with") for line in lines)
  assert summary["held_out_accuracy"] == 1.0
  assert summary["held_out_loss_after"] < summary["held_out_loss_before"]


def test_freeze_embeddings_leaves_out_the_embedding_tables():
  from thattn import models  # pylint: disable=g-import-not-at-top
  backbone = models.create_model("albert_tiny")
  names = [v.name for v in tasks.base.trainable_variables(
      [backbone, backbone], freeze_embeddings=True)]
  everything = tasks.base.trainable_variables([backbone, backbone], False)
  assert len(everything) == len(backbone.trainable_variables)  # once each
  assert sorted({v.name for v in everything} - set(names)) == [
      "embedding_projection/bias:0", "embedding_projection/kernel:0",
      "position_embedding/embeddings:0", "type_embeddings/embeddings:0",
      "word_embeddings/embeddings:0"]


def test_fine_tuning_longer_than_the_learned_positions_is_refused(
    tmp_path, text_data):
  pretrained = tmp_path / "pretrained"
  _mlm(pretrained, text_data, train_steps=1, log=lambda line: None)
  (tmp_path / "train.tsv").write_text("sentence\tlabel\na good film\t1\n")
  with pytest.raises(ValueError, match=r"has 64 learned positions, but "
                     r"sequence_length=128; pass --sequence_length=64"):
    trainer.train(
        model_dir=str(tmp_path / "finetuned"), task="classification",
        data=tasks.DataOptions(train_files=str(tmp_path / "train.tsv")),
        options=_options(sequence_length=128,
                         init_checkpoint=str(pretrained)),
        log=lambda line: None)
  assert not (tmp_path / "finetuned").exists()  # refused before writing


def test_squad_trains_and_scores(tmp_path, text_data):
  context = "The cat sat on the mat. The dog slept in the sun."
  data = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
      {"id": "q1", "question": "Where did the cat sit?",
       "answers": [{"text": "on the mat",
                    "answer_start": context.index("on the mat")}]},
      {"id": "q2", "question": "Where did the dog sleep?",
       "answers": [{"text": "in the sun",
                    "answer_start": context.index("in the sun")}]}]}]}]}
  (tmp_path / "squad.json").write_text(json.dumps(data))
  summary = trainer.train(
      model_dir=str(tmp_path / "run"), task="squad",
      data=tasks.DataOptions(train_files=str(tmp_path / "squad.json"),
                                  tokenizer=text_data.tokenizer),
      model=tasks.ModelOptions(preset="bert_tiny", overrides=TINY_BERT),
      options=_options(train_steps=40, batch_size=2, sequence_length=48,
                       learning_rate=0.05),
      log=lambda line: None)
  assert summary["held_out_exact_match"] == 100.0
  assert summary["held_out_f1"] == 100.0


def test_recall_with_adam_under_mirrored_strategy(tmp_path):
  summary = trainer.train(
      model_dir=str(tmp_path), task="recall",
      model=tasks.ModelOptions(preset=None, overrides=dict(
          d_model=16, num_heads=2, num_layers=1, attention="dynamic")),
      options=_options(train_steps=40, sequence_length=8, optimizer="adam",
                       learning_rate=3e-3, strategy="mirrored"),
      log=lambda line: None)
  assert summary["held_out_ln_ppl_after"] < summary["held_out_ln_ppl_before"]
  assert 0.0 <= summary["held_out_accuracy"] <= 1.0


def test_mixed_precision_bfloat16_runs(tmp_path, text_data):
  summary = _mlm(tmp_path, text_data, train_steps=3,
                 mixed_precision="bfloat16", log=lambda line: None)
  assert np.isfinite(summary["held_out_ln_ppl_after"])
  assert tf_keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize("kwargs,message", [
    ({"task": "lm"}, "Unknown task 'lm'"),
    ({"options": {"train_steps": 0}}, "train_steps must be a positive"),
    ({"options": {"optimizer": "sgd"}}, "Unknown optimizer 'sgd'"),
    ({"options": {"strategy": "tpu"}}, "--strategy=tpu found no TPU"),
    ({"model": {"attention": "softmax"}}, "unknown attention variant"),
    ({"model": {"preset": "t5_tiny"}}, "--task=mlm needs a BERT"),
])
def test_bad_arguments(tmp_path, text_data, kwargs, message):
  def build(options=None, model=None, task="mlm"):
    overrides = dict(TINY_BERT, **{k: v for k, v in (model or {}).items()
                                   if k != "preset"})
    return trainer.train(
        model_dir=str(tmp_path), task=task, data=text_data,
        model=tasks.ModelOptions(
            preset=(model or {}).get("preset", "bert_tiny"),
            overrides=overrides),
        options=_options(**(options or {})), log=lambda line: None)
  with pytest.raises(ValueError, match=message):
    build(**kwargs)
