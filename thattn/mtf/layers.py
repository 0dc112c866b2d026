"""thattn's own Mesh TensorFlow attention layer: grouped talking heads.

Mesh TensorFlow already has every attention variant of the paper
(`mesh_tensorflow.transformer.transformer_layers`: `SelfAttention`,
`EncDecAttention`, `TalkingHeadsSelfAttention`,
`TalkingHeadsEncDecAttention`, `GeneralBilinearSelfAttention`,
`GeneralBilinearEncDecAttention`); thattn uses them as they are. What mtf
lacks is thattn's argument surface for talking heads, in particular
`num_head_groups`: mtf reaches the same computation only when the user
names a heads dimension shared by all three head lists, and it decides
whether P_l and P_w exist by comparing dimension *names*, silently dropping
`dynamic_projections` when they match. `GroupedTalkingHeadsSelfAttention`
and `GroupedTalkingHeadsEncDecAttention` take thattn's Keras arguments,
check them as `thattn.layers.TalkingHeadsAttention` does, name the
dimensions so that thattn's rules table shards them, and run mtf's own
talking-heads code with those dimensions.

Computation (per example; the paper's notation, G head groups, i, h, j
counting heads within a group, as in `thattn.layers.talking_heads`):

    Q[n, g, i, d_k]   = einsum(X[n, d_model], P_q[d_model, g, i, d_k])
    K[m, g, i, d_k]   = einsum(M[m, d_model], P_k[d_model, g, i, d_k])
    V[m, g, j, d_v]   = einsum(M[m, d_model], P_v[d_model, g, j, d_v])
    J[g, i, n, m]     = einsum(Q[n, g, i, d_k], K[m, g, i, d_k])
    L[g, h, n, m]     = einsum(J[g, i, n, m], P_l[g, i, h]) (+ dynamic terms)
    W[g, h, n, m]     = softmax(L[g, h, n, m] + bias, reduced_dim=m)
    U[g, j, n, m]     = einsum(W[g, h, n, m], P_w[g, h, j]) (+ dynamic terms)
    O[n, g, j, d_v]   = einsum(U[g, j, n, m], V[m, g, j, d_v])
    Y[n, d_model]     = einsum(O[n, g, j, d_v], P_o[g, j, d_v, d_model])

The mtf dimensions are named after thattn's logical axes: with G = 1
`key_heads`, `heads`, `value_heads` (the weights have exactly the Keras
shapes); with G > 1 `head_groups` plus `key_heads_per_group`,
`heads_per_group`, `value_heads_per_group`. A projection that is off gives
its two head lists the same name (so mtf creates no P_l or P_w). The rules
"batch:batch;head_groups:model" then put whole groups on each model shard,
and the attention core needs no communication, as in thattn's DTensor path.

gin: both layers are registered as `thattn.GroupedTalkingHeadsSelfAttention`
and `thattn.GroupedTalkingHeadsEncDecAttention`, so an mtf gin config can
name them in `make_layer_stack.layers`. `attention_layer(name, **kwargs)`
builds any attention layer, mtf's or thattn's, from its gin name.
"""

import difflib
import importlib

import gin

from thattn import layers as keras_layers
from thattn.core import validation
from thattn.mtf import compat

compat.install_transformer()
# After the compat patches: mtf's transformer package imports only with them.
transformer = importlib.import_module("mesh_tensorflow.transformer.transformer")
transformer_layers = importlib.import_module(
    "mesh_tensorflow.transformer.transformer_layers")


