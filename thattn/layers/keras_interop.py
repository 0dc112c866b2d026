"""Weights between thattn's layers and tf_keras / Model Garden attention.

`from_keras(layer)` builds thattn's layer, with equal outputs, from a built
`tf_keras.layers.MultiHeadAttention` or Model Garden's
`official.nlp.modeling.layers.TalkingHeadsAttention` (a subclass of it);
`to_keras(layer)` goes back where the layer is representable there.

The weights map one to one (no transposes), named by their last components::

| tf_keras / Model Garden        | thattn                    | paper |
|--------------------------------|---------------------------|-------|
| query/kernel [d_X, h, d_k]     | query/kernel              | P_q   |
| query/bias [h, d_k]            | query/bias                |       |
| key/kernel, key/bias           | key/kernel, key/bias      | P_k   |
| value/kernel, value/bias       | value/kernel, value/bias  | P_v   |
| attention_output/kernel, bias  | output/kernel, bias       | P_o   |
| pre_softmax_weight [h, h]      | pre_softmax_projection    | P_l   |
| post_softmax_weight [h, h]     | post_softmax_projection   | P_w   |

with one difference: tf_keras and Model Garden multiply the logits by
1/sqrt(d_k) at run time, and thattn never does (the factor is folded into
P_q, as in the paper, Mesh TensorFlow and T5). Since the logits are linear
in Q, scaling Q's kernel and bias by 1/sqrt(d_k) gives the same logits::

    J[h, n, m] / sqrt(d_k) = einsum((X P_q + b_q) / sqrt(d_k), K)

Model Garden scales J before P_l, which is the same since P_l is linear.
Biases are kept (`use_bias` follows the source). Model Garden's layer is not
a dependency of thattn; `to_keras` imports it only for talking heads.
"""

import tensorflow as tf
import tf_keras

from thattn.core import attention_spec
from thattn.layers import multi_head
from thattn.layers import talking_heads

# tf_keras name path -> thattn name path, as trailing name components.
_KERAS_TO_THATTN = {
    ("query", "kernel"): ("query", "kernel"),
    ("query", "bias"): ("query", "bias"),
    ("key", "kernel"): ("key", "kernel"),
    ("key", "bias"): ("key", "bias"),
    ("value", "kernel"): ("value", "kernel"),
    ("value", "bias"): ("value", "bias"),
    ("attention_output", "kernel"): ("output", "kernel"),
    ("attention_output", "bias"): ("output", "bias"),
    ("pre_softmax_weight",): ("pre_softmax_projection",),
    ("post_softmax_weight",): ("post_softmax_projection",),
}
# Q's weights carry the 1/sqrt(d_k) that thattn does not apply at run time.
_QUERY_WEIGHTS = (("query", "kernel"), ("query", "bias"))
# The tf_keras arguments that carry over unchanged, by the same name.
_SHARED_ARGUMENTS = ("num_heads", "key_dim", "value_dim", "dropout",
                     "use_bias", "kernel_initializer", "bias_initializer",
                     "kernel_regularizer", "bias_regularizer",
                     "activity_regularizer", "kernel_constraint",
                     "bias_constraint")


def _weights_by_path(layer):
  """{trailing name components: variable} for the paths in the table."""
  known = set(_KERAS_TO_THATTN) | set(_KERAS_TO_THATTN.values())
  found = {}
  for variable in layer.weights:
    parts = tuple(variable.name.split(":")[0].split("/"))
    for length in (2, 1):
      if parts[-length:] in known:
        found[parts[-length:]] = variable
        break
  return found


