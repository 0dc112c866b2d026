"""Every task with thattn-train --backend=keras3, step for step as the
Keras backend trains it.

Fine-tuning starts from --init_checkpoint of a tiny masked-LM run of each
backend (classification from the keras3 one, SQuAD from the keras one);
span corruption (whose metrics decode greedily: the keras3 run with the
Keras 3 model's T5Generator, under jax.jit), the causal and prefix LMs
and recall train from scratch. Each task runs with --backend=keras and --backend=keras3 (JAX,
the binary's default) on the same flags: the two start from the same
weights and read the same batches, so their per-step losses, held-out
losses and task metrics must agree within the masked-LM comparison's
tolerance (tests/training/keras3_backend_test.py), and the keras3 run's
export must serve as the Keras run's does. Dropout is off: the two
frameworks draw different masks.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests import cli
from tests.keras3 import processes
from tests.training import local_cluster

pytest.importorskip("jax")

_ENV = processes.train_environment()
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "examples")
_STEPS = 4
# Span corruption trains until greedy decoding gets some target tokens
# right, so that its decoding metrics compare more than zeros.
_STEPS_OF = {"span_corruption": 40}
# The two frameworks' float32 sums differ in order, and over span
# corruption's 40 Adafactor steps their losses drift apart by more than the
# 4-step tasks': 1.34e-4 at step 12 (of 40; at most 9e-5 elsewhere
# but steps 24 and 37) on an Intel Xeon with AVX512_BF16, 2026-12-01, the
# same at 772b8ce, which had passed on another draw.
_RTOL_OF = {"span_corruption": 3e-4}
_FINETUNE = ["--sequence_length=64", "--batch_size=4", "--dropout_rate=0",
             "--eval_steps=1", "--warmup_steps=1", "--log_every=1"]
_TASKS = {
    "classification": ("keras3", [
        "--task=classification", "--glue_task=sst2",
        f"--train_files={_EXAMPLES}/sst2_sample/train.tsv",
        f"--eval_files={_EXAMPLES}/sst2_sample/dev.tsv"] + _FINETUNE),
    "squad": ("keras", [
        "--task=squad", "--on_overflow=window", "--noexport",
        f"--train_files={_EXAMPLES}/squad_sample/train.json",
        f"--eval_files={_EXAMPLES}/squad_sample/dev.json"] + _FINETUNE),
    "span_corruption": (None, [
        "--task=span_corruption", "--preset=t5_tiny", "--d_model=16",
        "--d_ff=32", "--num_heads=2", "--num_layers=1",
        "--sequence_length=32", "--batch_size=4", "--dropout_rate=0",
        "--eval_steps=1", "--warmup_steps=1", "--log_every=1",
        "--noexport"]),
    # A Llama-shaped LM with talking heads over shared key and value heads.
    "causal_lm": (None, [
        "--task=causal_lm", "--preset=lm_tiny", "--attention=talking_heads",
        "--d_model=16", "--d_ff=32", "--num_heads=4",
        "--num_key_value_heads=2", "--num_layers=1", "--sequence_length=16",
        "--batch_size=4", "--eval_steps=1", "--warmup_steps=1",
        "--log_every=1", "--noexport"]),
    # A GPT-2-shaped prefix LM: bidirectional over each row's prefix.
    "prefix_lm": (None, [
        "--task=prefix_lm", "--preset=gpt2_tiny", "--d_model=16",
        "--d_ff=32", "--num_heads=4", "--num_layers=1",
        "--sequence_length=16", "--batch_size=4", "--eval_steps=1",
        "--warmup_steps=1", "--log_every=1", "--noexport"]),
    "recall": (None, [
        "--task=recall", "--sequence_length=16", "--d_model=16",
        "--num_heads=2", "--num_layers=1", "--batch_size=4",
        "--eval_steps=1", "--warmup_steps=1", "--log_every=1",
        "--noexport"]),
}


# The pretraining tasks that read the masked-LM runs' text and tokenizer.
_TEXT_TASKS = ("span_corruption", "causal_lm", "prefix_lm")


def _train(model_dir, flags, steps=_STEPS):
  return cli.run_ok(cli.command(
      "train", f"--model_dir={model_dir}", "--deterministic",
      f"--train_steps={steps}", f"--checkpoint_every={steps}", *flags), _ENV)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tiny_bert_flags):
  """{backend: model_dir} of a two-step masked-LM run of each backend."""
  root = tmp_path_factory.mktemp("pretrained")
  for backend in ("keras", "keras3"):
    _train(root / backend, tiny_bert_flags + [f"--backend={backend}",
                                              "--train_steps=2"])
  return {backend: root / backend for backend in ("keras", "keras3")}


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory, pretrained, tiny_bert_flags):
  """{task: {backend: (model_dir, stdout)}}."""
  root = tmp_path_factory.mktemp("task_runs")
  runs = {}
  for task, (init, flags) in _TASKS.items():
    if init:
      flags = flags + [f"--init_checkpoint={pretrained[init]}"]
    if task in _TEXT_TASKS:  # the masked-LM runs' text and tokenizer
      flags = flags + tiny_bert_flags[:2]
    runs[task] = {
        backend: (root / task / backend,
                  _train(root / task / backend,
                         flags + [f"--backend={backend}"],
                         _STEPS_OF.get(task, _STEPS)))
        for backend in ("keras", "keras3")}
  return runs


@pytest.mark.parametrize("task", list(_TASKS))
def test_each_task_trains_on_keras3_as_on_keras(task_runs, task):
  runs = task_runs[task]
  keras_dir, keras_stdout = runs["keras"]
  keras3_dir, keras3_stdout = runs["keras3"]
  # Among the first lines: the framework, and how to choose another.
  assert any(line.startswith("Keras 3 backend: jax (KERAS_BACKEND;")
             for line in keras3_stdout.splitlines()[:3]), keras3_stdout[:500]
  assert "Keras 3 on jax" in keras3_stdout
  if _TASKS[task][0]:
    assert "Backbone initialized from" in keras3_stdout
  want = local_cluster.train_losses(str(keras_dir))
  got = local_cluster.train_losses(str(keras3_dir))
  steps = _STEPS_OF.get(task, _STEPS)
  assert sorted(got) == sorted(want) == list(range(1, steps + 1))
  rtol = _RTOL_OF.get(task, 1e-4)
  for step, loss in want.items():
    np.testing.assert_allclose(got[step], loss, rtol=rtol,
                               err_msg=f"{task}, step {step}")
  # The same summaries: held-out losses and the task's metrics (accuracy;
  # exact match and F1; greedy decoding's; recall's accuracy) alike.
  keras, keras3 = (local_cluster.summary(str(folder))
                   for folder in (keras_dir, keras3_dir))
  assert set(keras) == set(keras3)
  assert keras3["backend"] == "keras3"
  metrics = [key for key in keras if key.startswith("held_out_")]
  # Before, after and the task's own (the causal LM's metric is ln(PPL)).
  assert len(metrics) >= (2 if task.endswith("_lm") else 3), metrics
  for key in metrics:
    np.testing.assert_allclose(keras3[key], keras[key], rtol=rtol,
                               atol=1e-6, err_msg=key)
  # Training moved the model: not two untouched models alike.
  assert not np.allclose(want[steps], want[1], rtol=1e-3), want
  if task == "span_corruption":  # decoding got some tokens right
    assert keras3["held_out_greedy_token_accuracy"] > 0, keras3
  assert (local_cluster.line_formats(keras3_stdout) ==
          local_cluster.line_formats(keras_stdout))


def test_the_keras3_classifier_exports_and_serves_as_the_keras_one(
    task_runs):
  sentences = tf.constant(["a good film", "a dull and tedious mess"])
  outputs = {}
  for backend, (model_dir, _) in task_runs["classification"].items():
    served = tf.saved_model.load(str(model_dir / "export"))
    outputs[backend] = served.signatures["serving_default"](text=sentences)
  assert set(outputs["keras3"]) == set(outputs["keras"]) >= {"logits"}
  np.testing.assert_allclose(outputs["keras3"]["logits"].numpy(),
                             outputs["keras"]["logits"].numpy(),
                             rtol=1e-4, atol=1e-6)


# Keras 3's other backends, each task's first steps: --backend=keras3 picks
# TensorFlow where JAX is not installed (the README), and KERAS_BACKEND
# picks any of the three. A SQuAD step on TensorFlow once stopped with
# "None values not supported" (the pooler SQuAD does not read has no
# gradient there; JAX's is zeros).


@pytest.mark.parametrize("framework", ["tensorflow", "torch"])
def test_each_task_trains_on_keras3s_other_backends(task_runs, pretrained,
                                                    tiny_bert_flags,
                                                    framework, tmp_path):
  pytest.importorskip(framework)
  env = dict(_ENV, KERAS_BACKEND=framework)
  for task, (init, flags) in _TASKS.items():
    if init:
      flags = flags + [f"--init_checkpoint={pretrained[init]}"]
    if task in _TEXT_TASKS:
      flags = flags + tiny_bert_flags[:2]
    steps = _STEPS_OF.get(task, _STEPS)
    stdout = cli.run_ok(cli.command(
        "train", f"--model_dir={tmp_path / task}", "--deterministic",
        f"--train_steps={steps}", f"--checkpoint_every={steps}",
        "--backend=keras3", *flags, "--noexport"), env)
    assert f"Keras 3 on {framework}" in stdout, stdout[:500]
    got = local_cluster.train_losses(str(tmp_path / task))
    want = local_cluster.train_losses(str(task_runs[task]["keras"][0]))
    assert sorted(got) == list(range(1, steps + 1)), (task, got)
    for step in got:
      np.testing.assert_allclose(got[step], want[step],
                                 rtol=_RTOL_OF.get(task, 1e-4),
                                 err_msg=f"{task} on {framework}, step {step}")
