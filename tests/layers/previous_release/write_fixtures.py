"""Writes the previous-release fixtures that `compatibility_test.py` loads.

Run once, at commit e4958b1 (before the drop-in change renamed the
constructor arguments to tf_keras's `dropout` / `output_shape` and reordered
the call signature), and committed with its output:

    TF_USE_LEGACY_KERAS=1 python tests/layers/previous_release/write_fixtures.py

It writes, next to itself:
- `attention_layers.keras`: a functional tf_keras model of the three layers,
  saved with that release's configs (`dropout_rate`, `output_dim`);
- `model_dir/`: a tiny talking-heads T5 model_dir (run_config.json and one
  CheckpointManager checkpoint) as `thattn.models.load` reads it;
- `expected.npz`: the inputs and what that release computed from them.
Rerunning it with a later release would overwrite the evidence: don't.
"""

import json
import os

import numpy as np
import tensorflow as tf
import tf_keras

from thattn import layers
from thattn import models

HERE = os.path.dirname(os.path.abspath(__file__))
T5_OVERRIDES = {"num_heads": 2, "d_model": 16, "d_ff": 32}


def _layers_model():
  query = tf_keras.Input((6, 8), name="query")
  memory = tf_keras.Input((5, 12), name="memory")
  talking = layers.TalkingHeadsAttention(
      num_heads=3, key_dim=4, value_dim=5, num_key_heads=2, num_value_heads=4,
      dynamic_projections=["x2l", "m2w"], output_dim=10, dropout_rate=0.25,
      use_bias=True, name="talking")(query, memory)
  multi = layers.MultiHeadAttention(
      num_heads=2, key_dim=3, output_dim=7, dropout_rate=0.1,
      name="multi")(query, memory)
  bilinear = layers.GeneralBilinearAttention(
      num_heads=2, output_dim=9, name="bilinear")(query, memory)
  return tf_keras.Model([query, memory], [talking, multi, bilinear])


def main():
  tf.keras.utils.set_random_seed(7)
  rng = np.random.default_rng(7)
  query = rng.normal(size=(2, 6, 8)).astype(np.float32)
  memory = rng.normal(size=(2, 5, 12)).astype(np.float32)
  model = _layers_model()
  talking, multi, bilinear = model([query, memory])
  model.save(os.path.join(HERE, "attention_layers.keras"))

  t5 = models.create_model("t5_tiny", **T5_OVERRIDES)
  model_dir = os.path.join(HERE, "model_dir")
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, "run_config.json"), "w") as f:
    json.dump({"task": "span_corruption", "preset": "t5_tiny",
               "overrides": T5_OVERRIDES}, f)
  tf.train.CheckpointManager(tf.train.Checkpoint(backbone=t5),
                             os.path.join(model_dir, "checkpoints"),
                             max_to_keep=1).save(checkpoint_number=1)
  inputs = {"encoder_input_tokens": rng.integers(1, 64, size=(2, 7)),
            "decoder_input_tokens": rng.integers(1, 64, size=(2, 4))}
  logits = t5({name: tf.constant(v, tf.int32) for name, v in inputs.items()})
  np.savez(os.path.join(HERE, "expected.npz"), query=query, memory=memory,
           talking=talking.numpy(), multi=multi.numpy(),
           bilinear=bilinear.numpy(), t5_logits=logits.numpy(), **inputs)


if __name__ == "__main__":
  main()
