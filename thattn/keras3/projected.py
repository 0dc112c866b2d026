"""Multi-head and talking-heads attention as Keras 3 layers.

Computation (per example; letters as in `thattn.core.dims`; the equations are
`thattn.core.attention_spec`'s, shared with `thattn.layers`)::

    Q[n, h_k, d_k] = einsum(X[n, d_X], P_q[d_X, h_k, d_k])
    K[m, h_k, d_k] = einsum(M[m, d_M], P_k[d_M, h_k, d_k])
    V[m, h_v, d_v] = einsum(M[m, d_M], P_v[d_M, h_v, d_v])
    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = einsum(J, P_l[h_k, h]) + dynamic terms      (talking)
    W[h, n, m]     = softmax(L + bias, masked, reduced_dim=m)    # float32
    U[h_v, n, m]   = einsum(W, P_w[h, h_v]) + dynamic terms      (talking)
    O[n, h_v, d_v] = einsum(dropout(U[h_v, n, m]), V[m, h_v, d_v])
    Y[n, d_Y]      = einsum(O[n, h_v, d_v], P_o[h_v, d_v, d_Y])

With `num_key_value_heads=h_kv` (grouped-query attention), P_k and P_v
project to h_kv heads (what a decoding cache then holds), and each is
repeated before J, as `keras.layers.GroupQueryAttention` repeats them: key
head i reads K head i // (h_k / h_kv), value head j V head j // (h_v / h_kv).
With `rotary_base`, Q and K are turned by position before J (rotary position
embeddings, `thattn.ops.rotary`; a cache holds the turned K).

Multi-head attention is the case without P_l and P_w (h_k = h = h_v). The
1/sqrt(d_k) of scaled dot products is folded into P_q's initializer, never
applied at run time. Each class documents its arguments; they are
`thattn.layers`' (in the same order) with Keras 3's keywords, and the
layers hold the same weights as `thattn.layers`' under the same names.
"""

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.core import dims
from thattn.core import validation
from thattn.kernels import dispatch
from thattn.keras3 import attention_math
from thattn.keras3 import base
from thattn.keras3 import flash
from thattn.keras3 import fused
from thattn.keras3 import initializers
from thattn.ops import blocks
from thattn.ops import rotary


