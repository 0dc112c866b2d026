"""What both front ends' attention layers compute around their cores,
written once, in plain Python.

Mixins for the layer classes of `thattn.layers` (tf_keras) and
`thattn.keras3` (Keras 3), which add their framework's glue as class
attributes or methods: `_framework` (tf_keras or keras), and for
`ProjectedHooks` `_mix_heads(scores, projection)` and `_dynamic_mix(name,
scores, projection)` in the framework's ops, for both `_serialize_
initializer`. The equations are `thattn.core.attention_spec`'s.

- `ProjectedHooks`: the projected attention layers' hooks (letters as in
  `thattn.core.dims`):
      Q = X P_q,  K = M P_k,  V = M P_v,  R = the dynamic generators' terms
      L[b, h, n, m]   = mix_logits(J[b, h_k, n, m]) = J P_l (+ dynamic)
      U[b, h_v, n, m] = mix_weights(W[b, h, n, m]) = W P_w (+ dynamic)
  identities where the layer has no P_l / P_w (multi-head attention);
  and `TalkingHeadsHooks` adds the talking-heads layer's own arguments,
  its static mixes P_l[h_k, h] and P_w[h, h_v] and its config (glue:
  `_projection_initializer(fan_in)`);
- `RelativePositionBiasConfig`: T5's relative position bias's arguments,
  checks and config.
"""

from thattn.core import attention_spec
from thattn.core import validation


class ProjectedHooks:
  """Mixin for `ProjectedAttention`: its arguments, and the hooks around
  the attention core (see the module)."""

  def set_projections(self, num_key_heads, num_heads, num_value_heads,
                      key_dim, value_dim, use_bias, bias_initializer):
    """Checks and keeps the heads and sizes (ValueError naming a bad one)."""
    value_dim = key_dim if value_dim is None else value_dim
    self.num_heads = validation.layer_int("num_heads", num_heads)
    self.num_key_heads = validation.layer_int("num_key_heads",
                                              num_key_heads)
    self.num_value_heads = validation.layer_int("num_value_heads",
                                                num_value_heads)
    self.key_dim = validation.layer_int("key_dim", key_dim)
    self.value_dim = validation.layer_int("value_dim", value_dim)
    self.use_bias = use_bias
    self.bias_initializer = self._framework.initializers.get(
        bias_initializer)
    # P_l[h_k, h] and P_w[h, h_v]; None means identity (multi-head).
    self._pre_softmax_projection = None
    self._post_softmax_projection = None
    # {name: the layer generating R}: TalkingHeadsAttention's dynamic
    # projections, made with its weights. (An instance attribute: tf_keras
    # tracks no layers in an attribute the class also has.)
    self._dynamic_dense = {}

  def projections_config(self):
    return {"key_dim": self.key_dim, "value_dim": self.value_dim,
            "use_bias": self.use_bias,
            "bias_initializer": self._serialize_initializer(
                self.bias_initializer)}

  def project_query(self, query):
    state = {"query": self._query_dense(query)}
    state.update(attention_spec.generate_dynamic(self._dynamic_dense,
                                                 query=query))
    return state

  def project_memory(self, key, value):
    state = {"key": self._key_dense(key), "value": self._value_dense(value)}
    state.update(attention_spec.generate_dynamic(self._dynamic_dense,
                                                 key=key, value=value))
    return state

  def dynamic_terms(self, query_state, memory_state):
    """{name: R[b, n or m, ...]} of the dynamic projections of this call."""
    return attention_spec.dynamic_terms(self.dynamic_projections,
                                        query_state, memory_state)

  def mix_logits(self, dot_products, query_state, memory_state):
    """L[b, h, n, m] from J[b, h_k, n, m]."""
    return self._mix(dot_products, self._pre_softmax_projection,
                     ("x2l", "m2l"), query_state, memory_state)

  def mix_weights(self, weights, query_state, memory_state):
    """U[b, h_v, n, m] from W[b, h, n, m]."""
    return self._mix(weights, self._post_softmax_projection,
                     ("x2w", "m2w"), query_state, memory_state)

  def _mix(self, scores, projection, dynamic_names, query_state,
           memory_state):
    """`scores` mixed across heads by the static `projection` (None: the
    identity), plus the dynamic terms `dynamic_names` (the query's, the
    memory's) that this call generated."""
    mixed = scores if projection is None else self._mix_heads(scores,
                                                              projection)
    for name, state in zip(dynamic_names, (query_state, memory_state)):
      if name in state:
        mixed = mixed + self._dynamic_mix(name, scores, state[name])
    return mixed


class TalkingHeadsHooks(ProjectedHooks):
  """Mixin for `TalkingHeadsAttention`: its arguments beyond the
  projections', P_l and P_w, and its config (see the module)."""

  def set_talking_heads(self, project_logits, project_weights,
                        dynamic_projections, num_head_groups,
                        talking_heads_initializer):
    """Checks and keeps the talking-heads options (after `set_projections`,
    whose heads they are checked against)."""
    self.dynamic_projections = attention_spec.checked_dynamic_projections(
        dynamic_projections, project_logits=project_logits,
        project_weights=project_weights)
    self.project_logits = project_logits
    self.project_weights = project_weights
    self.num_head_groups = attention_spec.checked_groups(
        num_head_groups, self.num_key_heads, self.num_heads,
        self.num_value_heads)
    self.talking_heads_initializer = (
        None if talking_heads_initializer is None else
        self._framework.initializers.get(talking_heads_initializer))

  def create_head_mixes(self):
    """Creates P_l and P_w (those the layer has); returns their
    `attention_spec.MixingShapes`, which the dynamic projections share."""
    shapes = attention_spec.MixingShapes(
        self.num_key_heads, self.num_heads, self.num_value_heads,
        self.num_head_groups)
    if self.project_logits:
      self._pre_softmax_projection = self.add_axes_weight(
          "pre_softmax_projection", *shapes.static("l"),
          self._projection_initializer(shapes.fan_in("l")))
    if self.project_weights:
      self._post_softmax_projection = self.add_axes_weight(
          "post_softmax_projection", *shapes.static("w"),
          self._projection_initializer(shapes.fan_in("w")))
    return shapes

  def talking_heads_config(self):
    initializer = self.talking_heads_initializer
    return dict(attention_spec.talking_heads_config(self),
                talking_heads_initializer=(
                    None if initializer is None else
                    self._serialize_initializer(initializer)))


class RelativePositionBiasConfig:
  """Mixin for T5's `RelativePositionBias`: the weight
  `relative_attention_bias [num_buckets, h]`, initialized N(0, 1/h) unless
  `embeddings_initializer` says otherwise; its arguments and config."""

  def __init__(self, num_heads, bidirectional=True, num_buckets=32,
               max_distance=128, embeddings_initializer=None, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = validation.layer_int("num_heads", num_heads)
    attention_spec.check_relative_buckets(bidirectional, num_buckets,
                                          max_distance)
    self.bidirectional = bidirectional
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    initializers = self._framework.initializers
    self.embeddings_initializer = initializers.get(
        embeddings_initializer or
        initializers.RandomNormal(stddev=num_heads ** -0.5))

  def get_config(self):
    return dict(super().get_config(), num_heads=self.num_heads,
                bidirectional=self.bidirectional,
                num_buckets=self.num_buckets, max_distance=self.max_distance,
                embeddings_initializer=self._serialize_initializer(
                    self.embeddings_initializer))
