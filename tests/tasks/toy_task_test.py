"""A task defined only here trains, evaluates and exports through the binaries.

`ToyCopy` is registered in this file and nowhere else: the token at each
position must be predicted back through one talking-heads attention layer.
The test runs `thattn-train` and `thattn-export` (their modules' `run`, in
fresh processes that import this file to register the task) and serves the
SavedModel, which shows that adding a task needs no change to the trainer,
the binaries or the export.

`ToyT5Copy`, also registered only here, is the same task on a T5 encoder,
and says how Mesh TensorFlow trains it (`mtf_model`,
`inputs_and_targets`) and how Keras 3 does (`keras3_parts`,
`input_dtypes`, and its loss and metric outputs written once over an ops
namespace): it trains with `--backend=keras`, `--backend=mtf` and
`--backend=keras3` alike, step for step, with its accuracy metric
collected by all three, and no change outside this file.

    python tests/tasks/toy_task_test.py train --task=toy_copy ...
    python tests/tasks/toy_task_test.py export --model_dir=...
"""

import json
import os
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tests import forkserver
from tests.keras3 import processes
from thattn import layers
from thattn import models
from thattn import tasks
from thattn.models import front_end
from thattn.models import heads_and_losses
from thattn.tasks import serving

VOCAB = 12
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class CopyModel(tf_keras.Model):
  """logits[b, n, t] for tokens[b, n]: embed, attend, score."""

  def __init__(self, d_model=16, **kwargs):
    super().__init__(**kwargs)
    self.embed = tf_keras.layers.Embedding(VOCAB, d_model)
    self.attention = layers.TalkingHeadsAttention(num_heads=2, key_dim=8)
    self.score = tf_keras.layers.Dense(VOCAB)

  def call(self, tokens, training=None):
    x = self.embed(tokens)
    return self.score(x + self.attention(x, x, training=training))


@tasks.register
class ToyCopy(tasks.Task):
  """Predict every input token; no tokenizer, no preset."""

  name = "toy_copy"
  default_sequence_length = 8
  supports_dropout = False

  def build(self):
    self.backbone = CopyModel()
    self.backbone(tf.zeros([1, self.sequence_length], tf.int32))

  def _batches(self, *, seed, start_step, num_steps, train):
    del train
    def batch(step):
      return tf.random.stateless_uniform(
          [self.batch_size, self.sequence_length], [seed, step], 0, VOCAB,
          tf.int32)
    steps = tf.data.Dataset.range(start_step, 2**62)
    if num_steps is not None:
      steps = steps.take(num_steps)
    return steps.map(batch)

  def loss(self, batch, training):
    logits = self.backbone(batch, training=training)
    return tasks.base.masked_cross_entropy(batch, logits,
                                           tf.ones_like(batch, tf.float32))

  def extra_eval_metrics(self, num_steps, devices):
    hits = count = 0
    for batch in self.eval_dataset(num_steps):
      logits = devices.fetch(self.backbone(devices.place(batch)))
      hits += int(np.sum(logits.argmax(-1) == batch.numpy()))
      count += batch.shape.num_elements()
    return {"accuracy": hits / count}

  @classmethod
  def serving_module(cls, *, config, checkpoint, tokenizer_dir=None):
    del tokenizer_dir
    backbone = CopyModel()
    backbone(tf.zeros([1, config["sequence_length"]], tf.int32))
    serving.restore(checkpoint, backbone=backbone)
    return CopyServing({"backbone": backbone}, None,
                       config["sequence_length"])


