"""How far from uniform the trained multi-head attention of mlm runs is.

A diagnostic for the ablation in this folder: it restores masked-LM
model_dirs (as `thattn-export` does), encodes the first 16 held-out documents
of the embedded corpus, and prints, for every attention layer, the mean
entropy of the attention weights W[b, h, n, m] over the valid keys, divided
by ln(number of valid keys). 1.0 means uniform attention: the layer then
returns the mean of the values whatever its heads and d_k are.

Multi-head runs only: talking heads returns the mixed weights U = W x P_w,
which are not distributions.

    python docs/ablation/attention_entropy.py <out_dir>/runs/multi_head_h2_s0 ...
"""

import sys

import numpy as np
import tensorflow as tf

from thattn import export
from thattn.layers import base
from thattn.data import corpus


def _capture_weights(layer, captured):
  """Makes `layer` also store its attention weights in captured[layer]."""
  call = layer.call

  def call_and_capture(*args, **kwargs):
    output, weights = call(*args, **dict(kwargs,
                                         return_attention_scores=True))
    captured[layer] = weights
    return output

  layer.call = call_and_capture


def normalized_entropies(model_dir, texts):
  """Per attention layer: mean entropy / ln(valid keys) over valid queries."""
  module, _, _ = export.build_serving_module(model_dir)
  backbone = module._keras.backbone  # pylint: disable=protected-access
  layers = [layer for layer in backbone._flatten_layers()  # pylint: disable=protected-access
            if isinstance(layer, base.AttentionLayer)]
  captured = {}
  for layer in layers:
    _capture_weights(layer, captured)
  features = module._features(tf.constant(texts))  # pylint: disable=protected-access
  backbone(features, training=False)
  mask = tf.cast(features["input_mask"], tf.float64).numpy()  # [b, n]
  valid_keys = mask.sum(-1)[:, None, None]
  result = []
  for layer in layers:
    weights = captured[layer].numpy().astype(np.float64)  # [b, h, n, m]
    entropy = -(weights * np.log(np.maximum(weights, 1e-30))).sum(-1)
    normalized = entropy / np.log(valid_keys)  # [b, h, n]
    queries = mask[:, None, :] * np.ones_like(normalized)
    result.append(float((normalized * queries).sum() / queries.sum()))
  return result


def main(model_dirs):
  texts = [document[:2000] for document in corpus.documents("heldout")[:16]]
  for model_dir in model_dirs:
    values = ", ".join(f"{v:.3f}" for v in normalized_entropies(model_dir,
                                                                  texts))
    print(f"{model_dir}: entropy / uniform per layer: {values}")


if __name__ == "__main__":
  main(sys.argv[1:])
