"""The run directory (model_dir): its file names and layout, defined once.

What `thattn-train` leaves in a model_dir:

| name                    | what                                              |
|-------------------------|---------------------------------------------------|
| `run_config.json`       | task, preset, overrides, sizes, the modules of a user's variants: what a rerun must match and what `thattn-export` rebuilds the model from |
| `checkpoints/`          | `tf.train.CheckpointManager` checkpoints; a keras3 run: step folders `N/`, Orbax's on JAX, safetensors' elsewhere (`thattn.io.checkpoint_reading`) |
| `train/`, `eval/`       | TensorBoard summaries                             |
| `tokenizer/`            | the run's tokenizer (none for recall)             |
| `dtensor_layouts.json`  | --strategy=dtensor: each weight's and slot's layout |
| `summary.json`          | the final summary, also printed                   |
| `export/`               | the SavedModel, unless --export_dir says elsewhere |
| `.thattn.lock`          | held by the run using the model_dir (`run_lock`)  |

A `--backend=keras3` run keeps the same files; its checkpoints are step
folders of the Keras 3 values (Orbax steps on JAX, one safetensors file on
TensorFlow and PyTorch), which `thattn.io.checkpoint_reading` reads into
tf_keras objects by name, so everything that reads a Keras run reads it.
A `--backend=mtf` run keeps Mesh TensorFlow's files instead of
`checkpoints/`: `operative_config.gin` and `model.ckpt-N`
(`thattn.mtf.training`); its run_config.json says `"backend": "mtf"`.

Plain Python: this module imports no framework.
"""

import json
import os

# etils' paths: local files through os, gs:// and other file systems
# through TensorFlow's gfile where it is installed (or fsspec), so that a
# model_dir is read and written alike with or without TensorFlow (the
# Keras 3 models load runs on JAX and PyTorch: thattn.keras3.models.load).
from etils import epath

from thattn.core import variants
from thattn.io import checkpoint_reading

RUN_CONFIG = "run_config.json"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer"
DTENSOR_LAYOUTS = "dtensor_layouts.json"
EXPORT = "export"
SUMMARY_FOLDERS = ("train", "eval")
# What trained a run (run_config.json's "backend"): tf-keras, Keras 3, or
# Mesh TensorFlow. Runs written before the key existed are Keras runs.
KERAS, KERAS3, MTF = BACKENDS = ("keras", "keras3", "mtf")
# The backends whose model_dirs hold tf_keras checkpoints (`checkpoints/`
# with the backbone and head), which export, load and convert read as
# they are.
KERAS_CHECKPOINTS = (KERAS, KERAS3)
# What a run_config.json without a key means (it predates the key).
IMPLIED_SETTINGS = {"backend": KERAS}
# Any of these in a folder makes it a run's (a model_dir, a Keras
# checkpoints/ folder, an mtf model_dir: operative_config.gin and the TF1
# `checkpoint` state file), which an export or a conversion never replaces.
RUN_MARKERS = (RUN_CONFIG, CHECKPOINTS, "operative_config.gin", "checkpoint")


def path(model_dir, name):
  """The path of one of the names above inside model_dir."""
  return os.path.join(model_dir, name)


def holds_run(folder):
  """The first of `RUN_MARKERS` in folder (a run's folder), or None."""
  for name in RUN_MARKERS:
    if os.path.exists(os.path.join(folder, name)):
      return name
  return None


