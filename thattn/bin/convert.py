"""thattn-convert: checkpoints people have to thattn model_dirs, and back.

    # A Hugging Face BERT, ALBERT, GPT-2, Llama or GPT-NeoX folder -> thattn,
    # as multi-head attention or any projected variant started at the
    # identity (equal outputs); a DiffLlama or Qwen3-Next folder as its own
    # differential or gated attention:
    thattn-convert --source=bert-base-uncased --model_dir=runs/bert \
        --attention=talking_heads
    # A T5-style mtf model_dir (operative_config.gin + model.ckpt-N) -> thattn
    # (--source finds the format from the files, as --mtf_model_dir says it):
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
`thattn.converters`, `thattn.mtf.convert`, docs/coming_from_keras.md and
docs/mtf.md.
"""

import sys

from thattn.bin import cli

cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

from thattn import converters  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.core import variants  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.io import write_failures  # pylint: disable=g-import-not-at-top,wrong-import-position
from thattn.models import hugging_face_decoders  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("source", None, "--to=thattn: the folder to convert, "
                    "its format found from its files: a Hugging Face BERT, "
                    "ALBERT or decoder-only LM folder, a KerasHub preset, "
                    "Google's release, or a Mesh TensorFlow model_dir.")
flags.DEFINE_enum("source_format", None, list(converters.FORMATS),
                  "--source's format, where its files do not say.")
flags.DEFINE_enum("attention", None,
                  list(dict.fromkeys(variants.identity_starts() +
                                     hugging_face_decoders.held_attentions())),
                  "--source=<Hugging Face, KerasHub or Google folder>: the "
                  "attention of the thattn model (default: the source's "
                  "own); a multi-head source starts a projected variant at "
                  "the identity, its outputs the source's.")
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
flags.DEFINE_integer("sequence_length", None, "--to=thattn from Mesh "
                     "TensorFlow: the input length recorded for fine-tuning "
                     "and serving (default 512).")
flags.mark_flags_as_required(["model_dir"])
for _name in ("source", "mtf_model_dir", "model_dir"):
  flags.register_validator(
      _name, lambda value: value is None or bool(value.strip()),
      message=f"--{_name} is empty; expected a folder.")


def _mtf_to_thattn(mtf_model_dir):
  convert = cli.import_mtf("convert", "thattn-convert")
  length = FLAGS.sequence_length or convert.DEFAULT_SEQUENCE_LENGTH
  convert.mtf_to_thattn(
      mtf_model_dir=mtf_model_dir, model_dir=FLAGS.model_dir,
      checkpoint_step=FLAGS.checkpoint_step, vocabulary=FLAGS.vocabulary,
      sequence_length=length, log=cli.print_now)


def _to_thattn():
  """--source or --mtf_model_dir, dispatched on the source's format."""
  if (FLAGS.source is None) == (FLAGS.mtf_model_dir is None):
    raise app.UsageError("--to=thattn reads one folder: give --source (any "
                         "format) or --mtf_model_dir (Mesh TensorFlow).")
  if FLAGS.mtf_model_dir is not None:
    return _mtf_to_thattn(FLAGS.mtf_model_dir)
  source_format = FLAGS.source_format or converters.detect(FLAGS.source)
  if source_format == converters.MTF:
    if FLAGS.attention is not None:
      raise app.UsageError("--attention converts a BERT or ALBERT; a Mesh "
                           "TensorFlow model keeps the attention it has.")
    return _mtf_to_thattn(FLAGS.source)
  converters.convert(source=FLAGS.source, model_dir=FLAGS.model_dir,
                     attention=FLAGS.attention, source_format=source_format,
                     log=cli.print_now)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  try:
    if FLAGS.to == "thattn":
      _to_thattn()
    else:
      if FLAGS.mtf_model_dir is None:
        raise app.UsageError("--to=mtf writes --mtf_model_dir; give it.")
      convert = cli.import_mtf("convert", "thattn-convert")
      convert.thattn_to_mtf(model_dir=FLAGS.model_dir,
                            mtf_model_dir=FLAGS.mtf_model_dir,
                            checkpoint=FLAGS.checkpoint, log=cli.print_now)
  except (ValueError, write_failures.WriteFailed) as e:  # no traceback
    sys.exit(f"thattn-convert: error: {e}")


def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
