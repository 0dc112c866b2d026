"""thattn-ablate: does talking heads help on my data, at which head counts?

Trains a grid of attention variant x head count at constant parameters
(h * d_k = d_model, the paper's Table 1), several seeds each, on the
embedded corpus with masked LM or on the synthetic recall task, and writes a
table (ln(PPL) mean +- std, step time, parameters and multiplies per
attention layer), a plot of ln(PPL) against heads and heatmaps of the
learned P_l, P_w and P_l x P_w. Rerunning skips finished runs.

    thattn-ablate --out_dir=docs/ablation
    thattn-ablate --task=recall --heads=1,2,4,8 --out_dir=/tmp/recall
    thattn-ablate --backend=keras3 --out_dir=/tmp/jax  # Keras 3, on JAX

`--backend=keras3` trains every run as `thattn-train --backend=keras3`
does (Keras 3 models, on KERAS_BACKEND: JAX where it is installed), from
the same initial weights and batches as `--backend=keras`.
"""

import os
import sys

from thattn.bin import cli

cli.choose_keras3_framework(sys.argv)  # before TensorFlow loads Keras 3
cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn.core import variants  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn import tasks  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.experiments import ablation  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import optimizer as optimizer_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.training import options as options_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("task", "mlm", "A pretraining task: "
                    f"{', '.join(n for n in tasks.names() if tasks.get(n).pretraining)}"
                    "; mlm trains on the embedded corpus (or --train_files).")
flags.DEFINE_list("variants", ["multi_head", "talking_heads"],
                  f"Attention variants, from {list(variants.names())}.")
flags.DEFINE_list("heads", ["2", "4", "8", "16"], "Head counts h; each must "
                  "divide --d_model.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds per configuration.")
flags.DEFINE_string("out_dir", "thattn_runs/ablation", "Where runs, table "
                    "and plots go.")
flags.DEFINE_string("preset", None, "The preset to resize; default: the "
                    "task's (bert_tiny for mlm).")
flags.DEFINE_integer("d_model", 64, "Model width (h * d_k).")
flags.DEFINE_integer("d_ff", 256, "Feed-forward width.")
flags.DEFINE_boolean("match_parameters", False, "Lower each variant's "
                     "feed-forward width by what its attention adds, so "
                     "that every model has multi-head attention's "
                     "parameters at the same heads (within one "
                     "feed-forward unit per layer).")
flags.DEFINE_integer("num_layers", 2, "Layers.")
flags.DEFINE_integer("train_steps", 600, "Steps per run.")
flags.DEFINE_integer("batch_size", 32, "Examples per step.")
flags.DEFINE_integer("sequence_length", 64, "Tokens per example.")
flags.DEFINE_enum("optimizer", "adafactor", list(optimizer_lib.OPTIMIZERS),
                  "Optimizer.")
flags.DEFINE_float("learning_rate", None, "Peak learning rate; default "
                   f"{optimizer_lib.DEFAULT_LEARNING_RATES}.")
flags.DEFINE_integer("warmup_steps", 100, "Warmup steps.")
flags.DEFINE_integer("eval_steps", 20, "Held-out batches per evaluation.")
flags.DEFINE_enum("backend", options_lib.KERAS,
                  [options_lib.KERAS, options_lib.KERAS3],
                  "keras: tf-keras models. keras3: Keras 3 models on "
                  "KERAS_BACKEND, JAX by default where installed (as "
                  "thattn-train --backend=keras3).")
flags.DEFINE_string("train_files", None, "mlm: text files (glob) instead of "
                    "the embedded corpus.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  try:
    grid = ablation.GridOptions(
        task=FLAGS.task, variants=tuple(FLAGS.variants),
        heads=tuple(int(h) for h in FLAGS.heads),
        seeds=tuple(int(s) for s in FLAGS.seeds), preset=FLAGS.preset,
        d_model=FLAGS.d_model, d_ff=FLAGS.d_ff, num_layers=FLAGS.num_layers,
        match_parameters=FLAGS.match_parameters)
    options = options_lib.TrainOptions(
        train_steps=FLAGS.train_steps, batch_size=FLAGS.batch_size,
        sequence_length=FLAGS.sequence_length, optimizer=FLAGS.optimizer,
        learning_rate=FLAGS.learning_rate, warmup_steps=FLAGS.warmup_steps,
        eval_steps=FLAGS.eval_steps, log_every=FLAGS.train_steps,
        backend=FLAGS.backend,
        checkpoint_every=FLAGS.train_steps)
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    results = ablation.run_grid(
        out_dir=FLAGS.out_dir, grid=grid, options=options,
        data=tasks.DataOptions(train_files=FLAGS.train_files),
        log=cli.print_now)
  except ValueError as e:
    sys.exit(f"thattn-ablate: error: {e}")
  rows, written = ablation.write_report(FLAGS.out_dir, results, grid,
                                      options.sequence_length, log=cli.print_now)
  cli.print_now(ablation.markdown_table(rows))
  for name in written:
    cli.print_now(f"Wrote {os.path.join(FLAGS.out_dir, name)}")



def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
