"""Model Garden's TF2 BERT encoder checkpoints.

Model Garden releases BERT in TF2 as Google's folders are laid out
(`bert_config.json`, `bert_model.ckpt`, `vocab.txt`), but its checkpoint is
object-based: `tf.train.Checkpoint(encoder=BertEncoder)` saved it, so a
variable is named by its path through the encoder's tracked layers,
`<root>/layer_with_weights-<i>/<attribute>/.ATTRIBUTES/VARIABLE_VALUE`,
in the encoder's layer order: the word, position and type embeddings, the
embedding LayerNorm, one TransformerEncoderBlock per layer
(`_attention_layer/_query_dense`, ..., `_attention_layer_norm`,
`_intermediate_dense`, `_output_dense`, `_output_layer_norm`), then the
pooler. Its attention kernels are already [d, h, d_k] and [h, d_v, d];
Model Garden applies 1/sqrt(d_k) at run time, which is folded into the
query kernel and bias. The root is found from the checkpoint (`encoder`
as Model Garden's converter and releases write it). The configuration and
the tokenizer are read as for Google's original layout
(`thattn.converters.google_bert`: tanh-form gelu, layer norms at 1e-12).
An encoder with an embedding projection (`embedding_width` below the
hidden size) is refused by name.
"""

import re

import numpy as np
import tensorflow as tf

from thattn.converters import google_bert
from thattn.core import weight_maps

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
_FIRST = re.compile(r"(.*?)layer_with_weights-0/embeddings" +
                    re.escape(_VALUE))
DROPPED = (r"_CHECKPOINTABLE_OBJECT_GRAPH", r"save_counter/.*",
           r".*/\.OPTIMIZER_SLOT/.*", r"optimizer/.*")


def _root(names, path):
  """The prefix of the encoder's layers in the checkpoint ("encoder/")."""
  roots = sorted({match.group(1) for name in names
                  if (match := _FIRST.fullmatch(name))})
  encoders = [root for root in roots if root.rstrip("/").endswith("encoder")]
  if len(roots) == 1 or len(encoders) == 1:
    return roots[0] if len(roots) == 1 else encoders[0]
  raise ValueError(f"{path}: found {len(roots)} encoders' layers "
                   f"({roots or 'none'}); expected one BertEncoder.")


def is_source(path):
  """Whether `path` is a Google-style folder with an object-based
  (Model Garden TF2) checkpoint."""
  if not google_bert.is_source(path):
    return False
  names = tf.train.load_checkpoint(google_bert.checkpoint(path)
                                   ).get_variable_to_shape_map()
  return any(_FIRST.fullmatch(name) for name in names)


# An object-based checkpoint's names: `<layer>/<attribute>/.ATTRIBUTES/...`.
NAMING = weight_maps.Naming(lambda layer, which: f"{layer}/{which}{_VALUE}")


def rules(config, root, arrays, path):
  """Every Rule of a Model Garden BertEncoder of this thattn config."""

  def layer(index):
    return f"{root}layer_with_weights-{index}"

  if f"{layer(4)}/kernel{_VALUE}" in arrays:
    raise ValueError(f"{path}: {layer(4)} is an embedding projection "
                     "(embedding_width below hidden_size); thattn reads "
                     "Model Garden's BERT encoder without one.")
  heads = config.attention.num_heads
  result = [weight_maps.Rule(target, f"{layer(index)}/embeddings{_VALUE}")
            for index, target in enumerate((
                "word_embeddings/embeddings", "position_embedding/embeddings",
                "type_embeddings/embeddings"))]
  result += NAMING.norm("embedding_norm", layer(3))
  for index in range(config.num_layers):
    source = layer(4 + index)
    parts = {"query": f"{source}/_attention_layer/_query_dense",
             "key": f"{source}/_attention_layer/_key_dense",
             "value": f"{source}/_attention_layer/_value_dense",
             "attention_output": f"{source}/_attention_layer/_output_dense",
             "attention_norm": f"{source}/_attention_layer_norm",
             "ff_input": f"{source}/_intermediate_dense",
             "ff_output": f"{source}/_output_dense",
             "ff_norm": f"{source}/_output_layer_norm"}
    result += NAMING.block(f"block_{index}", parts, heads,
                           config.d_model // heads)
  return result + NAMING.dense("pooler/dense", layer(4 + config.num_layers))


def read(path, attention):
  config = google_bert.bert_config(path, attention)
  reader = tf.train.load_checkpoint(google_bert.checkpoint(path))
  arrays = {name: np.asarray(reader.get_tensor(name))
            for name in reader.get_variable_to_shape_map()}
  root = _root(arrays, path)
  return weight_maps.Source(
      config=config, arrays=arrays, rules=rules(config, root, arrays, path),
      dropped=DROPPED, tokenizer=google_bert.tokenizer(path), family="bert")