def read_run_config(model_dir):
  """The run's `run_config.json` as a dict; ValueError if there is none.

  The modules it names as `attention_modules` (a run of a variant
  registered outside thattn, `--attention_module`) are imported, so that
  whatever rebuilds the run's model (thattn-export, `thattn.models.load`,
  `--init_checkpoint`, the converters) finds its variant; a module that
  cannot be imported is named in the ValueError.
  """
  config_path = path(model_dir, RUN_CONFIG)
  if not epath.Path(config_path).exists():
    raise ValueError(f"{model_dir} has no {RUN_CONFIG}: is it a model_dir "
                     "that thattn-train wrote?")
  if epath.Path(config_path).is_dir():
    raise ValueError(f"{config_path} is a folder; expected the JSON object "
                     "thattn-train writes.")
  text = epath.Path(config_path).read_bytes()
  try:
    config = json.loads(text)
  except ValueError as error:  # invalid JSON or UTF-8, or empty
    cause = "it is empty" if not text.strip() else f"not JSON: {error}"
    raise ValueError(f"{config_path} cannot be read ({cause}); expected the "
                     "JSON object thattn-train writes.") from None
  if not isinstance(config, dict):
    raise ValueError(f"{config_path} holds a JSON {type(config).__name__}, "
                     "not the JSON object (task, preset, ...) thattn-train "
                     "writes.")
  try:
    variants.import_modules(config.get("attention_modules", ()))
  except ValueError as error:
    raise ValueError(f"{config_path}: {error}") from None
  return config


def backend(model_dir):
  """The backend of the run in model_dir (`BACKENDS`); ValueError if it
  has no run_config.json, or names a backend thattn does not know."""
  config = read_run_config(model_dir)
  name = config.get("backend", KERAS)
  if name not in BACKENDS:
    raise ValueError(f"{path(model_dir, RUN_CONFIG)}: \"backend\": {name!r} "
                     f"is not a thattn backend; expected one of "
                     f"{', '.join(BACKENDS)}.")
  return name


def backbone_run_config(model_dir):
  """The run config of a model_dir whose backbone a Keras front end can
  rebuild and restore (`thattn.models.load`, `thattn.keras3.models.load`).

  Raises:
    ValueError when model_dir has no run_config.json, is a Mesh TensorFlow
    run (its model.ckpt-N checkpoints are not Keras's: convert it first),
    or has no backbone preset (the recall task).
  """
  config = read_run_config(model_dir)
  if backend(model_dir) not in KERAS_CHECKPOINTS:
    raise ValueError(
        f"{model_dir} is a thattn-train --backend={config['backend']} run; "
        "convert it first: thattn-convert --mtf_model_dir="
        f"{model_dir} --model_dir=<new folder> --vocabulary="
        f"{path(model_dir, TOKENIZER)}, then load that.")
  if not config.get("preset"):
    raise ValueError(
        f"{model_dir}: its run (task {config.get('task')!r}) has no backbone "
        "preset in run_config.json, so there is no backbone to load; "
        "expected a run of a task with presets.")
  return config


def check_init_checkpoint(location, flag="--init_checkpoint"):
  """Refuses a --backend=mtf run as the start of a Keras run.

  Its checkpoints are Mesh TensorFlow's (model.ckpt-N), which a Keras
  model cannot restore: convert it first. Other locations pass (a missing
  checkpoint is named where it is read, `find_checkpoint`).
  """
  folder = run_dir_of(location)
  if not epath.Path(path(folder, RUN_CONFIG)).exists():
    mtf = epath.Path(path(folder, "operative_config.gin")).exists()
  else:
    mtf = backend(folder) == MTF
  if mtf:
    raise ValueError(
        f"{flag}={location!r} is a Mesh TensorFlow model_dir (a thattn-train "
        "--backend=mtf run, or T5's): its model.ckpt-N checkpoints do not "
        "restore into a Keras model. Convert it first: thattn-convert "
        f"--mtf_model_dir={folder} --model_dir=<new folder> "
        "--vocabulary=<its SentencePiece model or tokenizer folder>, then "
        f"pass {flag}=<new folder>.")


def check_or_write_run_config(model_dir, config):
  """Writes run_config.json, or checks a rerun against the one there.

  A setting that a run written by an older thattn did not record is
  accepted and recorded, unless the run implies another value for it
  (`IMPLIED_SETTINGS`: a run without "backend" is a Keras run); every other
  difference is refused.

  Raises:
    ValueError naming every setting that differs from the saved run's.
  """
  config_path = path(model_dir, RUN_CONFIG)
  if epath.Path(config_path).exists():
    recorded = read_run_config(model_dir)
    saved = dict(IMPLIED_SETTINGS, **recorded)
    changed = sorted(key for key in saved
                     if saved.get(key) != config.get(key))
    if changed:
      details = ", ".join(f"{key}: {saved.get(key)!r} -> {config.get(key)!r}"
                          for key in changed)
      raise ValueError(f"{model_dir} holds a run with other settings in its "
                       f"{RUN_CONFIG} ({details}); rerun with the run's "
                       "settings to resume it, or use a new --model_dir to "
                       "start over.")
    if set(config) - set(recorded):
      write_json(config_path, config, sort_keys=True)
    return
  epath.Path(model_dir).mkdir(parents=True, exist_ok=True)
  write_json(config_path, config, sort_keys=True)


