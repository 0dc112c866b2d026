"""thattn-train: train a BERT, ALBERT, T5 or LM with any attention variant.

With no flags it runs the default job: a tiny talking-heads BERT trained with
masked LM on the embedded default corpus (`thattn.data.corpus`), with
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
    thattn-train --strategy=dtensor --mesh_shape=batch:2,model:2
    thattn-train --backend=mtf --task=span_corruption --preset=t5_tiny \\
        --mesh_shape=batch:2,model:2      # in Mesh TensorFlow
    thattn-train --backend=keras3          # in Keras 3, on JAX if installed

Runs go to ./thattn_runs/<task>_<preset>_<attention>, plus one part per
model or training flag given (e.g. _h8 for --num_heads=8), unless
--model_dir says where.
"""

import os
import signal
import sys

from thattn.bin import cli

cli.choose_keras3_framework(sys.argv)  # before TensorFlow loads Keras 3
cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn import launch  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn import sharding  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn import tasks  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.io import write_failures  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.core import variants  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.models import presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import jax_processes  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import progress  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import run as run_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.io import run_dir  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import strategies  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import run_setup  # pylint: disable=g-import-not-at-top,wrong-import-position

# Flags that change what a run computes: a default run name includes each
# one given, so that runs of a sweep get their own model_dirs.
_NAMED_FLAGS = ("backend", "num_heads", "num_key_value_heads", "key_dim",
                "d_model", "num_layers", "d_ff", "sequence_length",
                "batch_size", "optimizer", "learning_rate", "warmup_steps",
                "dropout_rate", "mixed_precision", "seed", "tokenizer",
                "vocab_size", "train_files", "glue_task")


def _task_defaults(attribute):
  return {name: getattr(tasks.get(name), attribute) for name in tasks.names()}


FLAGS = flags.FLAGS
# The contract (docs/architecture.md).
flags.DEFINE_string("preset", None, "Model preset, one of "
                    f"{', '.join(presets.preset_names())}. Default: with "
                    "--init_checkpoint, that run's model; else per task: "
                    f"{_task_defaults('default_preset')} (mlm's widened to "
                    "d_model 128 and d_ff 512: the default job).")
flags.DEFINE_string("attention", "talking_heads", "Attention variant of "
                    f"every layer: {', '.join(variants.names())}, or one "
                    "an --attention_module registers.")
flags.DEFINE_list("attention_module", [], "Python modules to import before "
                  "the run, each registering attention variants with "
                  "thattn.core.variants.register (docs/examples/"
                  "custom_variant.py).")
flags.DEFINE_string("task", "mlm", "Training task, one of "
                    f"{', '.join(tasks.names())}.")
flags.DEFINE_integer("train_steps", 1200, "Total training steps.")
flags.DEFINE_integer("batch_size", 32, "Examples per step (all replicas).")
flags.DEFINE_integer("sequence_length", None, "Tokens per example (T5: the "
                     "encoder input); default per task: "
                     f"{_task_defaults('default_sequence_length')}.")
flags.DEFINE_string("model_dir", None, "Where checkpoints, summaries and the "
                    "export go; default ./thattn_runs/<task>_<preset>_"
                    "<attention>, plus a part per model or training flag "
                    "given (_h8 for --num_heads=8).")
flags.DEFINE_enum("optimizer", "adafactor", list(optimizer_lib.OPTIMIZERS),
                  "Adafactor (the paper's) or Adam.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate, reached at "
                   "the end of warmup; default "
                   f"{optimizer_lib.DEFAULT_LEARNING_RATES}.")
flags.DEFINE_integer("warmup_steps", 100, "Steps at the peak rate before "
                     "the inverse-square-root decay.")
# Data.
flags.DEFINE_string("train_files", None, "Training data (glob): plain text "
                    "(blank lines between documents) or .jsonl for the "
                    "pretraining tasks, GLUE TSV, SQuAD JSON. Default: the "
                    "embedded corpus.")
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
flags.DEFINE_enum("resume_from", "latest", list(options_lib.RESUME_FROM),
                  "A rerun resumes from the latest checkpoint; if that one "
                  "cannot be restored, the run stops and names it. "
                  "latest_intact resumes from the newest one that restores.")
