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
| causal_lm           | text -> text (a greedy continuation), tokens   | prompt_tokens -> tokens             |
| prefix_lm           | text (the prefix) -> text, tokens              | prompt_tokens -> tokens             |
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
what a killed export left is removed by the next one (`thattn.io.staged_writes`:
only thattn's own staging folders, of processes that are gone). The export
replaces its target whole, so it never writes into a folder it did not
write: export_dir must be absent, empty or an earlier thattn export, and
never a training run's folder, a folder holding one, or a folder inside
one other than its `export/` (`check_export_dir`).
"""

import json
import os
import shutil
import time

import tensorflow as tf

from thattn import tasks
from thattn.io import run_dir
from thattn.io import staged_writes

EXPORT_INFO = "thattn_export.json"


def build_serving_module(model_dir, checkpoint=None):
  """(the tf.Module to save, run config, checkpoint path) of a model_dir:
  the task's `serving_module`'s `tf_module()` (`thattn.tasks.serving`)."""
  config = run_dir.read_run_config(model_dir)
  if checkpoint is None:
    try:
      checkpoint = run_dir.latest_checkpoint(model_dir)
    except ValueError as e:
      raise ValueError(f"Nothing to export: {e}") from None
  tokenizer_dir = (run_dir.path(model_dir, config["tokenizer_dir"])
                   if config.get("tokenizer_dir") else None)
  serving = tasks.get(config["task"]).serving_module(
      config=config, checkpoint=checkpoint, tokenizer_dir=tokenizer_dir)
  return serving.tf_module(), config, checkpoint


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
  complete new export, and only if it is empty or an earlier thattn export
  (see `check_export_dir`; `overwrite` is accepted and changes nothing).
  Returns export_dir.
  """
  started = time.time()
  export_dir = os.path.abspath(export_dir)
  run_dir.read_run_config(model_dir)  # a run to export, first
  check_export_dir(export_dir, overwrite=overwrite, model_dir=model_dir)
  module, config, checkpoint = build_serving_module(model_dir, checkpoint)
  tf.io.gfile.makedirs(os.path.dirname(export_dir))
  with staged_writes.staged(export_dir, program="thattn-export",
                      log=log) as folder:
    tf.saved_model.save(module, folder, signatures=_signatures(module))
    _write_info(folder, config, checkpoint)
    staged_writes.unmark(folder)
    _replace(folder, export_dir)
  log(f"Exported {config['task']} model ({os.path.basename(checkpoint)}) to "
      f"{export_dir} in {time.time() - started:.1f}s.")
  return export_dir


def is_export(export_dir):
  """Whether export_dir holds a complete thattn export (its marker file)."""
  return os.path.isfile(os.path.join(export_dir, EXPORT_INFO))


def check_export_dir(export_dir, *, overwrite=False, model_dir=None):
  """Refuses an export_dir whose replacement would delete what it did not write.

  An export replaces its target whole, so the target must be absent, empty,
  or an earlier thattn export (recognized by `thattn_export.json`, written
  last), and must be neither a training run's folder, nor hold one, nor lie
  inside one (other than its `export/` folder, the default target).
  `overwrite` (`thattn-export --overwrite`, kept for older scripts) changes
  nothing: no flag makes an export delete a run or the user's files.

  Raises:
    ValueError naming export_dir and what it holds or lies in.
  """
  del overwrite
  export_dir = os.path.abspath(export_dir)
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise ValueError(f"export_dir={export_dir!r} is a file, not a folder.")
  _check_not_in_a_run(export_dir, model_dir)
  if not os.path.isdir(export_dir):
    return
  _check_holds_no_run(export_dir)
  entries = sorted(os.listdir(export_dir))
  if entries and not is_export(export_dir):
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    raise ValueError(
        f"export_dir={export_dir!r} holds {len(entries)} entries that are not "
        f"a thattn export ({shown}); an export replaces its target whole and "
        "never deletes files it did not write (no flag changes that). "
        "Choose another --export_dir, or an empty or absent folder.")


def _check_not_in_a_run(export_dir, model_dir):
  """export_dir is not a run's folder, nor inside one but for its export/."""
  runs = [os.path.abspath(model_dir)] if model_dir else []
  folder = export_dir
  while True:
    if os.path.isdir(folder) and run_dir.holds_run(folder):
      runs.append(folder)
    parent = os.path.dirname(folder)
    if parent == folder:
      break
    folder = parent
  for run in runs:
    if export_dir == run:
      raise ValueError(
          f"export_dir={export_dir!r} is a training run's folder (it holds "
          f"{run_dir.holds_run(run) or 'the run being exported'}); an export "
          "replaces its target whole and never deletes a run. Choose a new "
          f"folder, such as {run_dir.path(run, run_dir.EXPORT)}.")
    if os.path.commonpath([export_dir, run]) == export_dir:
      _refuse_holding(export_dir, run)
    inside = os.path.relpath(export_dir, run).split(os.sep)
    if inside[0] not in (os.pardir, run_dir.EXPORT):
      raise ValueError(
          f"export_dir={export_dir!r} lies inside the training run {run} (it "
          f"holds {run_dir.holds_run(run) or 'the run being exported'}); an "
          "export there would mix with the run's files. Choose "
          f"{run_dir.path(run, run_dir.EXPORT)} or a folder outside the run.")


def _check_holds_no_run(export_dir):
  """export_dir (or, for an earlier export, anything in it) holds no run."""
  if is_export(export_dir):
    folders = [root for root, _, _ in os.walk(export_dir)]
  else:  # refused anyway if not empty; look one level down for the message
    folders = [os.path.join(export_dir, entry)
               for entry in sorted(os.listdir(export_dir))]
  for folder in folders:
    if os.path.isdir(folder) and run_dir.holds_run(folder):
      _refuse_holding(export_dir, folder)


def _refuse_holding(export_dir, run):
  raise ValueError(
      f"export_dir={export_dir!r} holds the training run {run} (it holds "
      f"{run_dir.holds_run(run) or 'the run being exported'}); an export "
      "replaces its target whole and never deletes a run (no flag changes "
      "that). Choose a new folder for the export.")


def _replace(folder, export_dir):
  """Moves folder to export_dir; an old export is removed only after."""
  old = None
  if os.path.exists(export_dir):
    old = f"{folder}.old"
    os.rename(export_dir, old)
    staged_writes.mark(old, program="thattn-export", target=export_dir)
  os.rename(folder, export_dir)
  if old:
    shutil.rmtree(old, ignore_errors=True)
