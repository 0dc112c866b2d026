"""thattn-export: write a SavedModel that serves raw text from a model_dir.

    thattn-export --model_dir=thattn_runs/mlm_bert_tiny_talking_heads \
        --export_dir=/tmp/served
    saved_model_cli show --all --dir /tmp/served

See `thattn.export` for the signatures. A `--backend=mtf` run is converted
to Keras first (`thattn.launch.export_run`). The export is atomic: a
failure leaves no partial SavedModel at --export_dir, and any previous
export there stays until the new one is complete.

Nothing it did not write is ever deleted: --export_dir must be absent,
empty or an earlier thattn export (its thattn_export.json), and never a
training run's folder, a folder holding one, or a folder inside one other
than its export/ (the default); --overwrite does not change that. The
export is staged beside --export_dir in `.<name>.incomplete-<pid>`; what a
killed export left there (thattn's own staging folders, with their
.thattn-staging.json marker, of processes that are gone) is removed by the
next export into the same --export_dir.
"""

import sys

from thattn.bin import cli

cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn import export as export_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.io import run_dir  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.io import write_failures  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A model_dir written by thattn-train.")
flags.DEFINE_string("export_dir", None, "Where the SavedModel goes; default "
                    "<model_dir>/export.")
flags.DEFINE_string("checkpoint", None, "A checkpoint to export instead of "
                    "the latest one.")
flags.DEFINE_bool("overwrite", False, "Accepted for older scripts; changes "
                  "nothing: an earlier thattn export at --export_dir is "
                  "always replaced (atomically), and a folder of other files "
                  "or a training run never is.")
flags.mark_flag_as_required("model_dir")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  export_dir = (FLAGS.export_dir or
                run_dir.path(FLAGS.model_dir, run_dir.EXPORT))
  try:
    # Before anything is read or written, whichever backend trained the run.
    export_lib.check_export_dir(export_dir, model_dir=FLAGS.model_dir)
    cli.export_run(model_dir=FLAGS.model_dir, export_dir=export_dir,
                   program="thattn-export", checkpoint=FLAGS.checkpoint,
                   log=cli.print_now)
  except (ValueError, write_failures.WriteFailed) as e:  # no traceback
    sys.exit(f"thattn-export: error: {e}")
  cli.print_now(f"Inspect it: saved_model_cli show --all --dir {export_dir}")


def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
