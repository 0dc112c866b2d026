"""Every variable of an mtf Bitransformer or Unitransformer, as a weight of
thattn's T5 model (a one-stack T5Config for a Unitransformer).

`mtf_to_keras(mtf_model=..., keras_model=..., variables=...)` assigns an
mtf checkpoint's {name: array} to a built `thattn.models` T5 model;
`keras_to_mtf(...)` reads the Keras model back into mtf's names. Both walk
the two models side by side (`_units`): per block, the RMSNorm scales and
feed-forward kernels are copied as they are, and each attention layer goes
through the layer-level maps of `thattn.mtf.layer_weights` (reshapes and
transposes only, so a round trip is exact).

| mtf variable (T5's names) | thattn weight |
|---|---|
| `shared/embedding` [vocab, d_model] (`transformer/embedding`) | `token_embedding` E |
| `decoder/logits/kernel` [d_model, vocab] (`transformer/...`; untied) | `lm_head` kernel |
| `{stack}/block_{i}/layer_{j}/rms_norm/scale` (`layer_norm` in T5 1.0's legacy stack) | block i's norm before sublayer j |
| `{stack}/block_{i}/layer_{j}/{attention class}/...` | block i's attention (see `layer_weights`) |
| `.../SelfAttention/relative_attention_bias` of block 0 | the stack's `RelativePositionBias` (mtf's "bias_shared": block 0 owns it) |
| `{stack}/block_{i}/layer_{j}/DenseReluDense/wi/kernel` (`wi_0`, `wi_1` gated) | feed_forward `input` (and `gate`) kernel |
| `.../DenseReluDense/wo/kernel` | feed_forward `output` kernel |
| `{stack}/rms_norm/scale` (`final_layer_norm` in the legacy stack) | `{stack}_final_norm` |

`{stack}` is `encoder` or `decoder` in a Bitransformer; a Unitransformer's
one stack is `transformer` (its name), thattn's `decoder_*` layers for a
language model ("lm") and `encoder_*` for an "aligned" model.
"""

import dataclasses

import numpy as np

from thattn.mtf import architecture
from thattn.mtf import layer_weights
from thattn.mtf import weight_maps


@dataclasses.dataclass(frozen=True)
class _Copy:
  mtf_name: str
  variable: object  # a Keras variable of the same shape


@dataclasses.dataclass(frozen=True)
class _Attention:
  mtf_prefix: str  # "encoder/block_000/layer_000/SelfAttention/"
  mtf_layer: object
  keras_layer: object
  bias_layer: object  # the stack's RelativePositionBias, or None
  bias_owner: str  # mtf name of the stack's shared bias, or None


def _block_units(stack, block, keras_block, bias_layer, bias_owner,
                 norm_scope):
  units = []
  roles = ((block.self_attention, keras_block.self_attention_norm,
            keras_block.self_attention, bias_layer),
           (block.cross_attention, keras_block.cross_attention_norm,
            keras_block.cross_attention, None))
  for layer, norm, attention, bias in roles:
    if layer is None:
      continue
    scope = f"{stack}/{layer.name}/"
    units.append(_Copy(f"{scope}{norm_scope}/scale", norm.scale))
    units.append(_Attention(scope + type(layer).__name__ + "/", layer,
                            attention, bias, bias_owner if bias else None))
  ff, keras_ff = block.feed_forward, keras_block.feed_forward
  scope = f"{stack}/{ff.name}/"
  units.append(_Copy(f"{scope}{norm_scope}/scale",
                     keras_block.feed_forward_norm.scale))
  wi = scope + "DenseReluDense/wi"
  if keras_ff.gate_dense is None:
    units.append(_Copy(wi + "/kernel", keras_ff.input_dense.kernel))
  else:
    units.append(_Copy(wi + "_0/kernel", keras_ff.input_dense.kernel))
    units.append(_Copy(wi + "_1/kernel", keras_ff.gate_dense.kernel))
  units.append(_Copy(scope + "DenseReluDense/wo/kernel",
                     keras_ff.output_dense.kernel))
  return units


def _stack_units(unit, keras_model, kind, *, cross_attention):
  """The units of one mtf stack and thattn's `{kind}_*` layers."""
  blocks = architecture.blocks(unit.name, unit, decoder=cross_attention)
  norm_scope, final_norm_scope = architecture.norm_scopes(unit.name, unit)
  bias_layer = keras_model.get_layer(
      f"{kind}_position_bias").relative_position_bias
  first = blocks[0].self_attention
  bias_owner = (f"{unit.name}/{first.name}/{type(first).__name__}/"
                f"{weight_maps.RELATIVE_BIAS}")
  units = []
  for index, block in enumerate(blocks):
    units += _block_units(unit.name, block,
                          keras_model.get_layer(f"{kind}_block_{index}"),
                          bias_layer, bias_owner, norm_scope)
  units.append(_Copy(f"{unit.name}/{final_norm_scope}/scale",
                     keras_model.get_layer(f"{kind}_final_norm").scale))
  return units