flags.DEFINE_string("init_checkpoint", None, "A checkpoint, or a model_dir, "
                    "whose backbone starts the run (fine-tuning).")
# Model.
flags.DEFINE_bool("freeze_embeddings", False, "Keep the embeddings fixed, as "
                  "the paper does when fine-tuning T5.")
flags.DEFINE_float("dropout_rate", None, "Dropout; default 0 in pretraining "
                   "(the paper's recipe), the preset's when fine-tuning.")
flags.DEFINE_integer("num_heads", None, "Heads h; default: the preset's.")
flags.DEFINE_integer("num_key_value_heads", None, "Shared key/value heads "
                     "h_kv; default: the preset's.")
flags.DEFINE_integer("key_dim", None, "Head size d_k; default d_model / h.")
flags.DEFINE_integer("d_model", None, "Model width; default: the preset's.")
flags.DEFINE_integer("num_layers", None, "Layers; default: the preset's.")
flags.DEFINE_integer("d_ff", None, "Feed-forward width; default: the "
                     "preset's.")
# Devices and reproducibility.
flags.DEFINE_enum("backend", options_lib.KERAS, list(options_lib.BACKENDS),
                  "keras: tf-keras models (every task). keras3: Keras 3 "
                  "models (every task) on KERAS_BACKEND, JAX by "
                  "default where installed (thattn.training.keras3_backend)."
                  " mtf: the T5 model "
                  "built and trained in Mesh TensorFlow "
                  "(mesh_tensorflow.transformer, with mtf's Adafactor), on "
                  "--mesh_shape by --layout_rules; its model_dir is an mtf "
                  "model_dir that thattn-convert takes to Keras "
                  "(thattn.mtf.training).")
flags.DEFINE_enum("mixed_precision", "off", list(options_lib.MIXED_PRECISION),
                  "Compute dtype (variables stay float32); float16 adds "
                  "dynamic loss scaling. --backend=keras and keras3 (Keras "
                  "3's mixed_<dtype> dtype policy); --backend=mtf trains in "
                  "float32.")
flags.DEFINE_integer("seed", 0, "Seed of initialization and data.")
flags.DEFINE_bool("deterministic", False, "Deterministic ops, so that a "
                  "killed and rerun training matches an uninterrupted one.")
flags.DEFINE_enum("strategy", "default", list(strategies.STRATEGIES),
                  "Distribution strategy. dtensor shards the weights "
                  "themselves over --mesh_shape by --layout_rules "
                  "(thattn.training.dtensor).")
flags.DEFINE_float("cluster_timeout", 300, "--strategy=multi_worker_mirrored "
                   "and --backend=mtf over a TF_CONFIG cluster, "
                   "--strategy=dtensor over several clients (DTENSOR_JOBS), "
                   "and --backend=keras3 over JAX processes: "
                   "seconds to wait for every task or client before "
                   "stopping with those that did not answer.")
flags.DEFINE_string("coordinator_address", None, "--backend=keras3 on JAX "
                    "across processes: host:port of process 0, where JAX's "
                    "coordination service listens (with --num_processes and "
                    "--process_id; none of the three on SLURM or Cloud TPU, "
                    "where JAX finds them itself).")
flags.DEFINE_integer("num_processes", None, "--backend=keras3 on JAX: how "
                     "many processes train the run.")
flags.DEFINE_integer("process_id", None, "--backend=keras3 on JAX: this "
                     "process's index, 0 to --num_processes - 1; process 0 "
                     "writes the run's files.")
flags.DEFINE_integer("heartbeat_timeout", 100, "--backend=keras3 on JAX "
                     "across processes: seconds after which the others stop "
                     "(naming it) when a process stops answering. Joining "
                     "waits up to --cluster_timeout.")
