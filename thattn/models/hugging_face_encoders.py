"""Hugging Face BERT and ALBERT folders (what `save_pretrained` writes) as
thattn models: config.json as a `BertConfig`, and the rules that map the
folder's weights (read by `thattn.io.hugging_face_files`) onto thattn's.
Plain Python (NumPy and safetensors), so that `thattn.keras3.models.load`
reads such a folder without TensorFlow, as `thattn-convert`
(`thattn.converters.hugging_face`, which adds the folder's tokenizer)
does.

What carries over, field by field (thattn's `BertConfig`): the sizes, the
activation (`gelu` is GELU's exact form, `gelu_new` and
`gelu_pytorch_tanh` its tanh form), `layer_norm_eps`, ALBERT's
`embedding_size` and its one shared layer. The weights map without
loss: a PyTorch Linear's [out, in] weight is the kernel transposed, the
query, key and value kernels split their output into [h, d_k] head-major
(as BERT's attention does), and 1/sqrt(d_k), which BERT applies to the
logits at run time, is folded into the query kernel and bias, as thattn
never scales at run time. A source thattn cannot represent is refused
with a ValueError naming the field: another `position_embedding_type`
than "absolute", ALBERT's `num_hidden_groups` or `inner_group_num` above
1, an activation it lacks, a model saved without its pooler.
"""

import os

from thattn.core import weight_maps
from thattn.io import hugging_face_files
from thattn.models import config as config_lib

MODEL_TYPES = ("bert", "albert")
# config.json's hidden_act -> thattn's BertConfig.activation.
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_approximate",
               "gelu_pytorch_tanh": "gelu_approximate",
               "gelu_fast": "gelu_approximate", "relu": "relu"}
# What a task model saves beside the encoder (the masked-LM and
# next-sentence / sentence-order heads, a classifier, a span head), and
# buffers that are not weights: none is part of thattn's backbone.
DROPPED = (r"cls\..*", r"predictions\..*", r"sop_classifier\..*",
           r"classifier\..*", r"qa_outputs\..*", r".*\.position_ids",
           r".*\.token_type_ids")


def is_source(path):
  """Whether `path` is a Hugging Face BERT or ALBERT folder."""
  return hugging_face_files.model_type(path) in MODEL_TYPES


def _field(hf_config, name, path):
  if name not in hf_config:
    where = os.path.join(path, hugging_face_files.CONFIG_FILE)
    raise ValueError(f"{where} has no {name!r}; expected a BERT or ALBERT "
                     "config.json.")
  return hf_config[name]


def bert_config(hf_config, path, attention="multi_head"):
  """thattn's BertConfig for a config.json, or ValueError naming the field
  thattn cannot represent."""
  where = os.path.join(path, hugging_face_files.CONFIG_FILE)
  model_type = _field(hf_config, "model_type", path)
  checks = {"position_embedding_type": ("absolute",)}
  if model_type == "albert":
    checks.update(num_hidden_groups=(1,), inner_group_num=(1,))
  for name, allowed in checks.items():
    value = hf_config.get(name, allowed[0])
    if value not in allowed:
      raise ValueError(f"{where}: {name}={value!r}; thattn represents only "
                       f"{name}={allowed[0]!r} (nothing was written).")
  activation = _field(hf_config, "hidden_act", path)
  if activation not in ACTIVATIONS:
    raise ValueError(f"{where}: hidden_act={activation!r}; thattn has "
                     f"{sorted(ACTIVATIONS)} (nothing was written).")
  width = _field(hf_config, "hidden_size", path)
  heads = _field(hf_config, "num_attention_heads", path)
  if width % heads:
    raise ValueError(f"{where}: hidden_size={width} is not a multiple of "
                     f"num_attention_heads={heads}.")
  return config_lib.BertConfig(
      vocab_size=_field(hf_config, "vocab_size", path), d_model=width,
      num_layers=_field(hf_config, "num_hidden_layers", path),
      d_ff=_field(hf_config, "intermediate_size", path),
      attention=config_lib.AttentionConfig(variant=attention, num_heads=heads,
                                       key_dim=width // heads),
      embedding_size=(weight_maps.albert_embedding_size(
          _field(hf_config, "embedding_size", path), width, where)
                      if model_type == "albert" else None),
      share_layers=model_type == "albert",
      max_position_embeddings=_field(hf_config, "max_position_embeddings",
                                     path),
      type_vocab_size=_field(hf_config, "type_vocab_size", path),
      activation=ACTIVATIONS[activation],
      dropout_rate=hf_config.get("hidden_dropout_prob", 0.1),
      layer_norm_epsilon=hf_config.get("layer_norm_eps", 1e-12),
      initializer_range=hf_config.get("initializer_range", 0.02))


def read_arrays(path):
  """{name: float32 array} of the folder's weights, without the model
  type's prefix (`bert.`, `albert.`), which task models add."""
  return hugging_face_files.read_arrays(
      path, tuple(f"{model_type}." for model_type in MODEL_TYPES))


# PyTorch's names: `<layer>.weight` ([out, in] for a Linear; a LayerNorm's
# scale) and `<layer>.bias`.
NAMING = weight_maps.Naming(
    lambda layer, which: f"{layer}.{'bias' if which in ('bias', 'beta') else 'weight'}",  # pylint: disable=line-too-long
    transposed=True)


def rules(config, model_type):
  """Every Rule of a BERT or ALBERT of this thattn config."""
  heads = config.attention.num_heads
  key_dim = config.d_model // heads
  result = [
      weight_maps.Rule("word_embeddings/embeddings",
                       "embeddings.word_embeddings.weight"),
      weight_maps.Rule("position_embedding/embeddings",
                       "embeddings.position_embeddings.weight"),
      weight_maps.Rule("type_embeddings/embeddings",
                       "embeddings.token_type_embeddings.weight")]
  result += NAMING.norm("embedding_norm", "embeddings.LayerNorm")
  result += NAMING.dense("pooler/dense", "pooler.dense" if model_type == "bert"
                         else "pooler")
  if model_type == "albert":
    result += NAMING.dense("embedding_projection",
                           "encoder.embedding_hidden_mapping_in")
    layer = "encoder.albert_layer_groups.0.albert_layers.0"
    parts = {"query": f"{layer}.attention.query",
             "key": f"{layer}.attention.key",
             "value": f"{layer}.attention.value",
             "attention_output": f"{layer}.attention.dense",
             "attention_norm": f"{layer}.attention.LayerNorm",
             "ff_input": f"{layer}.ffn", "ff_output": f"{layer}.ffn_output",
             "ff_norm": f"{layer}.full_layer_layer_norm"}
    return result + NAMING.block("shared_block", parts, heads, key_dim)
  for index in range(config.num_layers):
    parts = weight_maps.bert_layer_parts(f"encoder.layer.{index}", ".")
    result += NAMING.block(f"block_{index}", parts, heads, key_dim)
  return result


def read(path, attention):
  """The folder as a `weight_maps.Source`, without its tokenizer
  (`thattn.converters.hugging_face` reads it)."""
  hf_config = hugging_face_files.read_config(path)
  config = bert_config(hf_config, path, attention)
  family = hf_config["model_type"]
  return weight_maps.Source(
      config=config, arrays=read_arrays(path), rules=rules(config, family),
      dropped=DROPPED, tokenizer=None, family=family)
