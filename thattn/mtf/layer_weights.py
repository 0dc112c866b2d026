"""Weights of one attention layer: Mesh TensorFlow <-> thattn's Keras layers.

    mtf_layer = transformer_layers.TalkingHeadsSelfAttention(
        key_heads_dims=[("key_heads", 3)], softmax_heads_dims=[("heads", 4)],
        value_heads_dims=[("value_heads", 5)], key_size=8, value_size=8)
    keras = layer_weights.keras_layer(layer=mtf_layer, d_model=16)
    weights = layer_weights.mtf_to_keras(
        layer=mtf_layer, variables=values, d_model=16)  # {"query/kernel": ...}
    keras(x, x)  # build
    layer_weights.set_keras_weights(layers=[keras], weights=weights)
    back = layer_weights.keras_to_mtf(
        layer=mtf_layer, d_model=16,
        weights=layer_weights.keras_weights(layers=[keras]))

`variables` maps mtf variable names relative to the layer's scope (as in
a checkpoint under `.../TalkingHeadsSelfAttention/`) to arrays. Weights are
keyed by thattn's tokens (docs/architecture.md, "Weights"):

| mtf layer | mtf variable | thattn token | how |
|---|---|---|---|
| SelfAttention, EncDecAttention | `q`, `k`, `v` `[d_model, heads*d_kv]` | `query/kernel`, `key/kernel`, `value/kernel` `[d_model, h, d_k]` | heads-major reshape (`combine_dims=True`, mtf's default; `False` stores `[d_model, heads, d_kv]`) |
| | `o` `[heads*d_kv, d_model]` | `output/kernel` `[h, d_v, d_model]` | reshape |
| TalkingHeads*Attention | `q/kernel`, `k/kernel` `[d_model, key_heads..., d_k]` | `query/kernel`, `key/kernel` | by dim name |
| | `v/kernel`, `y/kernel` | `value/kernel`, `output/kernel` | by dim name |
| | `logits/kernel` `[shared, key_heads, heads]` | `pre_softmax_projection` P_l | by dim name |
| | `weights/kernel` | `post_softmax_projection` P_w | by dim name |
| | `logits/logits_dynamic_{i}/kernel` | `x2l/kernel`, `m2l/kernel` | i counts enabled ones, x2l first |
| | `weights/weights_dynamic_{i}/kernel` | `x2w/kernel`, `m2w/kernel` | likewise |
| GeneralBilinear*Attention | `q/kernel` `[_d_model, heads, d_model]` | `bilinear_p` `[d_X, d_M, h]` | transpose (0, 2, 1) |
| | `y/kernel` `[heads, _d_model, d_model]` | `bilinear_q` `[d_M, d_Y, h]` | transpose (1, 2, 0) |
| any self-attention | `relative_attention_bias` `[heads..., buckets]` | `relative_attention_bias` `[buckets, h]` of `RelativePositionBias` | transpose |

Heads dims are matched by *name*: a heads dim present in all three
talking-heads lists is a head group (thattn's `num_head_groups`, heads
group-major), and each list's order in mtf may differ from Keras's. The
mapping is reshapes and transposes only, so a round trip is bit-exact
(except with `fold_scaling_into_initializer=False`, below).

Conventions that differ between the two backends:

| | Mesh TensorFlow | thattn Keras | conversion |
|---|---|---|---|
| 1/sqrt(d_k) | in P_q's initializer (std `(d_model*d_k)**-0.5`); `fold_scaling_into_initializer=False` scales Q at run time; `unit_scaling_convention` scales every einsum | in P_q's initializer only, never at run time | run-time Q scale folded into `query/kernel` (one float rounding each way); `unit_scaling_convention=True` refused |
| initializers | TF1 truncated normals, std = pre-truncation sigma (realized std about 0.88x) | VarianceScaling / normals | none: weights are copied, not re-initialized |
| logits dtype | `SelfAttention`: float32; talking heads and general bilinear: the activation dtype | softmax always in float32 | equal in float32 |
| masks | -1e9 *added* to the logits (segment ids, causal priorities) | `where(mask, L, -1e9)` after P_l | equal unless a row is fully masked (mtf: softmax of the unmasked logits; thattn: uniform) |
| dropout | one mask shared by all query positions (noise shape drops `length`) | elementwise on U | not convertible; equal outputs need dropout off |
| biases | none | `use_bias=False` | refused if present on the Keras side |
| P_l / P_w | created only when the two head lists' *names* differ; then `dynamic_projections` silently ignored when they match | `project_logits` / `project_weights`; dynamic terms need them | such mtf configs refused |
| enc-dec widths | memory width must equal d_model | any width | the Keras layer is built for d_model |

Not converted (ValueError): `num_memory_heads` (multi-query), `shared_kv`,
`keep_query_heads_dims`, `attention_func`, `attention_kwargs`, hyperprompts,
`relative_attention_type="contextual"`, relative bias on enc-dec attention
(mtf's span positions), other mtf layers. `z_loss_coeff` only adds an
auxiliary training loss and does not change the layer's output.
"""

