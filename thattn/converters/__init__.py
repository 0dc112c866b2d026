"""Checkpoints people already have, as thattn model_dirs (`thattn-convert`).

    from thattn import converters
    converters.convert(source="bert-base-uncased", model_dir="runs/bert",
                       attention="talking_heads")
    model = thattn.models.load("runs/bert")

One module per source format, each a name-and-shape map
(`thattn.core.weight_maps.Rule`s, an encoder layer's from the format's
`weight_maps.Naming`) over one mechanism (`weight_maps.plan`: every weight
filled once, every source array used or dropped by name, every shape
checked, before anything is written) and one writer (`model_dir.write`:
staged, whole or nothing):

- `hugging_face`: a Hugging Face BERT or ALBERT folder (config.json,
  model.safetensors or pytorch_model.bin, the tokenizer files);
- `hugging_face_lm`: a Hugging Face GPT-2, Llama, GPT-NeoX, DiffLlama or
  Qwen3-Next folder (the same files, tokenizer.json read by Hugging Face
  `tokenizers`), a causal-LM backbone;
- `keras_hub`: a KerasHub `BertBackbone` or `AlbertBackbone` preset
  (config.json, model.weights.h5, BERT's tokenizer vocabulary);
- `google_bert`: google-research/bert's release (bert_config.json,
  bert_model.ckpt, vocab.txt);
- `google_albert`: google-research/albert's release (albert_config.json,
  model.ckpt-best);
- `model_garden`: Model Garden's TF2 BERT releases (the same files, the
  checkpoint object-based: a BertEncoder's);
- Mesh TensorFlow model_dirs (T5's released checkpoints) are
  `thattn.mtf.convert`'s, over the same writer; `thattn-convert` finds
  which format a folder holds (`detect`) and dispatches.

A projected variant (`attention="talking_heads"`, "project_logits",
"project_weights", "dynamic") starts from the multi-head source at the
identity: P_l = P_w = I and the dynamic projections at zero, so the
converted model's outputs equal the source's, and fine-tuning trains the
mixes from there. A source of another variant (a DiffLlama folder's
differential attention, a Qwen3-Next folder's gated attention) converts
as itself
(`thattn.core.variants.converted_attention`).
"""

import os

from thattn import models
from thattn.core import variants
from thattn.core import weight_maps
from thattn.io import run_dir
from thattn.models import hugging_face_decoders
from thattn.models import hugging_face_encoders
from thattn.converters import google_albert
from thattn.converters import google_bert
from thattn.converters import hugging_face
from thattn.converters import hugging_face_lm
from thattn.converters import keras_hub
from thattn.converters import model_dir as model_dir_lib
from thattn.converters import model_garden

HUGGING_FACE = "hugging_face"
HUGGING_FACE_LM = "hugging_face_lm"
KERAS_HUB = "keras_hub"
GOOGLE_BERT = "google_bert"
GOOGLE_ALBERT = "google_albert"
MODEL_GARDEN = "model_garden"
MTF = "mtf"
FORMATS = (HUGGING_FACE, HUGGING_FACE_LM, KERAS_HUB, GOOGLE_BERT,
           GOOGLE_ALBERT, MODEL_GARDEN, MTF)
# The format modules (each reads a folder as a weight_maps.Source).
_READERS = {HUGGING_FACE: hugging_face, HUGGING_FACE_LM: hugging_face_lm,
            KERAS_HUB: keras_hub,
            GOOGLE_BERT: google_bert, GOOGLE_ALBERT: google_albert,
            MODEL_GARDEN: model_garden}
# A converted BERT or ALBERT is a masked-LM backbone to fine-tune, a
# decoder-only LM a causal-LM one; its run_config.json names the task and
# the preset whose fields the overrides all set.
_TASKS_AND_PRESETS = {"bert": ("mlm", "bert_base"),
                      "albert": ("mlm", "albert_base"),
                      "gpt2": ("causal_lm", "gpt2"),
                      "llama": ("causal_lm", "llama_3_2_1b"),
                      "gpt_neox": ("causal_lm", "pythia_160m"),
                      "diffllama": ("causal_lm", "llama_3_2_1b"),
                      "qwen3_next": ("causal_lm", "llama_3_2_1b"),
                      "dcpythia": ("causal_lm", "dcpythia_6p9b"),
                      "dcformer": ("causal_lm", "dcformer_2p8b"),
                      "qwen3": ("causal_lm", "llama_3_2_1b")}