flags.DEFINE_string("tpu", None, "TPU name or grpc:// address for "
                    "--strategy=tpu.")
flags.DEFINE_string("mesh_shape", None, "--strategy=dtensor, --backend=mtf "
                    "or --backend=keras3 (JAX): the mesh's axes and sizes, "
                    "major to minor, e.g. batch:2,model:2 (4 devices; across "
                    "JAX processes, every process's). Required with dtensor; "
                    "mtf and keras3 without it run on one device (keras3 "
                    "across processes: the batch over all). Without a GPU, "
                    "the CPU is split into that many logical devices.")
flags.DEFINE_string("layout_rules", None, "--strategy=dtensor, --backend=mtf "
                    "or --backend=keras3: logical axis "
                    "-> mesh axis rules in Mesh TensorFlow's form; logical "
                    "axes without a rule are replicated. Default: "
                    f"{sharding.DEFAULT_LAYOUT_RULES!r} (data "
                    "parallel on batch; query/key and value heads, d_ff and "
                    "vocab on model). Bad rules for the model (e.g. 12 heads "
                    "on model:8) stop the run before any step.")
# Export.
flags.DEFINE_bool("export", True, "Export a SavedModel after training.")
flags.DEFINE_string("export_dir", None, "Default: <model_dir>/export.")


def _model_options(task_class):
  """The preset and overrides the flags ask for.

  No --preset: the run of --init_checkpoint's (the trainer reads it), else
  the task's default preset and its default overrides.
  """
  preset, overrides = FLAGS.preset, {}
  if preset is not None and preset not in presets.PRESETS:
    raise app.UsageError(f"Unknown --preset={preset!r}; expected one of "
                         f"{', '.join(presets.preset_names())}.")
  if FLAGS["attention"].present or not FLAGS.init_checkpoint:
    overrides["attention"] = FLAGS.attention
  for name in ("num_heads", "num_key_value_heads", "key_dim", "num_layers",
               "d_model", "d_ff"):
    if FLAGS[name].value is not None:
      overrides[name] = FLAGS[name].value
  dropout = FLAGS.dropout_rate
  if dropout is None and task_class.pretraining:
    dropout = 0.0  # the paper's pretraining recipe
  if not task_class.supports_dropout:
    if dropout:
      raise app.UsageError(f"--task={task_class.name} has no dropout.")
  elif dropout is not None:
    overrides["dropout_rate"] = dropout
  model = tasks.ModelOptions(
      preset=preset, overrides=overrides,
      freeze_embeddings=FLAGS.freeze_embeddings,
      attention_modules=tuple(FLAGS.attention_module))
  return model if FLAGS.init_checkpoint else run_setup.default_model(
      task_class, model)


def _options(task_class):
  return options_lib.TrainOptions(
      train_steps=FLAGS.train_steps, batch_size=FLAGS.batch_size,
      sequence_length=(FLAGS.sequence_length or
                       task_class.default_sequence_length),
      optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
      warmup_steps=FLAGS.warmup_steps, eval_every=FLAGS.eval_every,
      eval_steps=FLAGS.eval_steps, log_every=FLAGS.log_every,
      checkpoint_every=FLAGS.checkpoint_every, seed=FLAGS.seed,
      deterministic=FLAGS.deterministic,
      mixed_precision=FLAGS.mixed_precision, strategy=FLAGS.strategy,
      tpu=FLAGS.tpu, init_checkpoint=FLAGS.init_checkpoint,
      resume_from=FLAGS.resume_from, cluster_timeout=FLAGS.cluster_timeout,
      mesh_shape=FLAGS.mesh_shape,
      layout_rules=FLAGS.layout_rules, backend=FLAGS.backend,
      coordinator_address=FLAGS.coordinator_address,
      num_processes=FLAGS.num_processes, process_id=FLAGS.process_id,
      heartbeat_timeout=FLAGS.heartbeat_timeout)