@tasks.register
class ToyT5Copy(tasks.Task):
  """ToyCopy on a T5 encoder and its LM head: one of mtf's models too."""

  name = "toy_t5_copy"
  default_preset = "t5_tiny_encoder"
  default_sequence_length = 8
  config_type = models.T5Config
  mtf_model = "a T5 encoder (toy_task_test.py)"  # an aligned Unitransformer

  @classmethod
  def fits(cls, config):
    return config.stacks == "encoder"

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.model_config = models.model_config(
        self.model_options.preset, **dict(self.model_options.overrides,
                                          vocab_size=VOCAB))

  def build(self):
    self.backbone = models.build_model(self.model_config)

  def _batches(self, *, seed, start_step, num_steps, train):
    del train
    def batch(step):  # ids from 1: mtf leaves targets of 0 unscored
      return tf.random.stateless_uniform(
          [self.batch_size, self.sequence_length], [seed, step], 1, VOCAB,
          tf.int32)
    steps = tf.data.Dataset.range(start_step, 2**62)
    if num_steps is not None:
      steps = steps.take(num_steps)
    return steps.map(batch)

  def loss(self, batch, training):
    return self.loss_of(front_end.TF_KERAS_OPS, self.backbone, None, batch,
                        training, pad_id=0)

  def metric_outputs(self, batch):
    return self.metric_outputs_of(front_end.TF_KERAS_OPS, self.backbone,
                                  None, batch)

  def metrics_of(self, predict, num_steps):
    hits = count = 0
    for batch in self.eval_dataset(num_steps).as_numpy_iterator():
      hits += int(np.sum(predict(batch)[0].argmax(-1) == batch))
      count += batch.size
    return {"accuracy": hits / count}

  def inputs_and_targets(self, batch):
    tokens = np.asarray(batch, np.int32)
    return tokens, tokens

  # Keras 3: the same model on thattn.keras3, the same loss and outputs.
  @classmethod
  def keras3_parts(cls, config, head_config):
    from thattn.keras3 import models as keras3_models  # pylint: disable=g-import-not-at-top
    return keras3_models.build_model(config), None

  @classmethod
  def input_dtypes(cls, config, head):
    return {"tokens": "int32"}

  @classmethod
  def loss_of(cls, task_ops, backbone, head, batch, training, pad_id):
    tokens = batch["tokens"] if isinstance(batch, dict) else batch
    logits = backbone({"encoder_input_tokens": tokens}, training=training)
    return heads_and_losses.masked_cross_entropy(
        task_ops, tokens, logits,
        task_ops.cast(task_ops.ones_like(tokens), "float32"))

  @classmethod
  def metric_outputs_of(cls, task_ops, backbone, head, batch):
    tokens = batch["tokens"] if isinstance(batch, dict) else batch
    return (backbone({"encoder_input_tokens": tokens}, training=False),)


class CopyServing(serving.Serving):

  @serving.signature(serving.IDS)
  def serve_token_ids(self, tokens):
    logits = self._keras.backbone(tokens, training=False)
    return {"predictions": tf.argmax(logits, -1, output_type=tf.int32)}


