"""thattn's traced code runs without AutoGraph (see thattn.ops.autograph).

A training run is started through the binary in a fresh Python whose
AutoGraph transpiler records every function it converts; none of thattn's
(nor tensorflow_text's, which thattn's dataset functions call) may be
among them. A fresh process, because AutoGraph caches a conversion for the
life of a process.
"""

import json
import os
import sys

import tensorflow as tf
import tf_keras

from tests import forkserver
from thattn.ops import autograph

_TRACER = """
import atexit, json, sys
from tensorflow.python.autograph.impl import api
converted = []
convert = api._convert_actual
def recording(entity, program_ctx):
  converted.append(f"{entity.__module__}.{entity.__qualname__}")
  return convert(entity, program_ctx)
api._convert_actual = recording
atexit.register(lambda: print("CONVERTED " + json.dumps(converted)))
from thattn.bin import train
sys.argv = ["thattn-train"] + sys.argv[1:]
train.run()
"""


def test_a_training_run_converts_none_of_thattns_functions(tiny_bert_flags,
                                                             tmp_path):
  result = forkserver.run(
      [sys.executable, "-c", _TRACER, *tiny_bert_flags, "--train_steps=2",
       f"--model_dir={tmp_path / 'run'}"],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
      text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  line, = [line for line in result.stdout.splitlines()
           if line.startswith("CONVERTED ")]
  converted = [name for name in json.loads(line[len("CONVERTED "):])
               if name.startswith(("thattn", "tensorflow_text"))]
  assert converted == []
  assert "step      2/2" in result.stdout


class _RecordsTraining(tf_keras.layers.Layer):

  @autograph.unconverted
  def call(self, inputs, training=None):
    self.seen = training
    return inputs


def test_an_unconverted_call_still_gets_training_from_tf_keras():
  # tf_keras passes `training` only to a call whose signature names it.
  layer = _RecordsTraining()
  model = tf_keras.Sequential([layer])
  model(tf.zeros([1, 2]), training=True)
  assert layer.seen is True
  model(tf.zeros([1, 2]), training=False)
  assert layer.seen is False