def from_keras(layer, **kwargs):
  """thattn's equal of a built tf_keras MultiHeadAttention (or Model Garden's
  TalkingHeadsAttention), with its weights.

  Args:
    layer: a built `tf_keras.layers.MultiHeadAttention`, or Model Garden's
      `TalkingHeadsAttention`, on [batch, length, width] inputs.
    **kwargs: more arguments for thattn's layer (e.g. `name`,
      `query_chunk_size`, `fused_kernel`); by default the source's name.

  Returns:
    A built `thattn.layers.MultiHeadAttention`, or `TalkingHeadsAttention`
    (h_k = h = h_v) for Model Garden's, whose outputs and attention scores
    equal the source's for the same inputs and masks.
  """
  config = _checked_source_config(layer)
  source = _weights_by_path(layer)
  talking = ("pre_softmax_weight",) in source
  arguments = {name: config[name] for name in _SHARED_ARGUMENTS}
  arguments.update(output_shape=config["output_shape"], name=config["name"],
                   dtype=layer.dtype_policy)
  if talking:
    # Model Garden initializes P_l and P_w with the kernel initializer.
    arguments["talking_heads_initializer"] = config["kernel_initializer"]
  arguments.update(kwargs)
  target_class = (talking_heads.TalkingHeadsAttention if talking else
                  multi_head.MultiHeadAttention)
  target = target_class(**arguments)
  target.build_from_shapes(config["query_shape"], config["value_shape"],
                           config["key_shape"])
  scale = config["key_dim"] ** -0.5
  destination = _weights_by_path(target)
  for path, variable in source.items():
    value = variable * scale if path in _QUERY_WEIGHTS else variable
    destination[_KERAS_TO_THATTN[path]].assign(
        tf.cast(value, destination[_KERAS_TO_THATTN[path]].dtype))
  return target


def _checked_source_config(layer):
  """The source layer's config, after refusing what thattn cannot express."""
  if not isinstance(layer, tf_keras.layers.MultiHeadAttention):
    raise ValueError(
        f"from_keras takes a tf_keras.layers.MultiHeadAttention or Model "
        f"Garden's TalkingHeadsAttention, got {type(layer).__name__}.")
  config = layer.get_config()
  if not layer.weights or config.get("query_shape") is None:
    raise ValueError(f"{layer.name}: build the layer (call it once) before "
                     "from_keras, so that its weights exist.")
  attention_spec.check_attention_axes(
      layer.name, None if tf.TensorShape(config["query_shape"]).rank == 3 and
      tuple(config["attention_axes"]) == (1,) else config["attention_axes"])
  for name in ("query_shape", "value_shape", "key_shape"):
    if tf.TensorShape(config[name]).rank != 3:
      raise ValueError(f"{layer.name}: {name}={config[name]}; thattn's "
                       "layers take [batch, length, width] inputs only.")
  if config.get("softmax_robust_masking"):
    raise ValueError(
        f"{layer.name}: softmax_robust_masking=True has no counterpart in "
        "thattn (its masked softmax is always float32 with -1e9 logits).")
  attention_spec.output_width(layer.name, config["output_shape"])
  names = {path[0] for path in _weights_by_path(layer)}
  if len(names & {"pre_softmax_weight", "post_softmax_weight"}) == 1:
    raise ValueError(f"{layer.name}: has only one of pre_softmax_weight and "
                     "post_softmax_weight; expected both or neither.")
  return config


