"""The training loop behind `thattn-train`. It knows no flags.

Today it trains `RecallEncoder` on the synthetic associative-recall task,
with Adam under the inverse-square-root schedule. It checkpoints with
`tf.train.CheckpointManager` (model, optimizer and step) and resumes from
the latest checkpoint in `model_dir`; because the data is a pure function of
(seed, example index), a resumed run continues with exactly the batches an
uninterrupted run would have seen.
"""

import json
import math
import os
import time

import tensorflow as tf
import tf_keras

from thattn import optimizers
from thattn.tasks import recall
from thattn.tasks import recall_model

TASKS = ("recall",)
# Held-out examples come from a different seed stream than training data.
_EVAL_SEED_OFFSET = 1_000_003


def _masked_cross_entropy(targets, logits, weights):
  """Mean cross-entropy (nats) over weighted positions: ln(PPL)."""
  losses = tf_keras.losses.sparse_categorical_crossentropy(
      targets, logits, from_logits=True)
  return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


def _masked_accuracy(targets, logits, weights):
  correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                             targets), tf.float32)
  return tf.reduce_sum(correct * weights) / tf.reduce_sum(weights)


def _evaluate(model, batches):
  losses, accuracies = [], []
  for tokens, targets, weights in batches:
    logits = model(tokens, training=False)
    losses.append(_masked_cross_entropy(targets, logits, weights))
    accuracies.append(_masked_accuracy(targets, logits, weights))
  return float(tf.reduce_mean(losses)), float(tf.reduce_mean(accuracies))


def _format_duration(seconds):
  minutes, seconds = divmod(int(seconds), 60)
  return f"{minutes}m{seconds:02d}s"


def train(*, model_dir, attention="talking_heads", task="recall",
          train_steps=1000, batch_size=64, sequence_length=24,
          learning_rate=3e-3, warmup_steps=100, num_layers=2, d_model=64,
          num_heads=4, key_dim=None, seed=0, log_every=100,
          checkpoint_every=500, eval_batches=8, deterministic=False,
          log=print):
  """Trains, evaluates before and after, and returns a summary dict.

  `learning_rate` is the peak rate, reached at the end of warmup; the
  schedule is `InverseSqrtSchedule(warmup_steps, train_steps)` scaled to it.
  `deterministic` turns on TensorFlow's op determinism (process-wide), so
  that a run killed and resumed ends bit for bit where an uninterrupted run
  does; without it, multithreaded reductions may differ in the last bits.
  """
  if task not in TASKS:
    raise ValueError(f"Unknown task {task!r}; this version of thattn-train "
                     f"supports {TASKS}.")
  for name, value in (("train_steps", train_steps),
                      ("batch_size", batch_size),
                      ("warmup_steps", warmup_steps),
                      ("log_every", log_every),
                      ("checkpoint_every", checkpoint_every)):
    if value <= 0:
      raise ValueError(f"{name} must be positive, got {value}.")
  # Seeds Python, NumPy and TensorFlow: unseeded tf-keras initializers draw
  # their seeds from Python's random module.
  tf_keras.utils.set_random_seed(seed)
  if deterministic:
    tf.config.experimental.enable_op_determinism()
  config = recall.RecallConfig.for_sequence_length(sequence_length)
  model = recall_model.RecallEncoder(
      num_keys=config.num_keys, num_values=config.num_values,
      attention=attention,
      num_layers=num_layers, d_model=d_model, num_heads=num_heads,
      key_dim=key_dim)
  schedule = optimizers.InverseSqrtSchedule(
      warmup_steps, train_steps, scale=learning_rate * math.sqrt(warmup_steps))
  optimizer = tf_keras.optimizers.Adam(schedule)
  model(tf.zeros([1, config.sequence_length, 2], tf.int32))  # create weights
  optimizer.build(model.trainable_variables)

  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  manager = tf.train.CheckpointManager(
      checkpoint, os.path.join(model_dir, "checkpoints"), max_to_keep=3)
  if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    log(f"Resumed from {manager.latest_checkpoint} at step "
        f"{int(optimizer.iterations)}.")
  start_step = int(optimizer.iterations)

  eval_data = list(recall.dataset(config, batch_size=batch_size,
                                  seed=seed + _EVAL_SEED_OFFSET)
                   .take(eval_batches))
  eval_before = _evaluate(model, eval_data)
  log(f"{attention} on recall ({config.num_pairs} pairs, "
      f"{config.num_queries} queries, length {config.sequence_length}); "
      f"{model.count_params():,} parameters.")
  log(f"Held-out before: ln(PPL) {eval_before[0]:.3f}, "
      f"accuracy {eval_before[1]:.3f}")

  @tf.function
  def train_step(tokens, targets, weights):
    with tf.GradientTape() as tape:
      loss = _masked_cross_entropy(targets, model(tokens, training=True),
                                   weights)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss

  data = recall.dataset(config, batch_size=batch_size, seed=seed,
                        start_index=start_step * batch_size)
  tokens_per_step = batch_size * config.sequence_length
  started = time.time()
  window_start, window_losses = time.time(), []
  for tokens, targets, weights in data.take(train_steps - start_step):
    window_losses.append(float(train_step(tokens, targets, weights)))
    step = int(optimizer.iterations)
    if step % log_every == 0 or step == train_steps:
      elapsed = time.time() - window_start
      rate = len(window_losses) * tokens_per_step / max(elapsed, 1e-9)
      eta = (train_steps - step) * tokens_per_step / rate
      log(f"step {step:>6}/{train_steps}  loss {sum(window_losses) / len(window_losses):.4f}"
          f"  lr {float(schedule(step)):.2e}  {rate:,.0f} tokens/s"
          f"  ETA {_format_duration(eta)}")
      window_start, window_losses = time.time(), []
    if step % checkpoint_every == 0 or step == train_steps:
      manager.save(checkpoint_number=step)

  eval_after = _evaluate(model, eval_data)
  summary = {
      "attention": attention, "task": task,
      "steps": int(optimizer.iterations), "resumed_from_step": start_step,
      "parameters": model.count_params(),
      "held_out_ln_ppl_before": eval_before[0],
      "held_out_ln_ppl_after": eval_after[0],
      "held_out_accuracy_before": eval_before[1],
      "held_out_accuracy_after": eval_after[1],
      "train_seconds": time.time() - started,
      "checkpoint": manager.latest_checkpoint,
  }
  with open(os.path.join(model_dir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  log(f"Held-out after:  ln(PPL) {eval_after[0]:.3f}, "
      f"accuracy {eval_after[1]:.3f}")
  log(f"Checkpoints: {os.path.join(model_dir, 'checkpoints')}")
  log(f"Summary: {os.path.join(model_dir, 'summary.json')}")
  return summary