def _default_model_dir(task_class, model):
  """thattn_runs/<name>, named by everything these flags set apart."""
  settings = {name: FLAGS[name].value for name in _NAMED_FLAGS
              if FLAGS[name].present}
  attention = (FLAGS.attention if "attention" in model.overrides or
               task_class.default_preset is None else None)
  return os.path.join("thattn_runs", run_dir.default_name(
      task=task_class.name, preset=FLAGS.preset or (
          None if FLAGS.init_checkpoint else model.preset),
      attention=attention, init_checkpoint=FLAGS.init_checkpoint,
      settings=settings))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # progress goes to stdout
  try:
    task_class = tasks.get(FLAGS.task)
  except ValueError as e:
    raise app.UsageError(f"--task: {e}") from None
  try:
    variants.import_modules(FLAGS.attention_module)
    variants.get(FLAGS.attention)
  except ValueError as e:
    raise app.UsageError(f"--attention: {e}") from None
  model = _model_options(task_class)
  model_dir = FLAGS.model_dir or _default_model_dir(task_class, model)
  try:
    summary = launch.train(
        model_dir=model_dir, task=task_class.name, model=model,
        data=tasks.DataOptions(
            train_files=FLAGS.train_files, eval_files=FLAGS.eval_files,
            tokenizer=FLAGS.tokenizer, vocab_size=FLAGS.vocab_size,
            glue_task=FLAGS.glue_task, on_overflow=FLAGS.on_overflow),
        options=_options(task_class), export=FLAGS.export,
        export_dir=FLAGS.export_dir, log=cli.print_now)
  except ValueError as e:  # bad flags or data (DataError): no traceback
    sys.exit(f"thattn-train: error: {e}")
  except write_failures.WriteFailed as e:  # a full or read-only disk
    sys.exit(f"thattn-train: error: {e}")
  except run_lib.Preempted as e:  # SIGTERM: saved at a step boundary
    cli.print_now(f"thattn-train: {e}")
    sys.exit(128 + signal.SIGTERM)  # as a SIGTERM ends a process
  except jax_processes.LostProcess as e:  # a JAX process died
    sys.stdout.flush()
    sys.stderr.write(f"thattn-train: error: {e}\n")
    sys.stderr.flush()
    # Now: JAX's shutdown would wait for the lost process, and its runtime
    # end this one at the heartbeat timeout.
    os._exit(1)  # pylint: disable=protected-access
  except tf.errors.UnavailableError as e:  # a task of the cluster died
    sys.exit(f"thattn-train: error: the cluster lost a task "
             f"({str(e).splitlines()[0]}). Restart every task with the same "
             f"command to resume from the last checkpoint in {model_dir}.")
  if "served" in summary:  # an mtf task that served the chief
    cli.print_now(f"Done: {summary['served']} served the chief's run, "
                  f"which the chief wrote to {model_dir}.")
    return
  _print_where(model_dir, summary, summary["export"])


def _print_where(model_dir, summary, export_dir):
  checkpoints = (model_dir + " (Mesh TensorFlow: model.ckpt-N)"
                 if FLAGS.backend == options_lib.MTF else
                 run_dir.path(model_dir, run_dir.CHECKPOINTS))
  lines = [
      f"Checkpoints:  {checkpoints}",
      f"TensorBoard:  tensorboard --logdir {model_dir}",
      f"Summary:      {run_dir.path(model_dir, run_dir.SUMMARY)}",
  ]
  if export_dir:
    lines.append(f"SavedModel:   {export_dir} (saved_model_cli show --all "
                 f"--dir {export_dir})")
  if summary.get("already_finished"):
    cli.print_now(f"Already trained: {summary['steps']} steps, nothing to "
                  "do. Its results:")
  else:
    cli.print_now(f"Done: {summary['steps']} steps in "
                  f"{progress.format_duration(summary['train_seconds'])} "
                  f"({summary['tokens_per_second']:,} tokens/s).")
  for line in lines:
    cli.print_now(line)


def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
