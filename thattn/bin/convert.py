"""thattn-convert: Mesh TensorFlow model_dirs to thattn model_dirs and back.

    # A T5-style mtf model_dir (operative_config.gin + model.ckpt-N) -> thattn:
    thattn-convert --mtf_model_dir=t5_small --model_dir=runs/t5_small \
        --vocabulary=t5_small/sentencepiece.model
    # and back: a checkpoint and an operative_config.gin that
    # mesh_tensorflow.transformer builds and restores.
    thattn-convert --to=mtf --model_dir=runs/t5_small --mtf_model_dir=back

The output appears whole or not at all (staged beside it in
`.<name>.incomplete-<pid>`, renamed at the end), and an output that exists
(a file, or a folder that is not empty) or whose parent cannot be written is
refused before anything is read. What a killed conversion left beside the
same output (thattn's own staging folders, with their .thattn-staging.json
marker, of processes that are gone) is removed by the next one. See
`thattn.mtf.convert` and docs/mtf.md.
"""

import sys

from thattn.bin import cli

cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn import write_failures  # pylint: disable=g-import-not-at-top,wrong-import-position

convert = cli.import_mtf("convert", "thattn-convert")

FLAGS = flags.FLAGS
flags.DEFINE_enum("to", "thattn", ["thattn", "mtf"], "thattn: read "
                  "--mtf_model_dir, write --model_dir. mtf: read --model_dir, "
                  "write --mtf_model_dir.")
flags.DEFINE_string("mtf_model_dir", None, "A Mesh TensorFlow model_dir: "
                    "operative_config.gin and model.ckpt-N.")
flags.DEFINE_string("model_dir", None, "A thattn model_dir.")
flags.DEFINE_integer("checkpoint_step", None, "--to=thattn: convert "
                     "model.ckpt-<step> instead of the newest.")
flags.DEFINE_string("checkpoint", None, "--to=mtf: a checkpoint of "
                    "--model_dir instead of the latest.")
flags.DEFINE_string("vocabulary", None, "--to=thattn: the model's "
                    "SentencePiece model file (or a thattn tokenizer folder), "
                    "saved as the model_dir's tokenizer.")
flags.DEFINE_integer("sequence_length", convert.DEFAULT_SEQUENCE_LENGTH,
                     "--to=thattn: the input length recorded for fine-tuning "
                     "and serving.")
flags.mark_flags_as_required(["mtf_model_dir", "model_dir"])
for _name in ("mtf_model_dir", "model_dir"):
  flags.register_validator(
      _name, lambda value: value is None or bool(value.strip()),
      message=f"--{_name} is empty; expected a folder.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  try:
    if FLAGS.to == "thattn":
      convert.mtf_to_thattn(
          mtf_model_dir=FLAGS.mtf_model_dir, model_dir=FLAGS.model_dir,
          checkpoint_step=FLAGS.checkpoint_step, vocabulary=FLAGS.vocabulary,
          sequence_length=FLAGS.sequence_length, log=cli.print_now)
    else:
      convert.thattn_to_mtf(model_dir=FLAGS.model_dir,
                            mtf_model_dir=FLAGS.mtf_model_dir,
                            checkpoint=FLAGS.checkpoint, log=cli.print_now)
  except (ValueError, write_failures.WriteFailed) as e:  # no traceback
    sys.exit(f"thattn-convert: error: {e}")


def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
