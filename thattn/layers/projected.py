"""Attention with learned query, key, value and output projections.

`ProjectedAttention` holds what multi-head and talking-heads attention share:
P_q, P_k, P_v, P_o and the dot product. It has three heads dimensions, as in
the paper's Section 4: h_k (queries and keys), h (logits and softmax) and h_v
(values). Two public hooks sit between the dot product and the values:

    L[b, h, n, m]   = mix_logits(J[b, h_k, n, m], ...)      identity here
    U[b, h_v, n, m] = mix_weights(W[b, h, n, m], ...)       identity here

`MultiHeadAttention` keeps them as identities (so h_k = h = h_v) and
`TalkingHeadsAttention` sets the static projections P_l and P_w (and adds
its dynamic terms).

The hooks' computation is `thattn.core.attention_spec.mixed_scores`, shared
with `thattn.keras3`. `attend` hands Q, K, V and these hooks to
`thattn.layers.core`, in the way `thattn.kernels.dispatch.choose` picks for
the call (the one place, for both fronts, that decides how the core runs):
all queries at once or in query chunks (`query_chunk_size`), with
TensorFlow ops or the fused talking-heads kernel (`fused_kernel`).
"""

import tensorflow as tf
import tf_keras

from thattn.core import attention_spec
from thattn.core import dims
from thattn.core import validation
from thattn.kernels import dispatch
from thattn.layers import attention_ops
from thattn.layers import base
from thattn.layers import core
from thattn.layers import initializers
from thattn.ops import blocks
from thattn.ops import rotary
from thattn.ops import tf_ops


