"""thattn-generate: print a language model's continuations of prompts.

    thattn-generate --model_dir=thattn_runs/causal_lm_lm_tiny_talking_heads \
        --prompt="The function returns" --max_length=32
    thattn-generate --model_dir=runs/gpt2 --prompt="Once upon a time" \
        --method=sample --temperature=0.8 --top_p=0.9 --seed=1

--model_dir is a --task=causal_lm or prefix_lm run of any backend (a
--backend=mtf run is converted to Keras first, in a temporary folder), or
a model_dir that thattn-convert wrote from a Hugging Face GPT-2, Llama or
GPT-NeoX folder. Each --prompt is tokenized with the run's tokenizer (a T5 LM's
prompt starts with its start token 0, and a prefix LM's prompt is its
prefix, ended by the end token, as their training inputs have them) and
continued on its own with the layers' caches (`thattn.models.
DecoderLMGenerator`): --max_length new tokens, fewer after the run's end
token. As in the run's export, a prompt keeps its last tokens so that it
and its continuation fit the run's sequence length (at least one). For
each prompt it prints a line "> PROMPT" and then the continuation's text.
Nothing is written.
"""

import sys
import tempfile

from thattn.bin import cli

cli.quiet_tensorflow()  # before anything imports TensorFlow

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A --task=causal_lm or prefix_lm "
                    "model_dir (of thattn-train or thattn-convert).")
flags.DEFINE_multi_string("prompt", None, "A text to continue; repeat the "
                          "flag for several.")
flags.DEFINE_integer("max_length", 32, "The new tokens after each prompt.")
flags.DEFINE_enum("method", "greedy", ["greedy", "sample", "beam"],
                  "How each next token is chosen.")
flags.DEFINE_float("temperature", 1.0, "--method=sample: divides the logits.")
flags.DEFINE_integer("top_k", 0, "--method=sample: keep the k likeliest "
                     "tokens (0: all).")
flags.DEFINE_float("top_p", 1.0, "--method=sample: keep the likeliest tokens "
                   "whose probabilities sum to p.")
flags.DEFINE_integer("beam_size", 4, "--method=beam: the beams kept.")
flags.DEFINE_integer("seed", 0, "--method=sample: the sampler's seed.")
flags.DEFINE_string("checkpoint", None, "A checkpoint of a Keras run instead "
                    "of the latest one.")
flags.mark_flags_as_required(["model_dir", "prompt"])

# The tasks whose models continue text.
_LM_TASKS = ("causal_lm", "prefix_lm")


def continuations(model_dir, prompts, *, checkpoint=None, **options):
  """The continuation's text of each prompt, decoded alone, by the
  model_dir's run (see the module); `options` are `DecoderLMGenerator`'s.
  """
  # Imported here: TensorFlow is quieted first (`cli.quiet_tensorflow`).
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from thattn import tasks  # pylint: disable=g-import-not-at-top
  from thattn.data import tokenizers  # pylint: disable=g-import-not-at-top
  from thattn.io import run_dir  # pylint: disable=g-import-not-at-top
  from thattn.training import backend as backend_lib  # pylint: disable=g-import-not-at-top
  config = run_dir.read_run_config(model_dir)
  if config.get("task") not in _LM_TASKS:
    raise ValueError(f"{model_dir} is a --task={config.get('task')} run; "
                     f"thattn-generate continues text with a "
                     f"{' or '.join(_LM_TASKS)} run.")
  backend = run_dir.backend(model_dir)
  if checkpoint and backend not in run_dir.KERAS_CHECKPOINTS:
    raise ValueError(f"--checkpoint applies to Keras runs; {model_dir} is a "
                     f"--backend={backend} run, whose newest checkpoint is "
                     "read.")
  with tempfile.TemporaryDirectory(prefix="thattn-generate-") as temp:
    keras_dir = backend_lib.get(backend).model_dir_for_export(
        model_dir, temp, log=lambda line: None)
    config = run_dir.read_run_config(keras_dir)
    checkpoint = checkpoint or run_dir.latest_checkpoint(keras_dir)
    tokenizer = tokenizers.load(run_dir.path(keras_dir,
                                             config["tokenizer_dir"]))
    generator, start, end = tasks.get(config["task"]).restored_generator(
        config=config, checkpoint=checkpoint, **options)
  texts = []
  for prompt in prompts:
    ids = tokenizer.tokenize(tf.constant([prompt])).numpy()[0].tolist()
    # As the export keeps them: the prompt and its continuation within the
    # positions the run was trained on, where they fit.
    budget = max(config["sequence_length"] - options["max_length"] -
                 len(start) - len(end), 1)
    if len(ids) > budget:
      cli.print_now(f"(the prompt's last {budget} of its {len(ids)} tokens "
                    f"are read: the run was trained on "
                    f"{config['sequence_length']} positions)")
      ids = ids[-budget:]
    tokens = generator(tf.constant([start + ids + end],
                                   tf.int32))["tokens"]
    text = tokenizer.detokenize(tf.RaggedTensor.from_tensor(
        tokens, padding=config["pad_id"]))
    texts.append(text.numpy()[0].decode("utf-8", errors="replace"))
  return texts


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  try:
    texts = continuations(
        FLAGS.model_dir, FLAGS.prompt, checkpoint=FLAGS.checkpoint,
        max_length=FLAGS.max_length, method=FLAGS.method,
        temperature=FLAGS.temperature, top_k=FLAGS.top_k, top_p=FLAGS.top_p,
        beam_size=FLAGS.beam_size, seed=FLAGS.seed)
  except ValueError as e:  # no traceback
    sys.exit(f"thattn-generate: error: {e}")
  for prompt, text in zip(FLAGS.prompt, texts):
    cli.print_now(f"> {prompt}")
    cli.print_now(text)


def run():
  cli.run(main, __name__, __doc__)


if __name__ == "__main__":
  run()
