"""KerasHub BERT and ALBERT presets (what `save_to_preset` writes).

A preset folder holds `config.json` (the backbone's class and arguments),
`model.weights.h5` (Keras 3's weights file), and, where the tokenizer was
saved with it, `tokenizer.json` and `assets/tokenizer/vocabulary.txt`
(BERT) or `vocabulary.spm` (ALBERT).
The weights file is read with h5py, as Keras writes it: one group per
layer under `layers/`, named by the layer's class in snake case, numbered
in the model's layer order (`transformer_encoder`, `transformer_encoder_1`,
...), each variable `vars/<index>` in its creation order. KerasHub is not
needed to read it.

What carries over: the sizes, KerasHub's activation (GELU's tanh form,
`gelu_approximate`), its layer-norm epsilon (1e-12), the pooler, ALBERT's
embedding width, its projection and its one shared layer (an
`AlbertBackbone` with `num_groups` or `num_inner_repetitions` above 1 is
refused by name); the
query's 1/sqrt(d_k), which Keras's MultiHeadAttention applies at run time,
is folded into the query kernel and bias. The tokenizer: BERT's WordPiece
over `vocabulary.txt`, lower-cased and accent-stripped as `tokenizer.json`
says; ALBERT's SentencePiece model, with no normalization of its own
before SentencePiece's (KerasHub lower-cases nothing).
"""

import json
import os
import re

import numpy as np

from thattn import models
from thattn.core import weight_maps
from thattn.data import albert_tokenizer
from thattn.data import tokenizers

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_FILE = "tokenizer.json"
VOCABULARY = os.path.join("assets", "tokenizer", "vocabulary.txt")
SENTENCEPIECE_MODEL = os.path.join("assets", "tokenizer", "vocabulary.spm")
BACKBONES = {"keras_hub>BertBackbone": "bert",
             "keras_hub>AlbertBackbone": "albert"}
# AlbertBackbone arguments that select structures thattn does not build,
# with the one value it reads.
_ALBERT_REFUSED = {"num_groups": 1, "num_inner_repetitions": 1}
# The epsilon KerasHub's BERT gives every layer norm.
LAYER_NORM_EPSILON = 1e-12


def _read_json(path, name):
  file_path = os.path.join(path, name)
  if not os.path.isfile(file_path):
    return {}
  with open(file_path) as f:
    return json.load(f)


def is_source(path):
  """Whether `path` is a KerasHub preset of a backbone thattn reads."""
  try:
    return _read_json(path, CONFIG_FILE).get("registered_name") in BACKBONES
  except (ValueError, OSError):
    return False


def family(path):
  """"bert" or "albert", or ValueError naming the backbone class."""
  name = _read_json(path, CONFIG_FILE).get("registered_name")
  if name not in BACKBONES:
    raise ValueError(
        f"{os.path.join(path, CONFIG_FILE)}: registered_name={name!r}; "
        f"thattn reads {sorted(BACKBONES)} (nothing was written).")
  return BACKBONES[name]