class _GroupedTalkingHeads(transformer.TransformerLayer):
  """Shared part of the two layers; `_MTF_CLASS` is mtf's layer to run.

  Args (as `thattn.layers.TalkingHeadsAttention`, plus mtf's):
    num_heads: h, the softmax heads.
    key_dim: d_k.
    value_dim: d_v; defaults to key_dim.
    num_key_heads: h_k; defaults to h.
    num_value_heads: h_v; defaults to h.
    num_head_groups: G, dividing h_k, h and h_v.
    project_logits: learn P_l; False needs h_k == h.
    project_weights: learn P_w; False needs h == h_v.
    dynamic_projections: a subset of ("x2l", "m2l", "x2w", "m2w").
    dropout_rate: mtf's attention dropout (one mask shared by all query
      positions).
    relative_attention_type: None, "bias" or "bias_shared" (T5's bias in
      the softmax heads).
    relative_attention_num_buckets: buckets of the relative bias.
    dynamic_projections_init_scale: mtf's variance scale of P_Xl etc.
  """

  _MTF_CLASS = None

  def __init__(self, num_heads=8, key_dim=64, value_dim=None,
               num_key_heads=None, num_value_heads=None, num_head_groups=1,
               project_logits=True, project_weights=True,
               dynamic_projections=(), dropout_rate=0.0,
               relative_attention_type=None,
               relative_attention_num_buckets=32,
               dynamic_projections_init_scale=1e-2):
    owner = type(self).__name__
    validation.one_of("relative_attention_type", relative_attention_type,
                      (None, "bias", "bias_shared"), owner=owner)
    # The Keras layer's constructor is the one check of these arguments
    # (head counts, groups, projections off with unequal heads, dynamic
    # projections without their static one), so both backends accept and
    # refuse the same configurations.
    keras = keras_layers.TalkingHeadsAttention(
        num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
        num_key_heads=num_key_heads, num_value_heads=num_value_heads,
        num_head_groups=num_head_groups, project_logits=project_logits,
        project_weights=project_weights,
        dynamic_projections=dynamic_projections or (),
        dropout=dropout_rate)
    self.num_heads = keras.num_heads
    self.key_dim = keras.key_dim
    self.value_dim = keras.value_dim
    self.num_key_heads = keras.num_key_heads
    self.num_value_heads = keras.num_value_heads
    self.num_head_groups = keras.num_head_groups
    self.project_logits = project_logits
    self.project_weights = project_weights
    self.dynamic_projections = keras.dynamic_projections
    self.dropout_rate = keras.dropout_rate
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = validation.positive_int(
        "relative_attention_num_buckets", relative_attention_num_buckets,
        owner=owner)
    self.dynamic_projections_init_scale = dynamic_projections_init_scale

  def keras_config(self):
    """The `thattn.layers.TalkingHeadsAttention` arguments of this layer."""
    return dict(
        num_heads=self.num_heads, key_dim=self.key_dim,
        value_dim=self.value_dim, num_key_heads=self.num_key_heads,
        num_value_heads=self.num_value_heads,
        num_head_groups=self.num_head_groups,
        project_logits=self.project_logits,
        project_weights=self.project_weights,
        dynamic_projections=list(self.dynamic_projections),
        dropout=self.dropout_rate)

  def heads_dims(self):
    """(key, softmax, value) heads dims as mtf (name, size) lists."""
    groups = self.num_head_groups
    per_group = "_per_group" if groups > 1 else ""
    key = ("key_heads" + per_group, self.num_key_heads // groups)
    softmax = ("heads" + per_group, self.num_heads // groups)
    value = ("value_heads" + per_group, self.num_value_heads // groups)
    # mtf creates P_l (P_w) only when the two lists' names differ.
    if not self.project_logits:
      key = softmax
    if not self.project_weights:
      value = softmax
    prefix = [("head_groups", groups)] if groups > 1 else []
    return prefix + [key], prefix + [softmax], prefix + [value]

  def mtf_layer(self):
    """mtf's talking-heads layer with this layer's dimensions."""
    key, softmax, value = self.heads_dims()
    return self._MTF_CLASS(  # pylint: disable=not-callable
        key_heads_dims=key, softmax_heads_dims=softmax,
        value_heads_dims=value, key_size=self.key_dim,
        value_size=self.value_dim, dropout_rate=self.dropout_rate,
        relative_attention_type=self.relative_attention_type,
        relative_attention_num_buckets=self.relative_attention_num_buckets,
        dynamic_projections=list(self.dynamic_projections),
        dynamic_projections_init_scale=self.dynamic_projections_init_scale)

  def call(self, context, x, losses=None):
    # Runs in the caller's variable scope, so the variables are named as
    # mtf's own layer names them (q, k, v, y, logits, weights, ...).
    return self.mtf_layer().call(context, x, losses=losses)


@gin.configurable(module="thattn")
class GroupedTalkingHeadsSelfAttention(_GroupedTalkingHeads):
  """Grouped talking-heads self-attention (see the module docstring)."""

  _MTF_CLASS = transformer_layers.TalkingHeadsSelfAttention


@gin.configurable(module="thattn")
class GroupedTalkingHeadsEncDecAttention(_GroupedTalkingHeads):
  """Grouped talking-heads attention over the encoder output."""

  _MTF_CLASS = transformer_layers.TalkingHeadsEncDecAttention


# Every attention layer by its gin name; mtf's module-qualified gin name
# works too (e.g. "transformer_layers.SelfAttention").
ATTENTION_LAYERS = {
    "SelfAttention": transformer_layers.SelfAttention,
    "EncDecAttention": transformer_layers.EncDecAttention,
    "TalkingHeadsSelfAttention": transformer_layers.TalkingHeadsSelfAttention,
    "TalkingHeadsEncDecAttention":
        transformer_layers.TalkingHeadsEncDecAttention,
    "GeneralBilinearSelfAttention":
        transformer_layers.GeneralBilinearSelfAttention,
    "GeneralBilinearEncDecAttention":
        transformer_layers.GeneralBilinearEncDecAttention,
    "thattn.GroupedTalkingHeadsSelfAttention":
        GroupedTalkingHeadsSelfAttention,
    "thattn.GroupedTalkingHeadsEncDecAttention":
        GroupedTalkingHeadsEncDecAttention,
}


def _known_name(name):
  """The ATTENTION_LAYERS key that gin name `name` refers to, or None."""
  for prefix in ("", "mesh_tensorflow.transformer.transformer_layers.",
                 "transformer_layers."):
    if name.startswith(prefix) and name[len(prefix):] in ATTENTION_LAYERS:
      return name[len(prefix):]
  # gin also accepts a configurable without its module when unambiguous.
  return "thattn." + name if "thattn." + name in ATTENTION_LAYERS else None


def attention_layer(name, **kwargs):
  """An attention layer from its gin name, e.g. "TalkingHeadsSelfAttention".

  Raises:
    ValueError naming `name` and the known names when no attention layer
    has that gin name.
  """
  known = _known_name(name) if isinstance(name, str) else None
  if known is None:
    close = difflib.get_close_matches(str(name), list(ATTENTION_LAYERS), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown attention layer gin name {name!r}; expected "
                     f"one of {', '.join(ATTENTION_LAYERS)}.{hint}")
  return ATTENTION_LAYERS[known](**kwargs)
