"""Mesh TensorFlow model_dirs <-> thattn model_dirs, and per-layer weights.

Whole models (what `thattn-convert` runs):

    convert.mtf_to_thattn(mtf_model_dir="t5_small", model_dir="runs/t5_small",
                          vocabulary="t5_small/sentencepiece.model")
    model = thattn.models.load("runs/t5_small")
    convert.thattn_to_mtf(model_dir="runs/t5_small", mtf_model_dir="back")

An mtf model_dir holds `operative_config.gin` and TF1 checkpoints
`model.ckpt-N` (as T5's public checkpoints do). `mtf_to_thattn` builds the
mtf model from the gin config (`thattn.mtf.models`), reads its architecture
as a `T5Config` (`thattn.mtf.architecture`), maps every variable
(`thattn.mtf.model_map`) and writes a thattn model_dir: `run_config.json`
(task span_corruption, a T5 preset whose every field the overrides set),
`checkpoints/` (the backbone, restorable by `thattn.models.load`,
`thattn-train --init_checkpoint` and `thattn-export`) and, given a
vocabulary, `tokenizer/`. `thattn_to_mtf` writes the gin config and a
checkpoint that `mesh_tensorflow.transformer` builds and restores.

Both write into a hidden staging folder beside the output and rename it
into place at the end (`thattn.converters.model_dir`, the writer every
conversion shares): a failed conversion leaves nothing at the output, and
an output that exists and is not empty is never touched.

Per-layer weights (`keras_layer`, `mtf_to_keras`, `keras_to_mtf`, ...)
are `thattn.mtf.layer_weights`'s, re-exported here.
"""

import os
import re

import tensorflow as tf

from thattn.io import checkpoint_reading
from thattn import models
from thattn.io import run_dir
from thattn.converters import model_dir as model_dir_lib
from thattn.data import tokenizers
from thattn.mtf import architecture
from thattn.mtf import model_map
from thattn.mtf import models as mtf_models
from thattn.models import wiring

# T5's vocabulary: 0 pads and starts decoding, 1 ends a sequence.
T5_EOS_ID = 1
DEFAULT_SEQUENCE_LENGTH = 512
# converted_from's record of the source's mtf LayerStack layout
# (architecture.RMS_NORM or LEGACY), which thattn_to_mtf writes back.
LAYER_STACK = "layer_stack"


def _check_mtf_source(mtf_model_dir):
  """Refuses an empty --mtf_model_dir, and a thattn (Keras) model_dir."""
  if not mtf_model_dir or not str(mtf_model_dir).strip():
    raise ValueError(f"--mtf_model_dir={mtf_model_dir!r} is empty; expected "
                     "a Mesh TensorFlow model_dir (operative_config.gin and "
                     "model.ckpt-N).")
  if (tf.io.gfile.exists(run_dir.path(mtf_model_dir, run_dir.RUN_CONFIG)) and
      run_dir.backend(mtf_model_dir) in run_dir.KERAS_CHECKPOINTS):
    raise ValueError(
        f"--mtf_model_dir={mtf_model_dir!r} is a thattn (Keras) model_dir, "
        "not a Mesh TensorFlow one; to convert it to Mesh TensorFlow: "
        f"thattn-convert --to=mtf --model_dir={mtf_model_dir} "
        "--mtf_model_dir=<new folder>.")


def _thattn_source(model_dir):
  """run_config.json of the --to=mtf source; refuses a --backend=mtf run."""
  if not model_dir or not str(model_dir).strip():
    raise ValueError(f"--model_dir={model_dir!r} is empty; expected a thattn "
                     "model_dir (run_config.json and checkpoints/).")
  run_config = run_dir.read_run_config(model_dir)
  if run_dir.backend(model_dir) == run_dir.MTF:
    raise ValueError(
        f"--model_dir={model_dir!r} is a thattn-train --backend=mtf run: "
        "already a Mesh TensorFlow model_dir (operative_config.gin, "
        "model.ckpt-N), which mesh_tensorflow.transformer reads as it is. To "
        "get a thattn model_dir from it: thattn-convert "
        f"--mtf_model_dir={model_dir} --model_dir=<new folder> "
        f"--vocabulary={run_dir.path(model_dir, run_dir.TOKENIZER)}.")
  return run_config


def _gin_setting(gin_text, name, default):
  """A gin binding of the mtf model's config (macros evaluated)."""
  with mtf_models.gin_scope(gin_text):
    architecture.check_vocab_embedding()
    value = mtf_models.bound_value(name, default)
    return default if value is None else value