def _units(mtf_model, keras_model):
  """The units of the two models, in mtf's order.

  A Bitransformer's stacks are `encoder/` and `decoder/` with one
  `shared/embedding`; a Unitransformer's one stack is `transformer/` (its
  name) with `transformer/embedding`, thattn's decoder (a language model)
  or encoder (an "aligned" model).
  """
  embedding = keras_model.get_layer("token_embedding").embeddings
  if isinstance(mtf_model, architecture.transformer.Bitransformer):
    units = [_Copy("shared/embedding", embedding)]
    units += _stack_units(mtf_model.encoder, keras_model, "encoder",
                          cross_attention=False)
    units += _stack_units(mtf_model.decoder, keras_model, "decoder",
                          cross_attention=True)
    logits_owner = mtf_model.decoder
  else:
    units = [_Copy(f"{mtf_model.name}/embedding", embedding)]
    units += _stack_units(
        mtf_model, keras_model,
        "decoder" if mtf_model.autoregressive else "encoder",
        cross_attention=False)
    logits_owner = mtf_model
  if not logits_owner.shared_embedding_and_softmax_weights:
    units.append(_Copy(f"{logits_owner.name}/logits/kernel",
                       keras_model.get_layer("lm_head").kernel))
  return units


def _d_model(keras_model):
  return keras_model.get_layer("token_embedding").width


def mtf_names(*, mtf_model, keras_model):
  """Every mtf variable name the two models share, sorted."""
  names = set()
  d_model = _d_model(keras_model)
  for unit in _units(mtf_model, keras_model):
    if isinstance(unit, _Copy):
      names.add(unit.mtf_name)
      continue
    for name in layer_weights.mtf_variable_shapes(layer=unit.mtf_layer,
                                                  d_model=d_model):
      full = unit.mtf_prefix + name
      if name != weight_maps.RELATIVE_BIAS or full == unit.bias_owner:
        names.add(full)
  return sorted(names)


def _check_names(variables, expected):
  missing = sorted(set(expected) - set(variables))
  unknown = sorted(set(variables) - set(expected))
  if missing or unknown:
    raise ValueError(
        f"the mtf checkpoint does not match its operative_config.gin: "
        f"missing variables {missing[:5]}{' ...' if len(missing) > 5 else ''}"
        f", variables left over {unknown[:5]}"
        f"{' ...' if len(unknown) > 5 else ''}.")


def mtf_to_keras(*, mtf_model, keras_model, variables):
  """Assigns mtf {name: array} to a built thattn T5 model.

  Raises:
    ValueError naming missing or left-over variables, or a variable whose
    shape does not fit (with both shapes).
  """
  _check_names(variables, mtf_names(mtf_model=mtf_model,
                                    keras_model=keras_model))
  d_model = _d_model(keras_model)
  for unit in _units(mtf_model, keras_model):
    if isinstance(unit, _Copy):
      value = np.asarray(variables[unit.mtf_name])
      if tuple(value.shape) != tuple(unit.variable.shape.as_list()):
        raise ValueError(
            f"mtf variable {unit.mtf_name!r} has shape {value.shape}, "
            f"expected {tuple(unit.variable.shape.as_list())} for thattn's "
            f"{unit.variable.name}.")
      unit.variable.assign(value.astype(np.float32))
      continue
    layer_variables = {
        name[len(unit.mtf_prefix):]: value
        for name, value in variables.items()
        if name.startswith(unit.mtf_prefix)}
    layers = [unit.keras_layer]
    if unit.bias_layer is not None:
      # Every self-attention layer of the stack reads block 0's bias.
      layer_variables[weight_maps.RELATIVE_BIAS] = variables[unit.bias_owner]
      layers.append(unit.bias_layer)
    layer_weights.set_keras_weights(
        layers=layers, weights=layer_weights.mtf_to_keras(
            layer=unit.mtf_layer, variables=layer_variables, d_model=d_model))


def keras_to_mtf(*, mtf_model, keras_model):
  """mtf {name: float32 array} of a thattn T5 model's weights."""
  variables = {}
  d_model = _d_model(keras_model)
  for unit in _units(mtf_model, keras_model):
    if isinstance(unit, _Copy):
      variables[unit.mtf_name] = unit.variable.numpy()
      continue
    layers = [unit.keras_layer] + (
        [unit.bias_layer] if unit.bias_layer is not None else [])
    converted = layer_weights.keras_to_mtf(
        layer=unit.mtf_layer, d_model=d_model,
        weights=layer_weights.keras_weights(layers=layers))
    for name, value in converted.items():
      full = unit.mtf_prefix + name
      if name == weight_maps.RELATIVE_BIAS and full != unit.bias_owner:
        continue  # mtf keeps the shared bias once, in block 0
      variables[full] = value
  return variables