class ProjectedAttention(base.AttentionLayer):
  """Shared base of MultiHeadAttention and TalkingHeadsAttention: P_q, P_k,
  P_v, P_o, the hooks around the softmax and the attention core.

  Computation (per example; letters as in `thattn.core.dims`)::

    Q[n, h_k, d_k] = einsum(X[n, d_X], P_q[d_X, h_k, d_k])
    K[m, h_k, d_k] = einsum(M[m, d_M], P_k[d_M, h_k, d_k])
    V[m, h_v, d_v] = einsum(M[m, d_M], P_v[d_M, h_v, d_v])
    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])

  With `num_key_value_heads=h_kv` (grouped-query attention), P_k and P_v
  project to h_kv heads, P_k[d_M, h_kv, d_k] and P_v[d_M, h_kv, d_v] (what
  a decoding cache then holds), and each is repeated before J: key head i
  reads K head i // (h_k / h_kv), value head j V head j // (h_v / h_kv).
  With `rotary_base`, Q and K are turned by position before J (rotary
  position embeddings, `thattn.ops.rotary`; a cache holds the turned K).
  The rest is unchanged::

    L[h, n, m]     = mix_logits(J)
    W[h, n, m]     = softmax(L + bias, masked, reduced_dim=m)   # float32
    U[h_v, n, m]   = dropout(mix_weights(W))
    O[n, h_v, d_v] = einsum(U[h_v, n, m], V[m, h_v, d_v])
    Y[n, d_Y]      = einsum(O[n, h_v, d_v], P_o[h_v, d_v, d_Y])
  """

  # What `dispatch.choose` reads besides the call's arguments. Multi-head
  # attention has no heads mixing to fuse, no dynamic projections and one
  # head group; TalkingHeadsAttention sets all three from its arguments.
  fused_kernel = False
  dynamic_projections = ()
  num_head_groups = 1

  def __init__(self, num_key_heads, num_heads, num_value_heads, key_dim,
               value_dim=None, use_bias=False, bias_initializer="zeros",
               query_chunk_size=None, num_key_value_heads=None,
               rotary_base=None, rotary_pct=1.0, rotary_scaling=None,
               query_key_norm_epsilon=None, **kwargs):
    super().__init__(**kwargs)
    self.num_heads = validation.layer_int("num_heads", num_heads)
    self.num_key_heads = validation.layer_int("num_key_heads",
                                              num_key_heads)
    self.num_value_heads = validation.layer_int("num_value_heads",
                                                num_value_heads)
    self.key_dim = validation.layer_int("key_dim", key_dim)
    self.value_dim = validation.layer_int(
        "value_dim", key_dim if value_dim is None else value_dim)
    self.use_bias = use_bias
    self.bias_initializer = tf_keras.initializers.get(bias_initializer)
    self.query_chunk_size = validation.positive_int(
        "query_chunk_size", query_chunk_size, optional=True)
    self.num_key_value_heads = attention_spec.checked_key_value_heads(
        self.name, num_key_value_heads, self.num_key_heads,
        self.num_value_heads)
    # theta[r] of the rotary position embeddings, or None (thattn.ops.
    # rotary): the queries and keys turned by position before J.
    scaling = rotary.llama3_scaling(rotary_scaling)
    self._rotary_frequencies = rotary.layer_frequencies(
        self.name, self.key_dim, rotary_base, rotary_pct, scaling)
    self.rotary_base = rotary_base
    self.rotary_pct = rotary_pct
    self.rotary_scaling = rotary.scaling_config(scaling)  # as configs hold it
    # Q and K RMS-normalized per head over d_k, each with a learned scale
    # [d_k] (Qwen3's, DCFormer's), before the rotation; None: no norm.
    self.query_key_norm_epsilon = attention_spec.checked_query_key_norm(
        self.name, query_key_norm_epsilon)
    self._query_key_norms = {}
    # P_l[h_k, h] and P_w[h, h_v]; None means identity (multi-head).
    self._pre_softmax_projection = None
    self._post_softmax_projection = None
    # {name: the layer generating R}: TalkingHeadsAttention's dynamic
    # projections, made with its weights. (An instance attribute: tf_keras
    # tracks no layers in an attribute the class also has.)
    self._dynamic_dense = {}

  def _einsum_dense(self, name, equation, output_shape, bias_axes,
                    initializer):
    return tf_keras.layers.EinsumDense(
        equation, output_shape=output_shape,
        bias_axes=bias_axes if self.use_bias else None,
        kernel_initializer=initializers.fresh(initializer),
        bias_initializer=initializers.fresh(self.bias_initializer),
        kernel_regularizer=self.kernel_regularizer,
        bias_regularizer=self.bias_regularizer,
        kernel_constraint=self.kernel_constraint,
        bias_constraint=self.bias_constraint,
        dtype=self.dtype_policy, name=name)

  def create_weights(self, query_width, key_width, value_width):
    h_k, h_v = self.num_key_heads, self.num_value_heads
    d_k, d_v = self.key_dim, self.value_dim
    # The heads P_k and P_v project to: h_kv of them where shared.
    key_heads = self.num_key_value_heads or h_k
    value_heads = self.num_key_value_heads or h_v
    output_dim = self.output_dim or query_width
    query_init = initializers.ScaledInitializer(self.kernel_initializer,
                                                d_k ** -0.5)
    self._query_dense = self.add_axes_sublayer(
        self._einsum_dense("query", attention_spec.QUERY_PROJECTION,
                           (None, h_k, d_k), "ik", query_init),
        [None, None, query_width],
        attention_spec.PROJECTION_AXES["query"])
    self._key_dense = self.add_axes_sublayer(
        self._einsum_dense("key", attention_spec.KEY_PROJECTION,
                           (None, key_heads, d_k), "ik",
                           self.kernel_initializer),
        [None, None, key_width],
        attention_spec.PROJECTION_AXES["key"])
    self._value_dense = self.add_axes_sublayer(
        self._einsum_dense("value", attention_spec.VALUE_PROJECTION,
                           (None, value_heads, d_v), "jv",
                           self.kernel_initializer),
        [None, None, value_width],
        attention_spec.PROJECTION_AXES["value"])
    self._output_dense = self.add_axes_sublayer(
        self._einsum_dense("output", attention_spec.OUTPUT_PROJECTION,
                           (None, output_dim), "o", self.kernel_initializer),
        [None, None, h_v, d_v],
        attention_spec.PROJECTION_AXES["output"])

  def create_query_key_norms(self):
    """With `query_key_norm_epsilon`: the scales [d_k] of the queries' and
    keys' RMSNorm. The queries' starts at d_k**-0.5: the norm undoes any
    scale of P_q, so the logits' 1/sqrt(d_k) is folded into it instead."""
    if self.query_key_norm_epsilon is None:
      return
    for name, initial in (("query", self.key_dim ** -0.5), ("key", 1.0)):
      self._query_key_norms[name] = self.add_axes_weight(
          f"{name}_norm", [self.key_dim], (dims.D_K,),
          tf_keras.initializers.Constant(initial))

  def _normalized(self, name, tensor):
    """Q or K [b, n, heads, d_k], RMS-normalized over d_k with its scale."""
    if self.query_key_norm_epsilon is None:
      return tensor
    return blocks.rms_norm(tf_ops.TF_OPS, tensor, self._query_key_norms[name],
                           self.query_key_norm_epsilon, tensor.dtype)

  def project_query(self, query):
    state = {"query": self._normalized("query", self._query_dense(query))}
    state.update(attention_spec.generate_dynamic(self._dynamic_dense,
                                                 query=query))
    return state

  def project_memory(self, key, value):
    state = {"key": self._normalized("key", self._key_dense(key)),
             "value": self._value_dense(value)}
    state.update(attention_spec.generate_dynamic(self._dynamic_dense,
                                                 key=key, value=value))
    return state

  def with_positions(self, state, offset):
    if self._rotary_frequencies is None:
      return state
    return dict(state, **{
        name: rotary.apply(tf_ops.TF_OPS, state[name], rotary.positions_from(
            tf_ops.TF_OPS, state[name], offset), self._rotary_frequencies)
        for name in ("query", "key") if name in state})

  def repeat_shared_heads(self, memory_state):
    if self.num_key_value_heads is None:
      return memory_state
    return dict(memory_state, **{
        name: tf.repeat(memory_state[name],
                        heads // self.num_key_value_heads, axis=2)
        for name, heads in (("key", self.num_key_heads),
                            ("value", self.num_value_heads))})

  def project_output(self, context):
    return self._output_dense(context)

  def gate_shape(self):
    return self.num_value_heads, self.value_dim

  def dynamic_terms(self, query_state, memory_state):
    """{name: R[b, n or m, ...]} of the dynamic projections of this call."""
    return attention_spec.dynamic_terms(self.dynamic_projections,
                                        query_state, memory_state)

  def mix_logits(self, dot_products, query_state, memory_state):
    """L[b, h, n, m] from J[b, h_k, n, m]."""
    return attention_spec.mixed_scores(
        dot_products, self._pre_softmax_projection, ("x2l", "m2l"),
        query_state, memory_state, groups=self.num_head_groups,
        mix_heads=attention_ops.mix_heads,
        dynamic_mix=attention_ops.dynamic_mix)

  def mix_weights(self, weights, query_state, memory_state):
    """U[b, h_v, n, m] from W[b, h, n, m]."""
    return attention_spec.mixed_scores(
        weights, self._post_softmax_projection, ("x2w", "m2w"),
        query_state, memory_state, groups=self.num_head_groups,
        mix_heads=attention_ops.mix_heads,
        dynamic_mix=attention_ops.dynamic_mix)

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    query, key, value = (query_state["query"], memory_state["key"],
                         memory_state["value"])
    projections = (self._pre_softmax_projection,
                   self._post_softmax_projection)
    dynamic = self.dynamic_terms(query_state, memory_state)
    choice = dispatch.choose(dispatch.Call(
        owner=self.name, front=dispatch.TF_KERAS, switch=self.fused_kernel,
        query=query, projections=projections, dynamic=dynamic,
        head_groups=self.num_head_groups, dropout=self.dropout,
        training=training, need_scores=need_scores,
        chunk_size=self.query_chunk_size))
    context, value_weights = core.attention_core(
        choice, query, key, value, projections=projections, mask=mask,
        causal_offset=causal_offset, bias=position_bias,
        chunk_size=self.query_chunk_size,
        mix_logits=lambda dots: self.mix_logits(dots, query_state,
                                                memory_state),
        mix_weights=lambda weights: self.mix_weights(weights, query_state,
                                                     memory_state),
        dropout=lambda scores: self.dropout_weights(scores, training),
        dynamic=dynamic)
    return context, value_weights

  def get_config(self):
    return dict(super().get_config(), key_dim=self.key_dim,
                value_dim=self.value_dim, use_bias=self.use_bias,
                bias_initializer=tf_keras.initializers.serialize(
                    self.bias_initializer),
                query_chunk_size=self.query_chunk_size,
                **attention_spec.projected_options_config(self))
