"""SavedModel export of a trained model_dir, serving raw text.

`export(model_dir=..., export_dir=...)` rebuilds the model that
`thattn-train` trained (from `run_config.json`), restores its latest
checkpoint and writes a SavedModel with two signatures. The model and the
signatures come from the run's task (`thattn.tasks.get(task)
.serving_module`), so this module knows no task; the built-in ones serve:

| task                | serving_default (strings in)                   | serve_token_ids (ids in)            |
|---------------------|------------------------------------------------|-------------------------------------|
| mlm                 | text -> sequence_output, pooled_output, input_mask, input_word_ids | BERT's three inputs -> encodings |
| classification      | text (text_b for pairs) -> logits, predictions | BERT's inputs -> logits             |
| squad               | question, context -> answer, start/end logits  | BERT's inputs -> start/end logits   |
| span_corruption     | text -> text (generated), tokens               | encoder_input_tokens -> tokens      |
| recall              | (no text) the token-ids signature              | tokens [b, n, 2] -> logits          |

Tokenization runs inside the graph (tensorflow-text; `thattn.tasks.serving`),
so a client needs only `tensorflow` and `tensorflow_text`:

    import tensorflow as tf, tensorflow_text  # registers the text ops
    model = tf.saved_model.load(export_dir)
    model.signatures["serving_default"](text=tf.constant(["Some text."]))

Texts longer than the trained sequence length are truncated. The
tokenizer's files (`tokenizer.json` and `vocab.txt` or `sentencepiece.model`)
are saved as assets, in `export_dir/assets/`.

The export is atomic: everything is written to a hidden staging folder
beside export_dir, then renamed into place. A failed export removes the
staging folder and leaves any previous export untouched, so nothing that
looks like a valid SavedModel appears at export_dir unless it is complete;
what a killed export left is removed by the next one. A non-empty
export_dir that is not a thattn export is refused unless `overwrite=True`
(`thattn-export --overwrite`): the export replaces its target whole.
"""

import json
import os
import re
import shutil
import time

import tensorflow as tf

from thattn import tasks
from thattn import run_dir

EXPORT_INFO = "thattn_export.json"


def build_serving_module(model_dir, checkpoint=None):
  """(the serving module, run config, checkpoint path) of a model_dir."""
  config = run_dir.read_run_config(model_dir)
  if checkpoint is None:
    try:
      checkpoint = run_dir.latest_checkpoint(model_dir)
    except ValueError as e:
      raise ValueError(f"Nothing to export: {e}") from None
  tokenizer_dir = (run_dir.path(model_dir, config["tokenizer_dir"])
                   if config.get("tokenizer_dir") else None)
  module = tasks.get(config["task"]).serving_module(
      config=config, checkpoint=checkpoint, tokenizer_dir=tokenizer_dir)
  return module, config, checkpoint


def _signatures(module):
  signatures = {"serve_token_ids": module.serve_token_ids}
  signatures["serving_default"] = getattr(module, "serve_text",
                                          module.serve_token_ids)
  return signatures


def _write_info(staging, config, checkpoint):
  info = dict(config, checkpoint=checkpoint,
              signatures=["serving_default", "serve_token_ids"])
  with tf.io.gfile.GFile(os.path.join(staging, EXPORT_INFO), "w") as f:
    f.write(json.dumps(info, indent=2, sort_keys=True) + "\n")


def export(*, model_dir, export_dir, checkpoint=None, overwrite=False,
           log=print):
  """Writes the SavedModel of model_dir's latest checkpoint to export_dir.

  Atomic (see the module): an existing export_dir is replaced only by a
  complete new export. A non-empty export_dir that is not a thattn export
  is refused unless `overwrite` (see `check_export_dir`). Returns
  export_dir.
  """
  started = time.time()
  export_dir = os.path.abspath(export_dir)
  check_export_dir(export_dir, overwrite=overwrite)
  module, config, checkpoint = build_serving_module(model_dir, checkpoint)
  parent, name = os.path.split(export_dir)
  tf.io.gfile.makedirs(parent)
  _remove_leftovers(parent, name, log)
  staging = os.path.join(parent, f".{name}.incomplete-{os.getpid()}")
  try:
    tf.saved_model.save(module, staging, signatures=_signatures(module))
    _write_info(staging, config, checkpoint)
    _replace(staging, export_dir)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  log(f"Exported {config['task']} model ({os.path.basename(checkpoint)}) to "
      f"{export_dir} in {time.time() - started:.1f}s.")
  return export_dir


def is_export(export_dir):
  """Whether export_dir holds a complete thattn export (its marker file)."""
  return os.path.isfile(os.path.join(export_dir, EXPORT_INFO))


def check_export_dir(export_dir, *, overwrite=False):
  """Refuses to replace what is not a thattn export, unless `overwrite`.

  An export replaces its target whole; a target holding the user's own
  files would lose them, so it must be empty, absent, or a previous thattn
  export (recognized by `thattn_export.json`, written last).
  """
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise ValueError(f"export_dir={export_dir!r} is a file, not a folder.")
  if overwrite or not os.path.isdir(export_dir) or is_export(export_dir):
    return
  entries = sorted(os.listdir(export_dir))
  if entries:
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise ValueError(
        f"export_dir={export_dir!r} holds {len(entries)} entries that are not "
        f"a thattn export ({shown}); an export would replace them. Choose "
        "another --export_dir, or pass --overwrite to replace them.")


def _remove_leftovers(parent, name, log):
  """Removes what a killed export of `name` left beside it.

  Only this module's own staging folders (`.<name>.incomplete-<pid>`, and
  `.old` copies of a replaced export) of processes that are no longer
  alive: a live export's staging folder is left alone.
  """
  pattern = re.compile(rf"\.{re.escape(name)}\.incomplete-(\d+)(\.old)?")
  for entry in os.listdir(parent):
    match = pattern.fullmatch(entry)
    if match and not _alive(int(match.group(1))):
      shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
      log(f"Removed {os.path.join(parent, entry)}, left by a killed export.")


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process
  return True


def _replace(staging, export_dir):
  """Moves staging to export_dir; an old export is removed only after."""
  old = None
  if os.path.exists(export_dir):
    old = f"{staging}.old"
    os.rename(export_dir, old)
  os.rename(staging, export_dir)
  if old:
    shutil.rmtree(old, ignore_errors=True)
