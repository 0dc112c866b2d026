"""thattn-train: train a BERT, ALBERT or T5 with any attention variant.

With no flags it runs the default job: a tiny talking-heads BERT trained with
masked LM on the embedded default corpus (`thattn.tasks.corpus`), with
Adafactor and the inverse-square-root schedule, in a few minutes on 2 CPU
cores. It prints held-out ln(PPL) before and after, saves checkpoints and
TensorBoard summaries, exports a SavedModel that serves raw text, and says
where everything went. Rerunning the same command resumes.

Examples:
    thattn-train                                       # the default job
    thattn-train --attention=multi_head --num_heads=8
    thattn-train --task=span_corruption --preset=t5_tiny
    thattn-train --task=classification --train_files=train.tsv \\
        --eval_files=dev.tsv --glue_task=sst2 --init_checkpoint=<mlm run>
    thattn-train --task=recall --sequence_length=64 --key_dim=4
    thattn-train --strategy=dtensor --mesh_shape=batch:2,model:2 \
        --layout_rules="batch:batch;heads:model;d_ff:model;vocab:model"
"""

import os
import sys

# Before TensorFlow loads: keep its C++ start-up notes off the terminal.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn.layers import variants  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.models import presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.tasks import dtensor_training  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.tasks import finetuning  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.tasks import objectives  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.tasks import strategies  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.tasks import trainer  # pylint: disable=g-import-not-at-top,wrong-import-position

# Per task when --sequence_length is not given.
DEFAULT_SEQUENCE_LENGTHS = {"mlm": 128, "span_corruption": 128,
                            "classification": 128, "squad": 256, "recall": 24}
_PRETRAINING = ("mlm", "span_corruption", "recall")
# The default job's model: bert_tiny (2 layers, 4 heads) widened so that it
# learns more than word frequencies in a few minutes on 2 CPU cores.
DEFAULT_JOB_MODEL = ("bert_tiny", {"d_model": 128, "d_ff": 512})

FLAGS = flags.FLAGS
# The contract (DESIGN.md).
flags.DEFINE_string("preset", None, "Model preset (thattn.models.PRESETS). "
                    "Default: for mlm, bert_tiny widened to d_model 128 and "
                    "d_ff 512 (the default job); with --init_checkpoint, "
                    "that run's model; else per task: "
                    f"{trainer.DEFAULT_PRESETS}.")
flags.DEFINE_enum("attention", "talking_heads", list(variants.VARIANTS),
                  "Attention variant of every attention layer.")
flags.DEFINE_enum("task", "mlm", list(trainer.TASKS), "Training task.")
flags.DEFINE_integer("train_steps", 1200, "Total training steps.")
flags.DEFINE_integer("batch_size", 32, "Examples per step (all replicas).")
flags.DEFINE_integer("sequence_length", None, "Tokens per example (T5: the "
                     "encoder input); default per task: "
                     f"{DEFAULT_SEQUENCE_LENGTHS}.")
flags.DEFINE_string("model_dir", None, "Where checkpoints, summaries and the "
                    "export go; default ./thattn_runs/<task>_<preset>_"
                    "<attention>.")
flags.DEFINE_enum("optimizer", "adafactor", list(trainer.OPTIMIZERS),
                  "Adafactor (the paper's) or Adam.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate, reached at "
                   "the end of warmup; default "
                   f"{trainer.DEFAULT_LEARNING_RATES}.")
flags.DEFINE_integer("warmup_steps", 100, "Steps at the peak rate before "
                     "the inverse-square-root decay.")
# Data.
flags.DEFINE_string("train_files", None, "Training data (glob): plain text "
                    "(documents separated by blank lines) for mlm and "
                    "span_corruption, a GLUE-style TSV for classification, "
                    "SQuAD JSON for squad. Default: the embedded corpus.")
flags.DEFINE_string("eval_files", None, "Held-out data, as --train_files.")
flags.DEFINE_string("tokenizer", "sentencepiece", "sentencepiece, wordpiece, "
                    "or a folder written by Tokenizer.save.")
