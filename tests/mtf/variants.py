"""The attention variants of the mtf tests and a Keras twin runner.

Each variant is a function `(enc_dec) -> mtf layer`: Mesh TensorFlow's own
layer where mtf has one, thattn's grouped talking heads where it does not.
Sizes are tiny; the head counts differ (h_k != h != h_v) wherever the
variant allows it, so a swapped heads dim cannot pass.
"""

import numpy as np
import tensorflow as tf

from thattn.mtf import layer_weights
from thattn.mtf import layers as mtf_layers

tl = mtf_layers.transformer_layers
WIDTH, BATCH, LENGTH, MEMORY_LENGTH = 8, 2, 5, 6
# |mtf - keras| / max|mtf| (float32); measured values are printed by the
# tests and listed in docs/mtf.md.
TOLERANCE = 1e-5
ALL_DYNAMIC = ["x2l", "m2l", "x2w", "m2w"]


def _th(enc_dec, key, softmax, value, **kwargs):
  cls = (tl.TalkingHeadsEncDecAttention if enc_dec else
         tl.TalkingHeadsSelfAttention)
  if not enc_dec:
    kwargs.setdefault("relative_attention_type", "bias")
  return cls(key_heads_dims=key, softmax_heads_dims=softmax,
             value_heads_dims=value, key_size=4, value_size=3, **kwargs)


def _grouped(enc_dec, **kwargs):
  cls = (mtf_layers.GroupedTalkingHeadsEncDecAttention if enc_dec else
         mtf_layers.GroupedTalkingHeadsSelfAttention)
  return cls(num_heads=2, key_dim=4, value_dim=3, num_key_heads=4,
             num_value_heads=6, num_head_groups=2,
             dynamic_projections=["x2l", "m2w"], **kwargs)


VARIANTS = {
    "multi_head": lambda enc_dec: (
        tl.EncDecAttention(num_heads=2, key_value_size=4) if enc_dec else
        tl.SelfAttention(num_heads=2, key_value_size=4,
                         relative_attention_type="bias")),
    "multi_head_3d": lambda enc_dec: (
        tl.EncDecAttention if enc_dec else tl.SelfAttention)(
            num_heads=3, key_value_size=4, combine_dims=False),
    "talking_heads": lambda enc_dec: _th(
        enc_dec, [("key_heads", 3)], [("heads", 4)], [("value_heads", 5)]),
    "logits_only": lambda enc_dec: _th(
        enc_dec, [("key_heads", 3)], [("heads", 4)], [("heads", 4)]),
    "weights_only": lambda enc_dec: _th(
        enc_dec, [("heads", 4)], [("heads", 4)], [("value_heads", 5)]),
    "dynamic": lambda enc_dec: _th(
        enc_dec, [("key_heads", 3)], [("heads", 4)], [("value_heads", 5)],
        dynamic_projections=ALL_DYNAMIC),
    # mtf's own recipe for model parallelism: a heads dim in all three
    # lists, here not first in the value list, so only names can match it.
    "mtf_shared_heads": lambda enc_dec: _th(
        enc_dec, [("heads", 2), ("key_heads", 2)],
        [("heads", 2), ("softmax_heads", 3)],
        [("value_heads", 2), ("heads", 2)],
        dynamic_projections=["m2l", "x2w"]),
    "general_bilinear": lambda enc_dec: (
        tl.GeneralBilinearEncDecAttention if enc_dec else
        tl.GeneralBilinearSelfAttention)(heads_dims=[("heads", 3)]),
    "grouped": _grouped,
}


def inputs(seed=0):
  """Query, memory, cotangent and segment ids (with padding) as NumPy."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return dict(
      query=normal(BATCH, LENGTH, WIDTH),
      memory=normal(BATCH, MEMORY_LENGTH, WIDTH),
      cotangent=normal(BATCH, LENGTH, WIDTH),
      # 0 is padding: the first example ends in 2 (query) and 2 (memory)
      # padded positions, which see only each other.
      query_segments=np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32),
      memory_segments=np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]],
                               np.int32))


def keras_twin(mtf_layer, *, enc_dec, causal, mtf_variables):
  """thattn's Keras layer (and relative bias) holding the mtf weights."""
  layer = layer_weights.keras_layer(layer=mtf_layer, d_model=WIDTH)
  bias = layer_weights.keras_relative_bias(layer=mtf_layer, d_model=WIDTH,
                                     bidirectional=not causal)
  memory_length = MEMORY_LENGTH if enc_dec else LENGTH
  layer.build_from_shapes([None, None, WIDTH], [None, None, WIDTH])
  layers = [layer]
  if bias is not None:
    bias(LENGTH, memory_length)
    layers.append(bias)
  layer_weights.set_keras_weights(layers=layers, weights=layer_weights.mtf_to_keras(
      layer=mtf_layer, variables=mtf_variables, d_model=WIDTH))
  return layers


def run_keras(layers, data, *, enc_dec, causal):
  """Y and the gradients of sum(Y * cotangent), as mtf's runner returns."""
  layer, bias_layer = layers[0], (layers[1] if len(layers) > 1 else None)
  query = tf.constant(data["query"])
  memory = tf.constant(data["memory"]) if enc_dec else query
  query_ids = data["query_segments"]
  memory_ids = data["memory_segments"] if enc_dec else query_ids
  # mtf's sequence_id rule: a position sees positions with its own id.
  mask = tf.constant(query_ids[:, :, None] == memory_ids[:, None, :])
  weights = [w for l in layers for w in l.trainable_weights]
  with tf.GradientTape() as tape:
    tape.watch([query, memory])
    bias = (None if bias_layer is None else
            bias_layer(query.shape[1], memory.shape[1]))
    y = layer(query, memory, attention_mask=mask, use_causal_mask=causal,
              position_bias=bias)
    loss = tf.reduce_sum(y * data["cotangent"])
  sources = [query] + ([memory] if enc_dec else []) + weights
  grads = tape.gradient(loss, sources)
  input_grads = {"query": grads[0].numpy()}
  if enc_dec:
    input_grads["memory"] = grads[1].numpy()
  weight_grads = {layer_weights.token_of(w.name): tf.convert_to_tensor(g).numpy()
                  for w, g in zip(weights, grads[len(sources) - len(weights):])}
  return y.numpy(), input_grads, weight_grads


def relative_error(got, want):
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