import numpy as np

from thattn import layers as keras_layers
from thattn.mtf import weight_maps


def _keras_dims(weight):
  return "[" + ", ".join("*".join(axis) or "1" for axis in weight.keras_axes
                         ) + "]"


def _mtf_dims(weight):
  return "[" + ", ".join("*".join(axis) for axis in weight.mtf_axes) + "]"


def _rearrange(array, source, target, sizes):
  """Reshapes `source` axes into atoms, transposes to `target`, reshapes."""
  atoms = [a for axis in source for a in axis]
  array = np.reshape(array, [sizes[a] for a in atoms])
  wanted = [a for axis in target for a in axis]
  for i in reversed(range(len(atoms))):  # atoms the target lacks: size 1
    if atoms[i] not in wanted:
      array = np.squeeze(array, i)
      del atoms[i]
  for a in wanted:  # atoms the source lacks: size 1
    if a not in atoms:
      array = np.expand_dims(array, -1)
      atoms.append(a)
  array = np.transpose(array, [atoms.index(a) for a in wanted])
  return np.reshape(array, [int(np.prod([sizes[a] for a in axis]))
                            for axis in target])


def _checked(values, expected, what, description):
  """Refuses missing, unknown and misshapen entries of `values`."""
  missing = [name for name in expected if name not in values]
  if missing:
    raise ValueError(f"{description}: {what} {missing[0]!r} is missing; "
                     f"expected {', '.join(expected)}.")
  unknown = [name for name in values if name not in expected]
  if unknown:
    raise ValueError(f"{description}: unknown {what} {unknown[0]!r}; "
                     f"expected {', '.join(expected)}.")
  for name, (shape, dims) in expected.items():
    got = tuple(np.shape(values[name]))
    if got != shape:
      raise ValueError(f"{description}: {what} {name!r} has shape {got}, "
                       f"expected {shape} {dims}.")


def mtf_variable_shapes(*, layer, d_model):
  """{mtf variable name: shape} that `layer` creates for width d_model."""
  spec = weight_maps.layer_map(layer, d_model=d_model)
  return {w.mtf_name: spec.shape(w.mtf_axes) for w in spec.weights}


def mtf_variable_dims(*, layer, d_model):
  """{mtf variable name: dimension names}, as mtf names them."""
  spec = weight_maps.layer_map(layer, d_model=d_model)
  # A combined axis takes its first dimension's name, as mtf's
  # `_combined_dim` does.
  return {w.mtf_name: tuple(axis[0] for axis in w.mtf_axes)
          for w in spec.weights}