flags.DEFINE_integer("vocab_size", 8000, "Vocabulary size of a learned "
                     "tokenizer.")
flags.DEFINE_string("glue_task", "sst2", "classification: the GLUE task "
                    "whose TSV layout and labels the files follow.")
flags.DEFINE_enum("on_overflow", "raise", ["raise", "truncate", "drop",
                                           "window"],
                  "Fine-tuning examples longer than --sequence_length: "
                  "raise, truncate (classification), window (squad) or drop.")
# Evaluation, logging, checkpoints.
flags.DEFINE_integer("eval_every", 400, "Steps between held-out "
                     "evaluations (0: before and after only).")
flags.DEFINE_integer("eval_steps", 20, "Held-out batches per evaluation.")
flags.DEFINE_integer("log_every", 100, "Steps between progress lines.")
flags.DEFINE_integer("checkpoint_every", 400, "Steps between checkpoints.")
flags.DEFINE_string("init_checkpoint", None, "A checkpoint, or a model_dir, "
                    "whose backbone starts the run (fine-tuning).")
# Model.
flags.DEFINE_bool("freeze_embeddings", False, "Keep the embeddings fixed, as "
                  "the paper does when fine-tuning T5.")
flags.DEFINE_float("dropout_rate", None, "Dropout; default 0 in pretraining "
                   "(the paper's recipe), the preset's when fine-tuning.")
flags.DEFINE_integer("num_heads", None, "Heads h; default: the preset's.")
flags.DEFINE_integer("key_dim", None, "Head size d_k; default d_model / h.")
flags.DEFINE_integer("d_model", None, "Model width; default: the preset's.")
flags.DEFINE_integer("num_layers", None, "Layers; default: the preset's.")
flags.DEFINE_integer("d_ff", None, "Feed-forward width; default: the "
                     "preset's.")
# Devices and reproducibility.
flags.DEFINE_enum("mixed_precision", "off", list(trainer.MIXED_PRECISION),
                  "Compute dtype (variables stay float32).")
flags.DEFINE_integer("seed", 0, "Seed of initialization and data.")
flags.DEFINE_bool("deterministic", False, "Deterministic ops, so that a "
                  "killed and rerun training matches an uninterrupted one.")
flags.DEFINE_enum("strategy", "default", list(strategies.STRATEGIES),
                  "Distribution strategy. dtensor shards the weights "
                  "themselves over --mesh_shape by --layout_rules "
                  "(thattn.tasks.dtensor_training).")
flags.DEFINE_string("tpu", None, "TPU name or grpc:// address for "
                    "--strategy=tpu.")
flags.DEFINE_string("mesh_shape", None, "--strategy=dtensor: the mesh's "
                    "axes and sizes, major to minor, e.g. batch:2,model:2 "
                    "(4 devices). Required with dtensor; an error without it. "
                    "Without a GPU, the CPU is split into that many logical "
                    "devices.")
flags.DEFINE_string("layout_rules", None, "--strategy=dtensor: logical axis "
                    "-> mesh axis rules in Mesh TensorFlow's form; logical "
                    "axes without a rule are replicated. Default: "
                    f"{dtensor_training.DEFAULT_LAYOUT_RULES!r} (data "
                    "parallel on batch; query/key and value heads, d_ff and "
                    "vocab on model). Bad rules for the model (e.g. 12 heads "
                    "on model:8) stop the run before any step.")
# Export.
flags.DEFINE_bool("export", True, "Export a SavedModel after training.")
flags.DEFINE_string("export_dir", None, "Default: <model_dir>/export.")


