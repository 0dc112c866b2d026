"""Masked-LM input pipeline speed against bert_tiny's training speed.

Issue 5 asks that the pipeline produce bert_tiny masked-LM batches at least
3x faster than bert_tiny trains on them. This measures, on the embedded
corpus (sequence length 128, batch 32, SentencePiece 8000):

- pipelines, iterated alone (batches/s):
  - "raw text": `masking.mlm_dataset` from the documents, every batch tokenized,
    packed and masked (no cache: the worst case, the first pass);
  - "trainer": `batches.mlm_batches`, thattn-train's pipeline: rows
    tokenized once up front, each batch gathered and masked (stateless);
- training, with thattn-train's step (Adafactor, masked LM), fed from the
  trainer's pipeline (steps/s), for `bert_tiny` as is and for the default
  job's model (bert_tiny at d_model 128, d_ff 512), talking heads.

Pipelines and training are timed apart, then in turns (pipeline, train,
pipeline, ...) for --rounds rounds; medians are reported.

    python benchmarks/input_pipeline.py                 # about 2 minutes
    python benchmarks/input_pipeline.py --out benchmarks/results/input_pipeline.json
"""

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn import tasks  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.data import batches  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.data import corpus  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.data import masking  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.data import tokenizers  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import devices as devices_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

LENGTH, BATCH, VOCAB = 128, 32, 8000
MODELS = {"bert_tiny": {},
          "default job (d_model 128)": {"d_model": 128, "d_ff": 512}}


def _rate(iterator, count, step=None):
  """Elements (or steps) per second over `count`, after one warm-up."""
  first = next(iterator)
  if step is not None:
    step(first)
  started = time.perf_counter()
  for _ in range(count):
    element = next(iterator)
    if step is not None:
      step(element)
  return count / (time.perf_counter() - started)


def _trainer_step(overrides, tokenizer_dir):
  """thattn-train's compiled step for a model, and its objective."""
  objective = tasks.mlm.MaskedLM(
      data=tasks.DataOptions(tokenizer=tokenizer_dir),
      model=tasks.ModelOptions(preset="bert_tiny", overrides=dict(
          overrides, attention="talking_heads", dropout_rate=0.0)),
      files=tasks.TaskFiles(
          tokenizer_dir=os.path.join(tempfile.mkdtemp(), "tokenizer")),
      batch_size=BATCH, sequence_length=LENGTH,
      seed=0, log=lambda line: None)
  objective.build()
  options = options_lib.TrainOptions(batch_size=BATCH, sequence_length=LENGTH)
  optimizer, _ = optimizer_lib.make_optimizer(options)
  optimizer.build(objective.trainable_variables)
  loop = devices_lib.TrainLoop(tf.distribute.get_strategy(), objective, optimizer,
                           loss_scaling=False)
  return tf.function(loop.replica_train_step), objective


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", type=int, default=500,
                      help="pipeline batches per round")
  parser.add_argument("--steps", type=int, default=40,
                      help="training steps per round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--out", default=None, help="write JSON here")
  args = parser.parse_args()

  tokenizer = tokenizers.default_tokenizer("sentencepiece", VOCAB)
  tokenizer_dir = os.path.join(corpus.corpus_dir(),
                               f"tokenizer-sentencepiece-{VOCAB}")
  documents = corpus.documents("train")
  started = time.perf_counter()
  rows = batches.token_rows(documents, tokenizer, LENGTH - 2,
                            separator=tokenizer.special.sep)
  rows_seconds = time.perf_counter() - started
  pipelines = {
      "raw text": lambda: masking.mlm_dataset(
          tf.data.Dataset.from_tensor_slices(documents), tokenizer,
          sequence_length=LENGTH, batch_size=BATCH, repeat=True, seed=0),
      "trainer": lambda: batches.mlm_batches(rows, tokenizer,
                                             batch_size=BATCH, seed=0),
  }
  steps = {name: _trainer_step(overrides, tokenizer_dir)
           for name, overrides in MODELS.items()}
  feeds = {name: iter(objective.train_dataset(0))
           for name, (_, objective) in steps.items()}
  rates = {"raw text": [], "trainer": [], **{name: [] for name in MODELS}}
  for _ in range(args.rounds):
    # A fresh iterator per round: a pipeline left idle while the model
    # trains fills its prefetch buffer, which would flatter its rate.
    for name, make_pipeline in pipelines.items():
      rates[name].append(_rate(iter(make_pipeline()), args.batches))
    for name, (step, _) in steps.items():
      rates[name].append(_rate(feeds[name], args.steps, step))
  result = {name: statistics.median(values) for name, values in rates.items()}
  result["rows_seconds"] = rows_seconds
  result["rows"] = int(rows.shape[0])
  print(f"tokenizing and packing the corpus once: {rows_seconds:.2f} s "
        f"({rows.shape[0]:,} rows)")
  print("| measured | batches/s | ms per batch | x bert_tiny training |")
  print("|---|---:|---:|---:|")
  tiny = result["bert_tiny"]
  for name in rates:
    label = name if name in MODELS else f"pipeline: {name}"
    if name in MODELS:
      label = f"training: {name}"
    print(f"| {label} | {result[name]:.1f} | {1000 / result[name]:.1f} | "
          f"{result[name] / tiny:.1f} |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(dict(result, rounds=rates), f, indent=2)


if __name__ == "__main__":
  main()