def bert_config(path, attention="multi_head"):
  """thattn's BertConfig of a KerasHub BertBackbone or AlbertBackbone."""
  albert = family(path) == "albert"
  config = _read_json(path, CONFIG_FILE)["config"]
  for name, value in (_ALBERT_REFUSED.items() if albert else ()):
    if config.get(name, value) != value:
      raise ValueError(f"{os.path.join(path, CONFIG_FILE)}: {name}="
                       f"{config[name]!r}; thattn reads {name}={value!r} "
                       "only (nothing was written).")
  width, heads = config["hidden_dim"], config["num_heads"]
  return models.BertConfig(
      vocab_size=config["vocabulary_size"], d_model=width,
      num_layers=config["num_layers"], d_ff=config["intermediate_dim"],
      attention=models.AttentionConfig(variant=attention, num_heads=heads,
                                       key_dim=width // heads),
      embedding_size=weight_maps.albert_embedding_size(
          config["embedding_dim"], width, os.path.join(path, CONFIG_FILE))
      if albert else None,
      share_layers=albert,
      max_position_embeddings=config["max_sequence_length"],
      type_vocab_size=config["num_segments"], activation="gelu_approximate",
      dropout_rate=config.get("dropout", 0.1),
      layer_norm_epsilon=LAYER_NORM_EPSILON)


def read_arrays(path):
  """{h5 dataset path: float32 array} of the preset's weights file."""
  import h5py  # pylint: disable=g-import-not-at-top
  file_path = os.path.join(path, WEIGHTS_FILE)
  if not os.path.isfile(file_path):
    raise ValueError(f"{path} has no {WEIGHTS_FILE}; expected a folder "
                     "that save_to_preset wrote.")
  arrays = {}

  def visit(name, item):
    if isinstance(item, h5py.Dataset):
      arrays[name] = np.asarray(item, np.float32)

  with h5py.File(file_path, "r") as f:
    f.visititems(visit)
  return arrays


def _encoders(arrays):
  """The transformer_encoder groups in layer order (by their number)."""
  names = {match.group(1) for name in arrays
           if (match := re.match(r"layers/(transformer_encoder(_\d+)?)/",
                                 name))}
  return sorted(names, key=lambda name: int(name.rsplit("_", 1)[1])
                if name[-1].isdigit() else 0)


# Keras 3's weights file: a layer's variables as `vars/<i>` in creation
# order, kernel (or a norm's gamma) first.
NAMING = weight_maps.Naming(
    lambda layer, which: f"{layer}/vars/{0 if which in ('kernel', 'gamma') else 1}")  # pylint: disable=line-too-long


def rules(config, arrays):
  """Every Rule of a KerasHub BERT or ALBERT of this thattn config."""
  encoders = _encoders(arrays)
  blocks = 1 if config.share_layers else config.num_layers
  if len(encoders) != blocks:
    raise ValueError(f"The weights hold {len(encoders)} transformer layers; "
                     f"config.json says {blocks}.")
  heads = config.attention.num_heads
  result = [
      weight_maps.Rule("word_embeddings/embeddings",
                       "layers/reversible_embedding/vars/0"),
      weight_maps.Rule("position_embedding/embeddings",
                       "layers/position_embedding/vars/0"),
      weight_maps.Rule("type_embeddings/embeddings",
                       "layers/embedding/vars/0")]
  result += NAMING.norm("embedding_norm", "layers/layer_normalization")
  # Dense layers in the model's order: ALBERT's embedding projection first.
  if config.share_layers:
    result += NAMING.dense("embedding_projection", "layers/dense")
  result += NAMING.dense(
      "pooler/dense", "layers/dense_1" if config.share_layers else
      "layers/dense")
  for index, encoder in enumerate(encoders):
    source = f"layers/{encoder}"
    attention = f"{source}/_self_attention_layer"
    parts = {"query": f"{attention}/query_dense",
             "key": f"{attention}/key_dense",
             "value": f"{attention}/value_dense",
             "attention_output": f"{attention}/output_dense",
             "attention_norm": f"{source}/_self_attention_layer_norm",
             "ff_input": f"{source}/_feedforward_intermediate_dense",
             "ff_output": f"{source}/_feedforward_output_dense",
             "ff_norm": f"{source}/_feedforward_layer_norm"}
    result += NAMING.block(
        "shared_block" if config.share_layers else f"block_{index}", parts,
        heads, config.d_model // heads)
  return result


def tokenizer(path, model_family):
  """The preset's tokenizer, or None where it has none: BERT's WordPiece
  over vocabulary.txt, cased and accent-stripped as tokenizer.json says,
  or ALBERT's SentencePiece model as KerasHub runs it (SentencePiece's
  own normalization only)."""
  if model_family == "albert":
    model_path = os.path.join(path, SENTENCEPIECE_MODEL)
    if not os.path.isfile(model_path):
      return None
    with open(model_path, "rb") as f:
      return albert_tokenizer.AlbertSentencepieceTokenizer(
          f.read(), lower_case=False, strip_accents=False,
          replace_quotes=False)
  vocabulary = os.path.join(path, VOCABULARY)
  if not os.path.isfile(vocabulary):
    return None
  settings = _read_json(path, TOKENIZER_FILE).get("config", {})
  with open(vocabulary, encoding="utf-8") as f:
    vocab = f.read().splitlines()
  return tokenizers.WordpieceTokenizer(
      vocab, lower_case=settings.get("lowercase", False),
      strip_accents=settings.get("strip_accents", False))


def read(path, attention):
  """The preset as a `weight_maps.Source`."""
  config = bert_config(path, attention)
  arrays = read_arrays(path)
  model_family = "albert" if config.share_layers else "bert"
  return weight_maps.Source(
      config=config, arrays=arrays, rules=rules(config, arrays), dropped=(),
      tokenizer=tokenizer(path, model_family), family=model_family)