def detect(source):
  """The format of the folder `source`, or ValueError saying what each
  format's files are."""
  if not os.path.isdir(source):
    raise ValueError(f"--source={source!r} is not a folder; expected a "
                     "Hugging Face BERT or ALBERT folder or a Mesh "
                     "TensorFlow model_dir.")
  if hugging_face_encoders.is_source(source):
    return HUGGING_FACE
  if hugging_face_decoders.is_source(source):
    return HUGGING_FACE_LM
  if keras_hub.is_source(source):
    return KERAS_HUB
  if model_garden.is_source(source):  # Google's files, a TF2 checkpoint
    return MODEL_GARDEN
  if google_bert.is_source(source):
    return GOOGLE_BERT
  if google_albert.is_source(source):
    return GOOGLE_ALBERT
  if os.path.isfile(os.path.join(source, "operative_config.gin")):
    return MTF
  raise ValueError(
      f"--source={source!r}: no known format found (looked for a Hugging "
      "Face config.json with model_type bert, albert, gpt2, llama, "
      "gpt_neox, diffllama or qwen3_next, a KerasHub "
      "config.json of a BertBackbone, Google's bert_config.json or "
      "albert_config.json beside a checkpoint, and Mesh TensorFlow's "
      "operative_config.gin); name it with --source_format.")


def _held_attention(source, source_format):
  """The attention variant the checkpoint `source` holds: multi-head but
  for the Hugging Face decoders of another variant (DiffLlama's
  differential attention, Qwen3-Next's gated attention)."""
  if source_format == HUGGING_FACE_LM:
    return hugging_face_decoders.source_attention(source)
  return "multi_head"


def convert(*, source, model_dir, attention=None, source_format=None,
            log=print):
  """Writes the thattn model_dir of a BERT, ALBERT or decoder-only LM
  checkpoint folder.

  Args:
    source: the folder to read.
    model_dir: the thattn model_dir to write; must not exist or be empty.
    attention: the thattn variant to convert into; None: the one the
      source holds. A multi-head source starts the projected ones at the
      identity (the module says why); another variant's source converts
      only as itself.
    source_format: one of FORMATS but MTF (which `thattn.mtf.convert`
      converts); None finds it from the files.
    log: where progress lines go.

  Returns:
    The thattn BertConfig or DecoderConfig.

  Raises:
    ValueError naming the file, field or weight that cannot be converted;
    nothing is written then.
  """
  model_dir_lib.check_output(model_dir, "--model_dir")
  source_format = source_format or detect(source)
  if source_format not in _READERS:
    raise ValueError(f"--source_format={source_format!r}: this converts "
                     f"{sorted(_READERS)}; Mesh TensorFlow model_dirs are "
                     "thattn.mtf.convert.mtf_to_thattn's.")
  attention = variants.converted_attention(
      attention, _held_attention(source, source_format), where=source)
  read = _READERS[source_format].read(source, attention)
  config, tokenizer = read.config, read.tokenizer
  model = models.build_model(config)
  weight_maps.assign(model, weight_maps.plan(
      model, read.arrays, read.rules, dropped=read.dropped, source=source))
  task, preset = _TASKS_AND_PRESETS[read.family]
  run_config = {
      "task": task, "preset": preset,
      "overrides": model_dir_lib.overrides(config),
      "sequence_length": config.max_position_embeddings,
      "tokenizer_dir": run_dir.TOKENIZER if tokenizer else None,
      model_dir_lib.CONVERTED_FROM: {
          "source": os.path.abspath(source), "format": source_format,
          "model_type": read.family, "attention": attention}}
  if task == "causal_lm":  # what its serving ends and pads continuations with
    run_config.update(eos_id=tokenizer.special.eos if tokenizer else None,
                      pad_id=tokenizer.special.pad if tokenizer else None)
  model_dir_lib.write(model_dir, keras_model=model, step=0,
                      tokenizer=tokenizer, run_config=run_config, log=log)
  log(f"Converted {source} ({source_format}, {read.family}: "
      f"{config.num_layers} layers, d_model {config.d_model}, "
      f"{config.attention.num_heads} heads, vocabulary {config.vocab_size}) "
      f"to {model_dir} with {attention} attention"
      f"{', tokenizer written' if tokenizer else ', no tokenizer'}.")
  return config