def _run(binary, *flags):
  env = dict(processes.train_environment(), PYTHONPATH=os.pathsep.join(
      [ROOT] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
  return forkserver.run(
      [sys.executable, os.path.abspath(__file__), binary, *flags],
      capture_output=True, text=True, timeout=300, check=False, env=env)


def test_a_task_registered_in_a_test_trains_evaluates_and_exports(tmp_path):
  model_dir = tmp_path / "run"
  trained = _run("train", "--task=toy_copy", f"--model_dir={model_dir}",
                 "--train_steps=80", "--batch_size=16", "--warmup_steps=10",
                 "--optimizer=adam", "--learning_rate=0.02", "--eval_steps=4",
                 "--eval_every=40", "--log_every=40", "--noexport")
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "toy_copy: " in trained.stdout
  with open(model_dir / "summary.json") as f:
    summary = json.load(f)
  assert summary["task"] == "toy_copy" and summary["steps"] == 80
  assert (summary["held_out_ln_ppl_after"] <
          summary["held_out_ln_ppl_before"] - 1.0)
  assert summary["held_out_accuracy"] > 0.9  # chance: 1/12

  export_dir = tmp_path / "served"
  exported = _run("export", f"--model_dir={model_dir}",
                  f"--export_dir={export_dir}")
  assert exported.returncode == 0, exported.stderr[-3000:]
  served = tf.saved_model.load(str(export_dir))
  tokens = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32)
  predictions = served.signatures["serving_default"](
      tokens=tf.constant(tokens))["predictions"].numpy()
  assert (predictions == tokens).mean() > 0.9


# A progress or result line with its numbers taken out: its format.
_NUMBERS = re.compile(r"\d[\d,.]*(e[-+]\d+)?")


def _line_formats(stdout):
  return [" ".join(_NUMBERS.sub("#", line).split())
          for line in stdout.splitlines()
          if line.startswith(("step ", "Held-out "))]


def test_a_task_registered_in_a_test_trains_on_every_backend(tmp_path):
  """The same run, the same losses, the same summary and progress lines."""
  from tests.training import local_cluster  # pylint: disable=g-import-not-at-top
  runs = {}
  for backend in ("keras", "mtf", "keras3"):
    model_dir = tmp_path / backend
    result = _run("train", "--task=toy_t5_copy", f"--model_dir={model_dir}",
                  f"--backend={backend}", "--train_steps=8", "--batch_size=4",
                  "--warmup_steps=1", "--learning_rate=0.03", "--eval_steps=2",
                  "--eval_every=4", "--log_every=1", "--deterministic",
                  "--noexport")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(model_dir / "summary.json") as f:
      runs[backend] = (local_cluster.train_losses(str(model_dir)),
                       json.load(f), result.stdout)
  (keras_losses, keras, keras_out), (mtf_losses, mtf, mtf_out) = (
      runs["keras"], runs["mtf"])
  keras3_losses, keras3, keras3_out = runs["keras3"]
  assert "Mesh TensorFlow aligned Unitransformer" in mtf_out
  assert sorted(mtf_losses) == sorted(keras_losses) == list(range(1, 9))
  # Step 1: the same weights on the same batch. Later steps carry the two
  # implementations' rounding through Adafactor (8.3e-4 apart once, in a
  # run with one intra-op thread, which tests/conftest.py no longer sets).
  np.testing.assert_allclose(mtf_losses[1], keras_losses[1], rtol=1e-5)
  for step, loss in keras_losses.items():
    np.testing.assert_allclose(mtf_losses[step], loss, rtol=1e-4,
                               err_msg=f"step {step}")
  assert keras_losses[8] < keras_losses[4]
  assert set(keras) == set(mtf) and mtf["backend"] == "mtf"
  # The task's metric, on mtf's trained weights converted back.
  assert abs(mtf["held_out_accuracy"] - keras["held_out_accuracy"]) < 0.05
  assert _line_formats(keras_out) == _line_formats(mtf_out)
  # Before, 8 steps, the evaluation at step 4, after.
  assert len(_line_formats(mtf_out)) == 11
  # Keras 3 from the same initial weights, with the task's own Keras 3
  # parts; nothing in thattn names the task.
  for step, loss in keras_losses.items():
    np.testing.assert_allclose(keras3_losses[step], loss, rtol=1e-4,
                               err_msg=f"keras3 step {step}")
  assert set(keras3) == set(keras) and keras3["backend"] == "keras3"
  assert abs(keras3["held_out_accuracy"] - keras["held_out_accuracy"]) < 0.05
  assert _line_formats(keras3_out) == _line_formats(keras_out)


def test_unknown_and_duplicate_task_names_are_refused():
  with pytest.raises(ValueError, match="Unknown task 'nonsense'; expected "
                     "one of mlm, span_corruption, causal_lm, prefix_lm, "
                     "classification, "
                     "squad, recall, toy_copy"):
    tasks.get("nonsense")

  class Impostor(ToyCopy):
    pass

  with pytest.raises(ValueError, match="'toy_copy' is registered already"):
    tasks.register(Impostor)


if __name__ == "__main__":
  # Run one of thattn's binaries with ToyCopy registered (above).
  binary = sys.argv.pop(1)
  if binary == "train":
    from thattn.bin import train as main_module  # pylint: disable=g-import-not-at-top
  else:
    from thattn.bin import export as main_module  # pylint: disable=g-import-not-at-top
  main_module.run()