def to_keras(layer, **kwargs):
  """The tf_keras (or Model Garden) layer equal to a built thattn layer.

  MultiHeadAttention, and TalkingHeadsAttention without P_l, P_w and
  dynamic projections, become `tf_keras.layers.MultiHeadAttention`. Other
  talking heads with h_k = h = h_v and no dynamic projections become Model
  Garden's `TalkingHeadsAttention` (needs tf-models-official installed); a
  missing P_l or P_w becomes the identity, head groups their dense
  block-diagonal matrices. Anything else raises ValueError naming what
  tf_keras cannot express. `**kwargs` go to the new layer's constructor.
  """
  shapes = layer.build_shapes if hasattr(layer, "build_shapes") else None
  if not isinstance(layer, (multi_head.MultiHeadAttention,
                            talking_heads.TalkingHeadsAttention)):
    raise ValueError(
        f"to_keras takes thattn's MultiHeadAttention or "
        f"TalkingHeadsAttention, got {type(layer).__name__}; tf_keras has no "
        "general bilinear attention.")
  if shapes is None:
    raise ValueError(f"{layer.name}: build the layer (call it once) before "
                     "to_keras, so that its weights exist.")
  if layer.num_key_value_heads is not None:
    raise ValueError(
        f"{layer.name}: num_key_value_heads={layer.num_key_value_heads} "
        "shares key and value heads, which neither tf_keras's "
        "MultiHeadAttention nor Model Garden's TalkingHeadsAttention has.")
  if layer.rotary_base is not None:
    raise ValueError(
        f"{layer.name}: rotary_base={layer.rotary_base} turns queries and "
        "keys by position, which neither tf_keras's MultiHeadAttention nor "
        "Model Garden's TalkingHeadsAttention does.")
  if layer.use_gate:
    raise ValueError(
        f"{layer.name}: use_gate=True gates the heads' outputs, which neither "
        "tf_keras's MultiHeadAttention nor Model Garden's "
        "TalkingHeadsAttention does.")
  if layer.sliding_window is not None:
    raise ValueError(
        f"{layer.name}: sliding_window={layer.sliding_window} limits each "
        "query to nearby keys, which neither tf_keras's MultiHeadAttention "
        "nor Model Garden's TalkingHeadsAttention does.")
  target_class, mixing = _keras_counterpart(layer)
  config = layer.get_config()
  arguments = {name: config[name] for name in _SHARED_ARGUMENTS}
  arguments.update(output_shape=layer.output_dim, name=layer.name,
                   dtype=layer.dtype_policy)
  arguments.update(kwargs)
  target = target_class(**arguments)
  # Keras builds its layer from the first call's shapes; any batch and
  # length will do, the weights depend on the widths only.
  target(*(tf.zeros([d or 1 for d in shapes[name]], target.compute_dtype)
           for name in ("query_shape", "value_shape", "key_shape")))
  source = _weights_by_path(layer)
  source.update(mixing)
  scale = layer.key_dim ** 0.5
  for path, variable in _weights_by_path(target).items():
    value = source[_KERAS_TO_THATTN[path]]
    value = value * scale if path in _QUERY_WEIGHTS else value
    variable.assign(tf.cast(value, variable.dtype))
  return target


def _keras_counterpart(layer):
  """(the tf_keras / Model Garden class for `layer`, {path: P_l, P_w})."""
  if isinstance(layer, multi_head.MultiHeadAttention) or not (
      layer.project_logits or layer.project_weights or
      layer.dynamic_projections):
    return tf_keras.layers.MultiHeadAttention, {}
  heads = {"num_key_heads": layer.num_key_heads, "num_heads": layer.num_heads,
           "num_value_heads": layer.num_value_heads}
  if len(set(heads.values())) != 1 or layer.dynamic_projections:
    raise ValueError(
        f"{layer.name}: Model Garden's TalkingHeadsAttention has one number "
        "of heads and no dynamic projections; this layer has "
        + ", ".join(f"{name}={value}" for name, value in heads.items())
        + f", dynamic_projections={list(layer.dynamic_projections)}.")
  try:
    from official.nlp.modeling import layers as model_garden  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ValueError(
        f"{layer.name}: talking heads convert to Model Garden's "
        "TalkingHeadsAttention, which needs tf-models-official "
        "(pip install --no-deps tf-models-official gin-config)") from error
  return model_garden.TalkingHeadsAttention, {
      ("pre_softmax_projection",): _dense_mixing(layer, "pre_softmax"),
      ("post_softmax_projection",): _dense_mixing(layer, "post_softmax")}


def _dense_mixing(layer, which):
  """P_l or P_w as a dense [h, h] matrix: identity when the layer has none,
  the block-diagonal matrix of its G blocks [G, h/G, h/G] when grouped."""
  weights = _weights_by_path(layer)
  variable = weights.get((f"{which}_projection",))
  if variable is None:
    return tf.eye(layer.num_heads, dtype=layer.dtype)
  if variable.shape.rank == 2:
    return tf.convert_to_tensor(variable)
  blocks = [tf.linalg.LinearOperatorFullMatrix(block)
            for block in tf.unstack(variable)]
  return tf.linalg.LinearOperatorBlockDiag(blocks).to_dense()
