"""Google's original ALBERT checkpoints, as google-research/albert released.

A folder holds `albert_config.json`, a TF1 checkpoint (`model.ckpt-best`
or another `model.ckpt-N`) and the SentencePiece model `30k-clean.model`.
The checkpoint is read by name, as for BERT (`thattn.converters.
google_bert`), with ALBERT's names: the embeddings of width E, their
projection `bert/encoder/embedding_hidden_mapping_in`, and the one shared
layer under `bert/encoder/transformer/group_0/inner_group_0/`
(`attention_1/self`, `attention_1/output/dense`, `LayerNorm` after the
attention, `ffn_1/intermediate/dense` and `.../output/dense`,
`LayerNorm_1` after the feed-forward network).

What carries over: the sizes, E, the shared layer, `hidden_act` "gelu" in
google-research/albert's tanh form, layer norms at 1e-12. Refused by name:
`num_hidden_groups` or `inner_group_num` above 1 and `net_structure_type`
other than 0 (structures thattn does not build). The tokenizer:
`30k-clean.model` with google-research/albert's `FullTokenizer` around
it (`` and '' as ", accents stripped, lower-cased as its run scripts'
`do_lower_case` default, and the split of pieces ending in a digit and a
comma); the model_dir has none where the folder has no `*.model`.
"""

import glob
import json
import os

from thattn.converters import google_bert
from thattn.core import weight_maps
from thattn.data import albert_tokenizer

CONFIG_FILE = "albert_config.json"
SENTENCEPIECE_MODEL = "30k-clean.model"
_LAYER = "bert/encoder/transformer/group_0/inner_group_0"
# albert_config.json fields that select structures thattn does not build,
# with the one value it reads.
_REFUSED = {"num_hidden_groups": 1, "inner_group_num": 1,
            "net_structure_type": 0}


def is_source(path):
  return (os.path.isfile(os.path.join(path, CONFIG_FILE)) and
          google_bert.checkpoint(path) is not None)


def albert_config(path, attention="multi_head"):
  where = os.path.join(path, CONFIG_FILE)
  with open(where) as f:
    source = json.load(f)
  for name, value in _REFUSED.items():
    if source.get(name, value) != value:
      raise ValueError(f"{where}: {name}={source[name]!r}; thattn reads "
                       f"{name}={value!r} only (nothing was written).")
  return google_bert.encoder_config(source, where, attention, albert=True)


def rules(config):
  heads = config.attention.num_heads
  parts = {"query": f"{_LAYER}/attention_1/self/query",
           "key": f"{_LAYER}/attention_1/self/key",
           "value": f"{_LAYER}/attention_1/self/value",
           "attention_output": f"{_LAYER}/attention_1/output/dense",
           "attention_norm": f"{_LAYER}/LayerNorm",
           "ff_input": f"{_LAYER}/ffn_1/intermediate/dense",
           "ff_output": f"{_LAYER}/ffn_1/intermediate/output/dense",
           "ff_norm": f"{_LAYER}/LayerNorm_1"}
  return google_bert.embedding_rules() + google_bert.NAMING.dense(
      "embedding_projection", "bert/encoder/embedding_hidden_mapping_in"
  ) + google_bert.NAMING.block("shared_block", parts, heads,
                               config.d_model // heads)


def tokenizer(path):
  """google-research/albert's tokenizer over the folder's SentencePiece
  model (30k-clean.model, else the one *.model), or None."""
  model_path = os.path.join(path, SENTENCEPIECE_MODEL)
  if not os.path.isfile(model_path):
    found = glob.glob(os.path.join(path, "*.model"))
    if len(found) != 1:
      return None
    model_path = found[0]
  with open(model_path, "rb") as f:
    return albert_tokenizer.AlbertSentencepieceTokenizer(
        f.read(), lower_case=True, strip_accents=True, replace_quotes=True,
        split_digit_comma=True)


def read(path, attention):
  config = albert_config(path, attention)
  return weight_maps.Source(
      config=config, arrays=google_bert.read_arrays(path),
      rules=rules(config), dropped=google_bert.DROPPED,
      tokenizer=tokenizer(path),
      family="albert")