class ProjectedAttention(base.AttentionLayer):
  """P_q, P_k, P_v, P_o and the attention core; P_l / P_w are optional
  (the hooks around the softmax: `thattn.core.attention_spec.
  mixed_scores`, shared with thattn.layers)."""

  # What the kernel's choice reads (thattn.kernels.dispatch); multi-head
  # attention has no heads mixing to fuse.
  dynamic_projections = ()
  num_head_groups = 1
  fused_kernel = False
  kernel_switch = "fused_kernel"  # its name in the refusals
  flash_attention = None

  def __init__(self, num_key_heads, num_heads, num_value_heads, key_dim,
               value_dim=None, use_bias=False, bias_initializer="zeros",
               num_key_value_heads=None, rotary_base=None, rotary_pct=1.0,
               rotary_scaling=None, query_key_norm_epsilon=None, **kwargs):
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
    self.bias_initializer = keras.initializers.get(bias_initializer)
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
    # {name: the layer generating R}: the dynamic projections.
    self._dynamic_dense = {}

  def create_weights(self, query_width, key_width, value_width):
    h_k, h_v = self.num_key_heads, self.num_value_heads
    d_k, d_v = self.key_dim, self.value_dim
    # The heads P_k and P_v project to: h_kv of them where shared.
    key_heads = self.num_key_value_heads or h_k
    value_heads = self.num_key_value_heads or h_v
    query_init = initializers.ScaledInitializer(self.kernel_initializer,
                                                d_k ** -0.5)
    self._query_dense = self.einsum_dense(
        "query", attention_spec.QUERY_PROJECTION, (None, h_k, d_k),
        (None, None, query_width), initializer=query_init,
        bias_axes=self._bias_axes("ik"))
    self._key_dense = self.einsum_dense(
        "key", attention_spec.KEY_PROJECTION, (None, key_heads, d_k),
        (None, None, key_width), initializer=self.kernel_initializer,
        bias_axes=self._bias_axes("ik"))
    self._value_dense = self.einsum_dense(
        "value", attention_spec.VALUE_PROJECTION, (None, value_heads, d_v),
        (None, None, value_width), initializer=self.kernel_initializer,
        bias_axes=self._bias_axes("jv"))
    self._output_dense = self.einsum_dense(
        "output", attention_spec.OUTPUT_PROJECTION,
        (None, self.output_dim or query_width), (None, None, h_v, d_v),
        initializer=self.kernel_initializer, bias_axes=self._bias_axes("o"))

  def _bias_axes(self, axes):
    return axes if self.use_bias else None

  def with_positions(self, state, offset):
    if self._rotary_frequencies is None:
      return state
    return dict(state, **{
        name: rotary.apply(ops, state[name], rotary.positions_from(
            ops, state[name], offset), self._rotary_frequencies)
        for name in ("query", "key") if name in state})

  def repeat_shared_heads(self, memory_state):
    if self.num_key_value_heads is None:
      return memory_state
    return dict(memory_state, **{
        name: ops.repeat(memory_state[name],
                         heads // self.num_key_value_heads, axis=2)
        for name, heads in (("key", self.num_key_heads),
                            ("value", self.num_value_heads))})

  def create_query_key_norms(self):
    """With `query_key_norm_epsilon`: the scales [d_k] of the queries' and
    keys' RMSNorm. The queries' starts at d_k**-0.5: the norm undoes any
    scale of P_q, so the logits' 1/sqrt(d_k) is folded into it instead."""
    if self.query_key_norm_epsilon is None:
      return
    for name, initial in (("query", self.key_dim ** -0.5), ("key", 1.0)):
      self._query_key_norms[name] = self.add_axes_weight(
          f"{name}_norm", [self.key_dim], (dims.D_K,),
          keras.initializers.Constant(initial))

  def _normalized(self, name, tensor):
    """Q or K [b, n, heads, d_k], RMS-normalized over d_k with its scale."""
    if self.query_key_norm_epsilon is None:
      return tensor
    return blocks.rms_norm(ops, tensor, self._query_key_norms[name],
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

  def dynamic_terms(self, query_state, memory_state):
    """{name: R[b, n or m, ...]} of the dynamic projections of this call."""
    return attention_spec.dynamic_terms(self.dynamic_projections,
                                        query_state, memory_state)

  def mix_logits(self, dot_products, query_state, memory_state):
    """L[b, h, n, m] from J[b, h_k, n, m]."""
    return attention_spec.mixed_scores(
        dot_products, self._pre_softmax_projection, ("x2l", "m2l"),
        query_state, memory_state, groups=self.num_head_groups,
        mix_heads=attention_math.mix_heads,
        dynamic_mix=attention_math.dynamic_mix)

  def mix_weights(self, weights, query_state, memory_state):
    """U[b, h_v, n, m] from W[b, h, n, m]."""
    return attention_spec.mixed_scores(
        weights, self._post_softmax_projection, ("x2w", "m2w"),
        query_state, memory_state, groups=self.num_head_groups,
        mix_heads=attention_math.mix_heads,
        dynamic_mix=attention_math.dynamic_mix)

  def gate_shape(self):
    return self.num_value_heads, self.value_dim

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    # The kernel of this call (thattn.kernels.dispatch chooses): a fused
    # core (thattn's Pallas kernel for talking heads, cuDNN or Keras's
    # dot_product_attention for multi-head attention), or the plain core
    # below, with or without a fused softmax.
    static_projections = fused.projections(self)
    mixes_heads = any(p is not None for p in static_projections)
    call = dispatch.Call(
        owner=self.name, front=dispatch.KERAS3,
        switch=self.fused_kernel if mixes_heads else flash.setting(self),
        switch_name=self.kernel_switch,
        query=query_state["query"], key=memory_state["key"],
        value=memory_state["value"], projections=static_projections,
        dynamic=self.dynamic_terms(query_state, memory_state),
        head_groups=self.num_head_groups, num_heads=self.num_heads,
        mask=mask, bias=position_bias, causal_offset=causal_offset,
        dropout=self.dropout, training=training, need_scores=need_scores)
    choice = dispatch.choose(call)
    if choice.kernel == dispatch.PALLAS:
      return fused.pallas_context(query_state, memory_state,
                                  static_projections, mask, position_bias,
                                  causal_offset), None
    if choice.kernel in (dispatch.CUDNN, dispatch.DOT_PRODUCT_ATTENTION):
      return flash.multi_head_context(choice.kernel, self, query_state,
                                      memory_state, mask, position_bias,
                                      causal_offset), None
    return self.plain_attend(query_state, memory_state, mask, position_bias,
                             training, causal_offset,
                             softmax_kernel=choice.kernel, call=call)

  def plain_attend(self, query_state, memory_state, mask, position_bias,
                   training, causal_offset, softmax_kernel=dispatch.OPS,
                   call=None):
    """`attend` without a fused core: J, then the hooks `mix_logits` and
    `mix_weights` around the softmax, or in their place the fused softmax
    `softmax_kernel` (dispatch.CPU_OP or XLA_FFI: thattn.keras3.fused),
    which takes P_l, P_w and the dynamic terms of `call`, the
    `dispatch.Call` that chose it."""
    dots = ops.einsum(attention_spec.DOT_PRODUCT, query_state["query"],
                      memory_state["key"])
    _, _, query_length, memory_length = ops.shape(dots)
    mask = self.full_mask(mask, causal_offset, query_length, memory_length)
    if softmax_kernel in (dispatch.CPU_OP, dispatch.XLA_FFI):
      value_weights = fused.value_weights(
          softmax_kernel, dots, call.projections, mask, position_bias,
          call.dynamic)
    else:
      logits = self.mix_logits(dots, query_state, memory_state)
      weights = ops.cast(
          attention_math.masked_softmax(logits, mask, position_bias),
          self.compute_dtype)
      value_weights = self.mix_weights(weights, query_state, memory_state)
    context = ops.einsum(attention_spec.WEIGHTED_VALUES,
                         self.dropout_weights(value_weights, training),
                         memory_state["value"])
    return context, value_weights

  def get_config(self):
    return dict(super().get_config(), key_dim=self.key_dim,
                value_dim=self.value_dim, use_bias=self.use_bias,
                bias_initializer=keras.saving.serialize_keras_object(
                    self.bias_initializer),
                **attention_spec.projected_options_config(self))


@keras.saving.register_keras_serializable(package="thattn")
class MultiHeadAttention(ProjectedAttention):
  """Multi-head attention (Vaswani et al., 2017) as a Keras 3 layer, with
  the arguments of `keras.layers.MultiHeadAttention` (positional in
  tf_keras's order; Keras 3's own by keyword) and the weights of
  `thattn.layers.MultiHeadAttention`. The paper's defaults
  differ from Keras's: no biases, and the 1/sqrt(d_k) folded into P_q's
  initializer (docs/keras3.md).

  Args:
    num_heads: h.
    key_dim: d_k.
    value_dim: d_v; defaults to key_dim.
    dropout: dropout on the attention weights (alias: dropout_rate).
    use_bias: biases on P_q, P_k, P_v and P_o.
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    attention_axes: None or (1,) only: attention over the sequence axis.
    kernel_initializer: for P_q (times d_k**-0.5), P_k, P_v and P_o.
    bias_initializer: for the biases.
    kernel_regularizer, bias_regularizer, activity_regularizer: as in Keras.
    kernel_constraint, bias_constraint: as in Keras.
    query_chunk_size: accepted only as None, so that a `thattn.layers`
      config loads.
    flash_attention: None (default: Keras's global setting, else on a GPU
      or TPU cuDNN or `keras.ops.dot_product_attention`, and on a CPU
      thattn's keras.ops core, measured faster there), True (a fused
      kernel, or an error saying why not) or False (the keras.ops core,
      which also returns the scores and applies dropout);
      `thattn.kernels.dispatch` chooses, `thattn.keras3.flash` runs it.
    num_key_value_heads: h_kv, the heads P_k and P_v project to, shared
      by groups of the key and value heads (grouped-query attention, as
      `keras.layers.GroupQueryAttention`'s and Llama's); must divide
      h. Defaults to h (none shared).
    rotary_base: turns on rotary position embeddings (RoFormer; Llama's
      and GPT-NeoX's): Q and K turned by position before the logits, a
      call's rows at [0, n) and [0, m), or from the decoding step on (the
      cache keeps the turned keys), with frequencies base^(-2r / rotated)
      (10000.0 in RoFormer and GPT-NeoX, 500000.0 in Llama 3;
      `thattn.ops.rotary`). None (the default): no positions here.
    rotary_pct: the leading fraction of each head that turns (GPT-NeoX's
      rotary_pct; Pythia 0.25); 1.0 by default.
    rotary_scaling: None or Llama 3.1 and 3.2's frequency scaling, a dict
      of `thattn.ops.rotary.Llama3Scaling`'s fields (a Hugging Face
      `rope_scaling` of rope_type "llama3" reads as is).
    query_key_norm_epsilon: None (the default) or an epsilon: Q and K
      RMS-normalized over d_k, head by head, each with a learned scale
      [d_k] (`query_norm`, `key_norm`; Qwen3's and DCFormer's q/k norm),
      before the rotation; the queries' scale starts at d_k**-0.5, the
      logits' scale, which the norm would undo in P_q.
    use_gate, sliding_window, seed: as in `keras.layers.MultiHeadAttention`.
  """

  def __init__(self, num_heads, key_dim, value_dim=None, dropout=0.0,
               use_bias=False, output_shape=None, attention_axes=None,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               kernel_regularizer=None, bias_regularizer=None,
               activity_regularizer=None, kernel_constraint=None,
               bias_constraint=None, query_chunk_size=None, *,
               flash_attention=None, **kwargs):
    owner = kwargs.get("name") or "MultiHeadAttention"
    attention_spec.check_attention_axes(owner, attention_axes)
    _refuse_query_chunks(kwargs.get("name"), query_chunk_size)
    flash.check_dropout(owner, _checked_switch(owner, "flash_attention",
                                               flash_attention),
                        dropout or kwargs.get("dropout_rate"))
    super().__init__(num_heads, num_heads, num_heads, key_dim,
                     value_dim=value_dim, dropout=dropout, use_bias=use_bias,
                     output_shape=output_shape,
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer,
                     kernel_regularizer=kernel_regularizer,
                     bias_regularizer=bias_regularizer,
                     activity_regularizer=activity_regularizer,
                     kernel_constraint=kernel_constraint,
                     bias_constraint=bias_constraint, **kwargs)
    self.flash_attention = flash_attention

  @property
  def _flash_attention(self):
    """keras.layers.MultiHeadAttention's resolved setting (its name)."""
    return flash.setting(self)

  def get_config(self):
    config = super().get_config()
    config["num_heads"] = self.num_heads
    config["flash_attention"] = self.flash_attention
    return config


@keras.saving.register_keras_serializable(package="thattn")
class TalkingHeadsAttention(ProjectedAttention):
  """Talking-heads attention (Shazeer et al., 2020) as a Keras 3 layer:
  learned projections across the heads dimension, P_l[h_k, h] just before
  the softmax and P_w[h, h_v] just after it, on TensorFlow, JAX and
  PyTorch. It holds the weights of `thattn.layers.TalkingHeadsAttention`
  under the same names, so the two exchange them (`get_weights`,
  checkpoints).

  Args:
    num_heads: h, the heads of the logits and the softmax.
    key_dim: d_k. Not tied to d_model / h (`fixed_head_size_attention`).
    value_dim: d_v; defaults to key_dim.
    num_key_heads: h_k, the heads of the queries and keys; defaults to h.
    num_value_heads: h_v, the heads of the values; defaults to h.
    project_logits: learn P_l[h_k, h]. False needs h_k == h.
    project_weights: learn P_w[h, h_v]. False needs h == h_v. With both
      False the layer is multi-head attention.
    dynamic_projections: any subset of ("x2l", "m2l", "x2w", "m2w"): the
      input-dependent terms P_Xl, P_Ml, P_Xw, P_Mw of the paper's Appendix
      A (m2l from the key input, m2w from the value input).
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    use_bias: biases on P_q, P_k, P_v and P_o (the paper has none).
    dropout: dropout on U, the weights applied to the values (alias:
      dropout_rate).
    kernel_initializer: for P_q (times d_k**-0.5: the scaled dot product's
      factor, folded into P_q, never applied at run time), P_k, P_v, P_o.
    bias_initializer: for the biases.
    talking_heads_initializer: for P_l and P_w; defaults to a normal with
      stddev 1/sqrt(fan_in), as Mesh TensorFlow's.
    num_head_groups: G, dividing h_k, h and h_v: P_l, P_w and the dynamic
      projections become block-diagonal, stored as their G blocks
      (P_l[G, h_k/G, h/G], ...); 1, the default, is the paper's layer.
    query_chunk_size: accepted only as None, so that a `thattn.layers`
      config loads (the chunked core is tf_keras's).
    fused_kernel: None (default) computes the core with thattn's kernels
      wherever they apply (the fused CPU softmax on TensorFlow and JAX,
      the Pallas kernel on a GPU where it was measured faster), False
      never, True always (a ValueError names why one cannot run);
      `thattn.kernels.dispatch` chooses, and says where each runs.
    flash_attention: Keras 3's name for fused_kernel (talking heads is not
      a dot-product attention, so no backend flash kernel computes it);
      give one or the other.
    num_key_value_heads: h_kv, the heads P_k and P_v project to, shared
      by groups of the key and value heads (grouped-query attention, as
      `keras.layers.GroupQueryAttention`'s and Llama's); must divide
      h_k and h_v. Defaults to h_k for K and h_v for V (none shared).
    rotary_base: turns on rotary position embeddings (RoFormer; Llama's
      and GPT-NeoX's): Q and K turned by position before the logits, a
      call's rows at [0, n) and [0, m), or from the decoding step on (the
      cache keeps the turned keys), with frequencies base^(-2r / rotated)
      (10000.0 in RoFormer and GPT-NeoX, 500000.0 in Llama 3;
      `thattn.ops.rotary`). None (the default): no positions here.
    rotary_pct: the leading fraction of each head that turns (GPT-NeoX's
      rotary_pct; Pythia 0.25); 1.0 by default.
    rotary_scaling: None or Llama 3.1 and 3.2's frequency scaling, a dict
      of `thattn.ops.rotary.Llama3Scaling`'s fields (a Hugging Face
      `rope_scaling` of rope_type "llama3" reads as is).
    query_key_norm_epsilon: None (the default) or an epsilon: Q and K
      RMS-normalized over d_k, head by head, each with a learned scale
      [d_k] (`query_norm`, `key_norm`; Qwen3's and DCFormer's q/k norm),
      before the rotation; the queries' scale starts at d_k**-0.5, the
      logits' scale, which the norm would undo in P_q.
    use_gate, sliding_window, seed: as in `keras.layers.MultiHeadAttention`.
    kernel_regularizer, bias_regularizer, activity_regularizer: as in
      Keras; the kernel regularizer also applies to P_l, P_w and the
      dynamic projections.
    kernel_constraint, bias_constraint: as in Keras; the kernel constraint
      also applies to P_l, P_w and the dynamic projections.
  """

  def __init__(self, num_heads, key_dim, value_dim=None, num_key_heads=None,
               num_value_heads=None, project_logits=True,
               project_weights=True, dynamic_projections=(),
               output_shape=None, use_bias=False, dropout=0.0,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               talking_heads_initializer=None, num_head_groups=1,
               query_chunk_size=None, fused_kernel=None, *,
               flash_attention=None, **kwargs):
    _refuse_query_chunks(kwargs.get("name"), query_chunk_size)
    owner = kwargs.get("name") or "TalkingHeadsAttention"
    kernel_switch, fused_kernel = attention_spec.resolve_alias(
        owner,
        ("fused_kernel", _checked_switch(owner, "fused_kernel",
                                         fused_kernel)),
        ("flash_attention", _checked_switch(owner, "flash_attention",
                                            flash_attention)), None)
    num_key_heads, num_heads, num_value_heads = attention_spec.checked_heads(
        num_heads, num_key_heads, num_value_heads, project_logits,
        project_weights)
    super().__init__(num_key_heads, num_heads, num_value_heads, key_dim,
                     value_dim=value_dim, output_shape=output_shape,
                     use_bias=use_bias, dropout=dropout,
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer, **kwargs)
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
        keras.initializers.get(talking_heads_initializer))
    self.fused_kernel = fused_kernel
    self.kernel_switch = kernel_switch  # the name the user gave, for errors

  @property
  def attention_scores_heads(self):
    return self.num_value_heads

  @property
  def flash_attention(self):
    """Keras 3's name for `fused_kernel` (thattn.keras3.flash)."""
    return self.fused_kernel

  def _projection_initializer(self, fan_in):
    if self.talking_heads_initializer is not None:
      return self.talking_heads_initializer
    return keras.initializers.RandomNormal(stddev=fan_in ** -0.5)

  def create_weights(self, query_width, key_width, value_width):
    # P_l and P_w first, then the projections, then the dynamic ones in
    # name order: thattn.layers' weight order, so get_weights lines up.
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
    super().create_weights(query_width, key_width, value_width)
    widths = {"x2l": query_width, "m2l": key_width,
              "x2w": query_width, "m2w": value_width}
    generators = (attention_spec.DYNAMIC_GENERATORS
                  if self.num_head_groups == 1 else
                  attention_spec.GROUPED_DYNAMIC_GENERATORS)
    self._dynamic_dense = {}
    for name in sorted(self.dynamic_projections):
      kind = name[-1]  # "l" or "w"
      shape, axes = shapes.static(kind)
      scale = attention_spec.DYNAMIC_INIT_SCALE
      layer = keras.layers.EinsumDense(
          generators[name], output_shape=(None, *shape),
          kernel_initializer=keras.initializers.RandomNormal(
              stddev=scale * (widths[name] * shapes.fan_in(kind)) ** -0.5),
          kernel_regularizer=self.kernel_regularizer,
          kernel_constraint=self.kernel_constraint,
          dtype=self.dtype_policy, name=name)
      self._dynamic_dense[name] = self.add_axes_sublayer(
          layer, (None, None, widths[name]),
          {"kernel": (dims.D_MODEL,) + axes})

  def get_config(self):
    initializer = self.talking_heads_initializer
    return dict(super().get_config(),
                **attention_spec.talking_heads_config(self),
                talking_heads_initializer=(
                    None if initializer is None else
                    keras.saving.serialize_keras_object(initializer)))


def _checked_switch(owner, name, value):
  """`value` if it is None, True or False."""
  if value is not None and not isinstance(value, bool):
    raise ValueError(f"{owner}: `{name}` must be None, True or False. "
                     f"Received: {name}={value!r}")
  return value


def _refuse_query_chunks(name, query_chunk_size):
  """thattn.layers' query chunking has no Keras 3 counterpart yet."""
  if query_chunk_size is not None:
    raise ValueError(
        f"{name or 'thattn.keras3'}: query_chunk_size={query_chunk_size!r} "
        "is a thattn.layers (tf_keras) option; the Keras 3 layers compute "
        "all queries at once, so leave it None.")
