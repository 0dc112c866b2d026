"""`load(model_dir)`: the trained backbone of a thattn model_dir, in Keras 3.

The Keras 3 counterpart of `thattn.models.load`: the backbone is rebuilt
from the run's `run_config.json` (its preset and overrides) with
`thattn.keras3.models.create_model`, and takes the weights of the run's
latest checkpoint by name (`thattn.core.weight_names.checkpoint_key`, the
names both front ends share):

    model = thattn.keras3.models.load("runs/mlm_bert_tiny")

Which checkpoints need what:

- a `--backend=keras3` run keeps step folders of its values, read as NumPy
  arrays without TensorFlow: on JAX Orbax steps, which Orbax reads (on the
  JAX backend, or on PyTorch with JAX installed beside it: Orbax runs on
  JAX); on TensorFlow and PyTorch one safetensors file, which NumPy and
  safetensors read on any backend;
- a `--backend=keras` run (or a conversion, or a keras3 run of an earlier
  thattn on TensorFlow or PyTorch) keeps `tf.train.Checkpoint`s of
  tf_keras objects, which only
  TensorFlow reads, and only through the objects they were saved from: the
  tf_keras backbone is restored (`thattn.models.load`) and its values move
  over by name. Without TensorFlow installed, the ImportError names the pip
  command.

The head of a fine-tuning task is not part of the backbone, as in
`thattn.models.load`.

A Hugging Face BERT, ALBERT, GPT-2, Llama, GPT-NeoX, DiffLlama or Qwen3-Next
folder (what `save_pretrained` writes: config.json and safetensors) loads
straight, as KerasHub's presets do, read with NumPy and safetensors alone
(`thattn.models.hugging_face_encoders` and `hugging_face_decoders`), so on
JAX or PyTorch with only the `[jax]` or `[torch]` extra installed;
`attention=` (a projected variant) upgrades a multi-head folder at load,
started at the identity, its outputs the source's (a DiffLlama or
Qwen3-Next folder loads as its own variant only). The folder's tokenizer is not read
(`thattn-convert` reads it, with TensorFlow).
"""

from thattn.core import requirements
from thattn.core import variants
from thattn.core import weight_maps
from thattn.core import weight_names
from thattn.io import checkpoint_reading
from thattn.io import run_dir
from thattn.keras3.models import factory
from thattn.models import hugging_face_decoders
from thattn.models import hugging_face_encoders

# The Hugging Face folders `load` reads: BERT and ALBERT; GPT-2, Llama and
# GPT-NeoX.
_HUGGING_FACE_MAPS = (hugging_face_encoders, hugging_face_decoders)


def load(model_dir, *, checkpoint=None, attention=None):
  """The Keras 3 backbone of `model_dir` with its latest checkpoint's
  weights, or the model of a Hugging Face folder.

  Args:
    model_dir: a folder `thattn-train` or `thattn-convert` wrote, or a
      Hugging Face BERT, ALBERT, GPT-2, Llama, GPT-NeoX, DiffLlama or
      Qwen3-Next folder.
    checkpoint: a checkpoint (a step folder or a `tf.train`
      prefix) to read instead of the latest (a thattn model_dir's).
    attention: for a Hugging Face folder, the variant to load it as
      (default: the folder's own; a multi-head folder starts a projected
      one at the identity). A thattn model_dir keeps its run's variant.

  Returns:
    A Keras 3 functional model, the twin of `thattn.models.load`'s: for T5
    presets and decoder-only LMs token ids -> logits, for BERT and ALBERT
    BERT's inputs -> sequence and pooled outputs.

  Raises:
    ValueError as `thattn.models.load` (no run config or checkpoint, a Mesh
    TensorFlow run, a run without a backbone preset), and naming the
    weights the checkpoint has no value for or whose shapes differ; for a
    Hugging Face folder, what thattn cannot represent (by field) or a
    weight the map finds no value for.
    ImportError naming the pip command for a `tf.train` checkpoint where
    TensorFlow is not installed.
  """
  hugging_face = next((module for module in _HUGGING_FACE_MAPS
                       if module.is_source(model_dir)), None)
  if hugging_face is not None:
    if checkpoint is not None:
      raise ValueError(f"{model_dir} is a Hugging Face folder, read whole; "
                       f"checkpoint={checkpoint!r} is for thattn model_dirs.")
    return _from_hugging_face(hugging_face, model_dir, attention)
  if attention is not None:
    raise ValueError(f"attention={attention!r} upgrades a Hugging Face "
                     f"folder as it loads; {model_dir} is a thattn model_dir, "
                     "whose run_config.json fixes its variant.")
  config = run_dir.backbone_run_config(model_dir)
  if checkpoint is None:
    checkpoint = run_dir.latest_checkpoint(model_dir)
  model = factory.create_model(config["preset"], **config.get("overrides", {}))
  if checkpoint_reading.is_step(checkpoint):
    values = checkpoint_reading.read_step(checkpoint)
  else:
    values = tf_train_values(model_dir, checkpoint)
  checkpoint_reading.assign_by_name(
      checkpoint, values, model.weights,
      [weight.path for weight in model.weights],
      f"the {config['preset']} backbone of {model_dir}'s run_config.json")
  return model


def tf_train_values(model_dir, checkpoint):
  """{checkpoint key: NumPy array} of the tf_keras backbone of `model_dir`'s
  run that a `tf.train` checkpoint restores: such a checkpoint names its
  values by the objects that saved them, not by weight name, so it is read
  through them (`thattn.models.load`, with TensorFlow)."""
  requirements.require(f"thattn.keras3.models.load of {checkpoint} (a "
                       "tf.train checkpoint, which only TensorFlow reads)")
  # tf_keras, here only: the rest of this package never imports it.
  from thattn.models import loading  # pylint: disable=g-import-not-at-top
  backbone = loading.load(model_dir, checkpoint=checkpoint)
  return {weight_names.checkpoint_key(weight.name): weight.numpy()
          for weight in backbone.weights}


def _from_hugging_face(hugging_face, path, attention):
  """The Keras 3 model of a Hugging Face folder, its weights mapped by
  the converter's rules (of `hugging_face`, one of _HUGGING_FACE_MAPS)
  onto the Keras 3 paths."""
  held = (hugging_face_decoders.source_attention(path)
          if hugging_face is hugging_face_decoders else "multi_head")
  read = hugging_face.read(path, variants.converted_attention(
      attention, held, where=path))
  model = factory.create_model(read.config)
  names = [weight_names.shared_name(weight.path) for weight in model.weights]
  values = weight_maps.plan_shapes(
      {name: tuple(weight.shape) for name, weight in zip(names,
                                                         model.weights)},
      read.arrays, read.rules, dropped=read.dropped, source=path,
      target_name=weight_names.shared_name)
  for name, weight in zip(names, model.weights):
    weight.assign(values[name])
  return model