def _model_options(task):
  """The preset and overrides the flags ask for.

  No --preset: the default job's model for mlm (DEFAULT_JOB_MODEL), the
  pretraining run's for --init_checkpoint (the trainer reads it), else the
  task's default preset.
  """
  preset, overrides = FLAGS.preset, {}
  if FLAGS["attention"].present or not FLAGS.init_checkpoint:
    overrides["attention"] = FLAGS.attention
  if preset is None and task == "mlm" and not FLAGS.init_checkpoint:
    preset, defaults = DEFAULT_JOB_MODEL
    overrides.update(defaults)
  if preset is not None and preset not in presets.PRESETS:
    raise app.UsageError(f"Unknown --preset={preset!r}; see "
                         "thattn.models.preset_names().")
  for name in ("num_heads", "key_dim", "num_layers", "d_model", "d_ff"):
    if FLAGS[name].value is not None:
      overrides[name] = FLAGS[name].value
  dropout = FLAGS.dropout_rate
  if dropout is None and task in _PRETRAINING:
    dropout = 0.0
  if dropout is not None and task != "recall":
    overrides["dropout_rate"] = dropout
  elif dropout:
    raise app.UsageError("--task=recall has no dropout.")
  return objectives.ModelOptions(preset=preset, overrides=overrides,
                                 freeze_embeddings=FLAGS.freeze_embeddings)


def _options(task):
  return trainer.TrainOptions(
      train_steps=FLAGS.train_steps, batch_size=FLAGS.batch_size,
      sequence_length=(FLAGS.sequence_length or
                       DEFAULT_SEQUENCE_LENGTHS[task]),
      optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
      warmup_steps=FLAGS.warmup_steps, eval_every=FLAGS.eval_every,
      eval_steps=FLAGS.eval_steps, log_every=FLAGS.log_every,
      checkpoint_every=FLAGS.checkpoint_every, seed=FLAGS.seed,
      deterministic=FLAGS.deterministic,
      mixed_precision=FLAGS.mixed_precision, strategy=FLAGS.strategy,
      tpu=FLAGS.tpu, init_checkpoint=FLAGS.init_checkpoint,
      mesh_shape=FLAGS.mesh_shape, layout_rules=FLAGS.layout_rules)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # progress goes to stdout
  task = FLAGS.task
  model = _model_options(task)
  model_dir = FLAGS.model_dir or os.path.join(
      "thattn_runs", "_".join(str(part) for part in (
          task, model.preset or "finetuned", FLAGS.attention)))
  try:
    if FLAGS.strategy == strategies.DTENSOR and FLAGS.mesh_shape:
      split = dtensor_training.split_cpu(FLAGS.mesh_shape)
      if split:
        _print_now(f"No GPU: the CPU runs the mesh as {split} logical "
                   "devices, sharing its cores (sharded, not faster).")
    summary = trainer.train(
        model_dir=model_dir, task=task, model=model,
        data=objectives.DataOptions(
            train_files=FLAGS.train_files, eval_files=FLAGS.eval_files,
            tokenizer=FLAGS.tokenizer, vocab_size=FLAGS.vocab_size),
        options=_options(task),
        finetune=finetuning.FinetuneOptions(glue_task=FLAGS.glue_task,
                                            on_overflow=FLAGS.on_overflow),
        log=_print_now)
  except ValueError as e:  # bad flags or data (DataError): no traceback
    sys.exit(f"thattn-train: error: {e}")
  export_dir = None
  if FLAGS.export:
    from thattn import export  # pylint: disable=g-import-not-at-top
    export_dir = FLAGS.export_dir or os.path.join(model_dir, "export")
    export.export(model_dir=model_dir, export_dir=export_dir, log=_print_now)
  _print_where(model_dir, summary, export_dir)


def _print_where(model_dir, summary, export_dir):
  lines = [
      f"Checkpoints:  {os.path.join(model_dir, trainer.CHECKPOINTS)}",
      f"TensorBoard:  tensorboard --logdir {model_dir}",
      f"Summary:      {os.path.join(model_dir, trainer.SUMMARY)}",
  ]
  if export_dir:
    lines.append(f"SavedModel:   {export_dir} (saved_model_cli show --all "
                 f"--dir {export_dir})")
  _print_now(f"Done: {summary['steps']} steps in "
             f"{trainer.format_duration(summary['train_seconds'])} "
             f"({summary['tokens_per_second']:,} tokens/s).")
  for line in lines:
    _print_now(line)


def _print_now(line):
  # Flushed at once, so progress shows when stdout is a pipe or a log file.
  print(line, flush=True)


def run():
  app.run(main)


if __name__ == "__main__":
  run()