def _vocabulary(vocabulary, rows, divisor):
  """The thattn tokenizer for `vocabulary`, checked against the embedding."""
  if tf.io.gfile.isdir(vocabulary):
    tokenizer = tokenizers.load(vocabulary)
  else:
    if not tf.io.gfile.exists(vocabulary):
      raise ValueError(f"vocabulary={vocabulary!r} does not exist; expected "
                       "a SentencePiece model file or a thattn tokenizer "
                       "folder.")
    with tf.io.gfile.GFile(vocabulary, "rb") as f:
      model = f.read()
    try:
      # T5's own vocabularies (100 sentinels past the pieces) or thattn's.
      tokenizer = tokenizers.from_sentencepiece_model(model, vocab_size=rows)
    except ValueError as error:
      raise ValueError(f"vocabulary {vocabulary}: {error}") from error
    except (tf.errors.OpError, RuntimeError) as error:  # not a model at all
      cause = str(error).splitlines()[0][:200] if str(error) else ""
      raise ValueError(
          f"--vocabulary={vocabulary!r} is not a SentencePiece model file "
          f"({type(error).__name__}: {cause}); expected the .model file the "
          "checkpoint was trained with, or a thattn tokenizer folder."
      ) from None
  size = tokenizer.token_count  # the ids it can produce
  padded = -(-size // divisor) * divisor
  if padded != rows:
    raise ValueError(
        f"vocabulary {vocabulary} has {size} tokens (padded to a multiple of "
        f"{divisor}: {padded}), but the checkpoint's shared/embedding has "
        f"{rows} rows; expected the vocabulary the model was trained with.")
  if tokenizer.vocab_size != rows:  # a folder saved without the padding
    tokenizer = tokenizers.load(vocabulary, vocab_size=rows)
  return tokenizer


def _embedding_name(variables, kind):
  """The name of the model's token embedding in the checkpoint, or None.

  A Bitransformer's is `shared/embedding`; a Unitransformer's is
  `<its name>/embedding` (`transformer/embedding` by default).
  """
  if kind == mtf_models.BITRANSFORMER:
    return "shared/embedding" if "shared/embedding" in variables else None
  names = [name for name in variables if re.fullmatch(r"[^/]+/embedding",
                                                      name)]
  return names[0] if len(names) == 1 else None


def _load_mtf(mtf_model_dir, checkpoint_step):
  """(gin text, checkpoint path, {name: array}, model, embedding rows).

  The model is the Bitransformer or Unitransformer the gin config builds.
  """
  gin_text = mtf_models.read_operative_config(mtf_model_dir)
  kind = mtf_models.model_type(gin_text)
  if kind not in mtf_models.MODEL_TYPES:
    raise ValueError(f"{mtf_model_dir}: model_type {kind!r} in "
                     f"{mtf_models.OPERATIVE_CONFIG}; thattn-convert takes "
                     f"{', '.join(mtf_models.MODEL_TYPES)}.")
  checkpoint = mtf_models.latest_checkpoint(mtf_model_dir, checkpoint_step)
  variables = mtf_models.read_checkpoint(checkpoint)
  embedding = _embedding_name(variables, kind)
  if embedding is None:
    expected = ("shared/embedding (a Bitransformer with a shared embedding)"
                if kind == mtf_models.BITRANSFORMER else
                "one <name>/embedding (a Unitransformer's)")
    raise ValueError(f"{checkpoint} has no token embedding variable for "
                     f"model_type {kind!r}; expected {expected}.")
  rows = variables[embedding].shape[0]
  mtf_model = mtf_models.build_model(gin_text=gin_text, vocab_size=rows)
  return gin_text, checkpoint, variables, mtf_model, rows


def _t5_config(gin_text, mtf_model, rows):
  """(T5Config, LayerStack layout) of the built mtf model."""
  layout, legacy_dropout = architecture.model_layout(mtf_model)
  config = architecture.t5_config(
      mtf_model, vocab_size=rows,
      # Both stack layouts normalize with sublayer_rms_norm's epsilon.
      layer_norm_epsilon=_gin_setting(gin_text, "sublayer_rms_norm.epsilon",
                                      1e-6),
      dropout_rate=(legacy_dropout if layout == architecture.LEGACY else
                    _gin_setting(gin_text, "sublayer_dropout.dropout_rate",
                                 0.0)))
  return config, layout


def _run_config(config, *, task, sequence_length, tokenizer, source):
  """run_config.json of the converted model; `source` is its
  model_dir_lib.CONVERTED_FROM entry."""
  return {
      # An aligned (encoder) model's task is the caller's (masked LM's
      # targets are not in the checkpoint); an LM's is the causal LM.
      "task": task or ("prefix_lm" if config.prefix_lm else {
          "encoder_decoder": "span_corruption",
          "decoder": "causal_lm"}.get(config.stacks)),
      "preset": "t5_1_1_base" if config.gated_feed_forward else "t5_base",
      "overrides": model_dir_lib.overrides(config),
      "sequence_length": sequence_length,
      # A thattn tokenizer's own end and padding ids (a T5 vocabulary's
      # are 1 and 0).
      "eos_id": tokenizer.special.eos if tokenizer else T5_EOS_ID,
      "pad_id": tokenizer.special.pad if tokenizer else wiring.PAD_ID,
      "tokenizer_dir": run_dir.TOKENIZER if tokenizer else None,
      model_dir_lib.CONVERTED_FROM: source}


def mtf_to_thattn(*, mtf_model_dir, model_dir, checkpoint_step=None,
                  vocabulary=None, sequence_length=DEFAULT_SEQUENCE_LENGTH,
                  task=None, log=print):
  """Writes the thattn model_dir of an mtf model_dir (either transformer).

  Args:
    mtf_model_dir: holds operative_config.gin and model.ckpt-N.
    model_dir: the thattn model_dir to write; must not exist or be empty.
    checkpoint_step: N of model.ckpt-N; None for the newest.
    vocabulary: a SentencePiece model file or a thattn tokenizer folder,
      written as the model_dir's tokenizer (needed to export and fine-tune
      on text); its size, padded as mtf pads it, must match the embedding.
    sequence_length: the input length recorded for fine-tuning and serving.
    task: the thattn task recorded in run_config.json (what thattn-export
      serves); None: span_corruption for a Bitransformer, causal_lm for an
      LM Unitransformer (prefix_lm for a delimited one), none for an
      aligned one.
    log: where progress lines go.

  Returns:
    The thattn T5Config.

  Raises:
    ValueError naming the file, variable or gin binding that cannot be
    converted; nothing is written then.
  """
  _check_mtf_source(mtf_model_dir)
  model_dir_lib.check_output(model_dir, "--model_dir")
  gin_text, checkpoint, variables, mtf_model, rows = _load_mtf(
      mtf_model_dir, checkpoint_step)
  config, layout = _t5_config(gin_text, mtf_model, rows)
  tokenizer = None
  if vocabulary is not None:
    tokenizer = _vocabulary(vocabulary, rows, _gin_setting(
        gin_text, "Unitransformer.vocab_divisor", 128))
  keras_model = models.build_model(config)
  model_map.mtf_to_keras(mtf_model=mtf_model, keras_model=keras_model,
                         variables=variables)
  step = int(re.search(r"(\d+)$", checkpoint).group(1))
  run_config = _run_config(
      config, task=task, sequence_length=sequence_length, tokenizer=tokenizer,
      # The layout is what thattn_to_mtf writes back.
      source={"mtf_model_dir": os.path.abspath(mtf_model_dir),
              "checkpoint": checkpoint, "step": step, LAYER_STACK: layout})
  model_dir_lib.write(model_dir, keras_model=keras_model, step=step,
                      tokenizer=tokenizer, run_config=run_config, log=log)
  layers = {"encoder_decoder": f"{config.num_layers}+{config.decoder_layers}",
            "decoder": f"decoder-only {config.decoder_layers}",
            "encoder": f"encoder-only {config.num_layers}"}[config.stacks]
  log(f"Converted {checkpoint} (step {step}) to {model_dir}: T5, "
      f"{layers} layers, d_model {config.d_model}, vocabulary {rows}, "
      f"{layout} LayerStack"
      f"{', tokenizer written' if tokenizer else ', no tokenizer'}.")
  return config


def thattn_to_mtf(*, model_dir, mtf_model_dir, checkpoint=None, log=print):
  """Writes an mtf model_dir (gin + model.ckpt-N) of a thattn T5 model_dir.

  Args:
    model_dir: a thattn model_dir with a T5 backbone.
    mtf_model_dir: the folder to write; must not exist or be empty.
    checkpoint: a checkpoint prefix of model_dir; None for the latest.
    log: where progress lines go.

  Returns:
    The gin config text written.

  Raises:
    ValueError when the run is not a T5, or has something mtf lacks.
  """
  run_config = _thattn_source(model_dir)
  model_dir_lib.check_output(mtf_model_dir, "--mtf_model_dir")
  config = models.model_config(run_config["preset"],
                               **run_config.get("overrides", {}))
  # A converted model goes back in its source's layout (T5 1.0's legacy
  # stack keeps its `layer_norm` names); anything else in mtf's default.
  layer_stack = run_config.get(model_dir_lib.CONVERTED_FROM, {}).get(
      LAYER_STACK, architecture.RMS_NORM)
  gin_text = architecture.gin_text(config, layer_stack=layer_stack)
  checkpoint = checkpoint or run_dir.latest_checkpoint(model_dir)
  keras_model = models.load(model_dir, checkpoint=checkpoint)
  mtf_model = mtf_models.build_model(gin_text=gin_text,
                                     vocab_size=config.vocab_size)
  variables = model_map.keras_to_mtf(mtf_model=mtf_model,
                                     keras_model=keras_model)
  step = checkpoint_reading.step_of(checkpoint)
  with model_dir_lib.staged(mtf_model_dir, "--mtf_model_dir", log) as folder:
    mtf_models.write_model_dir(mtf_model_dir=folder, gin_text=gin_text,
                               variables=variables, step=step)
  log(f"Converted {checkpoint} to {mtf_model_dir}: "
      f"{mtf_models.OPERATIVE_CONFIG} and model.ckpt-{step}.")
  return gin_text