def write_json(file_path, value, sort_keys=False):
  epath.Path(file_path).write_text(
      json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")


def read_summary(model_dir):
  """summary.json of a finished run, or None."""
  summary_path = path(model_dir, SUMMARY)
  if not epath.Path(summary_path).exists():
    return None
  return json.loads(epath.Path(summary_path).read_text())


def latest_checkpoint(model_dir):
  """The newest checkpoint prefix of a model_dir; ValueError if none."""
  latest = checkpoint_reading.latest(path(model_dir, CHECKPOINTS))
  if not latest:
    raise ValueError(f"{path(model_dir, CHECKPOINTS)} holds no checkpoint.")
  return latest


def run_dir_of(checkpoint):
  """The model_dir of a checkpoint prefix or step folder, or the folder
  itself."""
  if epath.Path(checkpoint).is_dir() and not checkpoint_reading.is_step(
      checkpoint):
    return checkpoint
  parent = os.path.dirname(checkpoint.rstrip("/"))
  return (os.path.dirname(parent) if os.path.basename(parent) == CHECKPOINTS
          else parent)


def find_checkpoint(location):
  """A checkpoint prefix from a prefix, a checkpoints/ folder or a model_dir."""
  if not epath.Path(location).is_dir() or checkpoint_reading.is_step(
      location):
    return location
  for folder in (path(location, CHECKPOINTS), location):
    latest = checkpoint_reading.latest(folder)
    if latest:
      return latest
  raise ValueError(f"init_checkpoint={location!r}: no checkpoint found there "
                   f"or in its {CHECKPOINTS}/ folder.")


# Short names of the settings in default run names; others keep their own.
_SHORT_NAMES = {"num_heads": "h", "key_dim": "dk", "d_model": "dm",
                "d_ff": "dff", "num_layers": "layers", "sequence_length": "n",
                "batch_size": "b", "learning_rate": "lr", "warmup_steps": "wu",
                "dropout_rate": "drop", "vocab_size": "vocab", "seed": "seed"}


def default_name(*, task, preset=None, attention=None, init_checkpoint=None,
                 settings=None):
  """A run's default folder name, from everything that sets it apart.

  `<task>_<preset>_<attention>`, then one part per entry of `settings`
  (the options the user gave that change what is computed: {"num_heads":
  8} -> `_h8`, {"optimizer": "adam"} -> `_adam`), so that two runs of a
  sweep never share a model_dir. A fine-tuning run without a preset is
  named after the run it starts from (`from-<that model_dir's name>`); a
  task without presets (recall) has no preset part.
  """
  parts = [task]
  if preset:
    parts.append(preset)
  elif init_checkpoint:
    parts.append("from-" + os.path.basename(
        os.path.normpath(run_dir_of(init_checkpoint))))
  if attention:
    parts.append(attention)
  for name, value in (settings or {}).items():
    parts.append(_setting_part(name, value))
  return "_".join(str(part) for part in parts)


def _setting_part(name, value):
  """h8 for num_heads=8, lr0.001, adam, sst2_sample-train for a file path."""
  if isinstance(value, str):
    if os.sep in value:  # a path: its folder and name, without extension
      folder, base = os.path.split(os.path.normpath(value))
      value = "-".join(part for part in (
          os.path.basename(folder), os.path.splitext(base)[0]) if part)
    return value
  short = _SHORT_NAMES.get(name, name)
  return f"{short}{value:g}" if isinstance(value, float) else f"{short}{value}"
