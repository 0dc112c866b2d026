"""Google's original BERT checkpoints, as google-research/bert released them.

A folder holds `bert_config.json`, a TF1 checkpoint (`bert_model.ckpt`:
its `.index` and `.data-*` files) and `vocab.txt`. The checkpoint is read
with `tf.train.load_checkpoint`, by name: `bert/embeddings/...`,
`bert/encoder/layer_<i>/attention/self/{query,key,value}`,
`.../attention/output/dense`, `.../intermediate/dense`,
`.../output/dense`, their LayerNorms, `bert/pooler/dense`. TensorFlow's
dense kernels are [in, out] already: the query, key and value kernels
split their output into [h, d_k] head-major, the output kernel its input.
The masked-LM and next-sentence heads (`cls/...`), the optimizer's slots
(`adam_m`, `adam_v`) and `global_step` are dropped by name.

What carries over: the sizes; `hidden_act` "gelu", which google-research/
bert computes in GELU's tanh form (as Model Garden's converter of this
layout does), as `gelu_approximate`; layer norms at 1e-12 (that code's
epsilon); the query's 1/sqrt(d_k) folded into its kernel and bias. The
configuration does not say whether the vocabulary is cased, so the
tokenizer lower-cases (and strips accents, BERT's rule) exactly when the
vocabulary holds no upper-case token, as the released uncased and cased
vocabularies differ.
"""

import json
import os

import numpy as np
import tensorflow as tf

from thattn import models
from thattn.core import weight_maps
from thattn.data import tokenizers

CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
CHECKPOINT = "bert_model.ckpt"
# bert_config.json's hidden_act -> thattn's activation (google-research/
# bert's gelu is the tanh form).
ACTIVATIONS = {"gelu": "gelu_approximate", "relu": "relu"}
LAYER_NORM_EPSILON = 1e-12
DROPPED = (r"cls/.*", r"global_step", r".*/adam_[mv]", r".*Adam.*")


def checkpoint(path):
  """The folder's checkpoint prefix: bert_model.ckpt; else the newest that
  a `checkpoint` state file names; else the folder's one `.index` file's
  (ALBERT's releases ship `model.ckpt-best` with no state file); or None."""
  if tf.io.gfile.exists(os.path.join(path, CHECKPOINT + ".index")):
    return os.path.join(path, CHECKPOINT)
  newest = tf.train.latest_checkpoint(path)
  if newest is not None:
    return newest
  indexes = [name for name in sorted(os.listdir(path))
             if name.endswith(".index")] if os.path.isdir(path) else []
  return os.path.join(path, indexes[0][:-len(".index")]) if len(
      indexes) == 1 else None


def is_source(path):
  return (os.path.isfile(os.path.join(path, CONFIG_FILE)) and
          checkpoint(path) is not None)


def encoder_config(source, where, attention="multi_head", albert=False):
  """thattn's BertConfig of Google's config fields (bert_config.json's, or
  albert_config.json's with `albert`), or ValueError naming the field
  thattn cannot represent."""
  activation = source.get("hidden_act")
  if activation not in ACTIVATIONS:
    raise ValueError(f"{where}: hidden_act={activation!r}; thattn reads "
                     f"{sorted(ACTIVATIONS)} (nothing was written).")
  width, heads = source["hidden_size"], source["num_attention_heads"]
  if width % heads:
    raise ValueError(f"{where}: hidden_size={width} is not a multiple of "
                     f"num_attention_heads={heads}.")
  return models.BertConfig(
      vocab_size=source["vocab_size"], d_model=width,
      num_layers=source["num_hidden_layers"],
      d_ff=source["intermediate_size"],
      attention=models.AttentionConfig(variant=attention, num_heads=heads,
                                       key_dim=width // heads),
      embedding_size=weight_maps.albert_embedding_size(
          source["embedding_size"], width, where) if albert else None,
      share_layers=albert,
      max_position_embeddings=source["max_position_embeddings"],
      type_vocab_size=source["type_vocab_size"],
      activation=ACTIVATIONS[activation],
      dropout_rate=source.get("hidden_dropout_prob", 0.1),
      layer_norm_epsilon=LAYER_NORM_EPSILON,
      initializer_range=source.get("initializer_range", 0.02))


def bert_config(path, attention="multi_head"):
  """thattn's BertConfig of the folder's bert_config.json."""
  where = os.path.join(path, CONFIG_FILE)
  with open(where) as f:
    return encoder_config(json.load(f), where, attention)


def read_arrays(path):
  prefix = checkpoint(path)
  if prefix is None:
    raise ValueError(f"{path} holds no TF checkpoint ({CHECKPOINT}.index); "
                     "expected google-research/bert's release layout.")
  reader = tf.train.load_checkpoint(prefix)
  return {name: np.asarray(reader.get_tensor(name))
          for name in reader.get_variable_to_shape_map()}


# TensorFlow's names: `<layer>/kernel` ([in, out]), `<layer>/bias`, a
# LayerNorm's `<layer>/gamma` and `<layer>/beta`.
NAMING = weight_maps.Naming(lambda layer, which: f"{layer}/{which}")


def embedding_rules():
  """The embeddings and their LayerNorm, as BERT and ALBERT both name them."""
  return [
      weight_maps.Rule("word_embeddings/embeddings",
                       "bert/embeddings/word_embeddings"),
      weight_maps.Rule("position_embedding/embeddings",
                       "bert/embeddings/position_embeddings"),
      weight_maps.Rule("type_embeddings/embeddings",
                       "bert/embeddings/token_type_embeddings")
  ] + NAMING.norm("embedding_norm", "bert/embeddings/LayerNorm") + (
      NAMING.dense("pooler/dense", "bert/pooler/dense"))


def rules(config):
  heads = config.attention.num_heads
  result = embedding_rules()
  for index in range(config.num_layers):
    parts = weight_maps.bert_layer_parts(f"bert/encoder/layer_{index}")
    result += NAMING.block(f"block_{index}", parts, heads,
                           config.d_model // heads)
  return result


def tokenizer(path):
  """WordPiece over vocab.txt, lower-cased where the vocabulary has no
  upper-case token; None without a vocab.txt."""
  vocab_path = os.path.join(path, VOCAB_FILE)
  if not os.path.isfile(vocab_path):
    return None
  with open(vocab_path, encoding="utf-8") as f:
    vocab = f.read().splitlines()
  special = set(tokenizers.BERT_SPECIAL_TOKENS)
  cased = any(token != token.lower() for token in vocab
              if token not in special and not token.startswith("[unused"))
  return tokenizers.WordpieceTokenizer(vocab, lower_case=not cased)


def read(path, attention):
  config = bert_config(path, attention)
  return weight_maps.Source(
      config=config, arrays=read_arrays(path), rules=rules(config),
      dropped=DROPPED, tokenizer=tokenizer(path), family="bert")