def mtf_to_keras(*, layer, variables, d_model):
  """thattn weights {token: array} from an mtf layer's {variable: array}.

  Raises:
    ValueError naming the variable, its shape and the expected shape when a
    variable is missing, unknown or misshapen, or when the layer's
    configuration has no Keras counterpart (see the module docstring).
  """
  spec = weight_maps.layer_map(layer, d_model=d_model)
  _checked(variables, {w.mtf_name: (spec.shape(w.mtf_axes), _mtf_dims(w))
                       for w in spec.weights}, "mtf variable",
           spec.description)
  weights = {}
  for w in spec.weights:
    value = np.asarray(variables[w.mtf_name])
    keras = _rearrange(value, w.mtf_axes, w.keras_axes, spec.sizes)
    weights[w.token] = keras if w.scale == 1.0 else (
        keras * np.asarray(w.scale, keras.dtype))
  return weights


def keras_to_mtf(*, layer, weights, d_model):
  """An mtf layer's {variable: array} from thattn weights {token: array}.

  Raises:
    ValueError naming the weight, its shape and the expected shape.
  """
  spec = weight_maps.layer_map(layer, d_model=d_model)
  _checked(weights, {w.token: (spec.shape(w.keras_axes), _keras_dims(w))
                     for w in spec.weights}, "thattn weight",
           spec.description)
  variables = {}
  for w in spec.weights:
    value = np.asarray(weights[w.token])
    if w.scale != 1.0:
      value = value / np.asarray(w.scale, value.dtype)
    variables[w.mtf_name] = _rearrange(value, w.keras_axes, w.mtf_axes,
                                       spec.sizes)
  return variables


def keras_layer(*, layer, d_model, name=None):
  """thattn's Keras attention layer computing what mtf `layer` computes.

  Unbuilt: call it (or `build_from_shapes`) with width-d_model inputs
  before `set_keras_weights`. `fused_kernel` is left to thattn's choice.
  """
  spec = weight_maps.layer_map(layer, d_model=d_model)
  return spec.keras_class(output_dim=d_model, name=name, **spec.keras_kwargs)


def keras_relative_bias(*, layer, d_model, bidirectional, name=None):
  """thattn's `RelativePositionBias` for `layer`'s relative bias, or None.

  `bidirectional` is mtf's `not model.fully_autoregressive`: False for the
  causal self-attention of a decoder or language model.
  """
  spec = weight_maps.layer_map(layer, d_model=d_model)
  if not any(w.token == weight_maps.RELATIVE_BIAS for w in spec.weights):
    return None
  return keras_layers.RelativePositionBias(
      num_heads=spec.keras_kwargs["num_heads"], bidirectional=bidirectional,
      num_buckets=spec.sizes[weight_maps.BUCKETS], name=name)


def token_of(variable_name):
  """The thattn token of a Keras variable name ("layer/query/kernel:0")."""
  path = variable_name.split(":")[0]
  for token in ("relative_attention_bias", "pre_softmax_projection",
                "post_softmax_projection", "bilinear_p", "bilinear_q"):
    if path.endswith(token):
      return token
  return "/".join(path.split("/")[-2:])


def keras_weights(*, layers):
  """{token: array} of thattn Keras layers (an attention layer and its
  optional `RelativePositionBias`)."""
  weights = {}
  for layer in layers:
    for variable in layer.weights:
      token = token_of(variable.name)
      if token in weights:
        raise ValueError(f"two weights have token {token!r} (the second is "
                         f"{variable.name!r}); pass one attention layer and "
                         "at most one RelativePositionBias.")
      weights[token] = variable.numpy()
  return weights


def set_keras_weights(*, layers, weights):
  """Assigns {token: array} to built thattn Keras layers.

  Raises:
    ValueError naming the token, its shape and the layer's shape, or the
    weight that `weights` lacks or the layers lack.
  """
  variables = {token_of(v.name): v for layer in layers for v in layer.weights}
  _checked(weights, {token: (tuple(v.shape.as_list()), f"({v.name})")
                     for token, v in variables.items()}, "thattn weight",
           " + ".join(layer.name for layer in layers))
  for token, variable in variables.items():
    variable.assign(np.asarray(weights[token], variable.dtype.as_numpy_dtype))
