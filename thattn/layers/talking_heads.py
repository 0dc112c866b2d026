"""Talking-heads attention (Shazeer et al., 2020), with dynamic projections.

Computation (per example; letters as in `thattn.core.dims`; Section 4 and
Appendix A of the paper)::

    Q[n, h_k, d_k] = einsum(X[n, d_X], P_q[d_X, h_k, d_k])
    K[m, h_k, d_k] = einsum(M[m, d_M], P_k[d_M, h_k, d_k])
    V[m, h_v, d_v] = einsum(M[m, d_M], P_v[d_M, h_v, d_v])
    J[h_k, n, m]   = einsum(Q[n, h_k, d_k], K[m, h_k, d_k])
    L[h, n, m]     = einsum(J[h_k, n, m], P_l[h_k, h])              # P_l
                   + einsum(J[h_k, n, m], R_Xl[n, h_k, h])          # x2l
                   + einsum(J[h_k, n, m], R_Ml[m, h_k, h])          # m2l
    W[h, n, m]     = softmax(L[h, n, m] + bias, masked, reduced_dim=m)
    U[h_v, n, m]   = einsum(W[h, n, m], P_w[h, h_v])                # P_w
                   + einsum(W[h, n, m], R_Xw[n, h, h_v])            # x2w
                   + einsum(W[h, n, m], R_Mw[m, h, h_v])            # m2w
    O[n, h_v, d_v] = einsum(dropout(U[h_v, n, m]), V[m, h_v, d_v])
    Y[n, d_Y]      = einsum(O[n, h_v, d_v], P_o[h_v, d_v, d_Y])

    with the dynamic projections generated from the inputs:
    R_Xl[n, h_k, h] = einsum(X[n, d_X], P_Xl[d_X, h_k, h])
    R_Ml[m, h_k, h] = einsum(M[m, d_M], P_Ml[d_M, h_k, h])
    R_Xw[n, h, h_v] = einsum(X[n, d_X], P_Xw[d_X, h, h_v])
    R_Mw[m, h, h_v] = einsum(M[m, d_M], P_Mw[d_M, h, h_v])

R_Ml and R_Mw are indexed by memory position m; the paper's pseudocode
writes `n` there, a slip. With `project_logits=False` there is no P_l (so h_k
must equal h), and likewise no P_w with `project_weights=False`; a dynamic
projection is added to its static one, so it needs that projection on.

Grouped talking heads (`num_head_groups=G`; not in the paper, after Mesh
TensorFlow's advice for model parallelism): the heads fall into G groups and
P_l, P_w and the dynamic projections are block-diagonal, so heads talk only
within their group. Heads are group-major: group g holds key heads
[g*h_k/G, (g+1)*h_k/G), softmax heads [g*h/G, (g+1)*h/G) and value heads
[g*h_v/G, (g+1)*h_v/G). Only the blocks are stored, with i, h, j counting
heads within a group and g the group::

    L[g, h, n, m]  = einsum(J[g, i, n, m], P_l[g, i, h])           # P_l
                   + einsum(J[g, i, n, m], R_Xl[n, g, i, h])       # x2l
                   + einsum(J[g, i, n, m], R_Ml[m, g, i, h])       # m2l
    U[g, j, n, m]  = einsum(W[g, h, n, m], P_w[g, h, j])           # P_w
                   + einsum(W[g, h, n, m], R_Xw[n, g, h, j])       # x2w
                   + einsum(W[g, h, n, m], R_Mw[m, g, h, j])       # m2w
    R_Xl[n, g, i, h] = einsum(X[n, d_X], P_Xl[d_X, g, i, h]), and so on.

G=1 is the layer above, with the same weights. With G equal to the size of
the mesh axis that shards the heads (rules "head_groups:model;
key_heads:model;value_heads:model", see `thattn.core.dims`), every group lives
on one device and the attention core needs no communication.
"""

import tf_keras

from thattn.core import attention_spec
from thattn.core import dims
from thattn.layers import initializers
from thattn.layers import projected


@tf_keras.utils.register_keras_serializable(package="thattn")
class TalkingHeadsAttention(projected.ProjectedAttention):
  """Talking-heads attention: learned projections across the heads dimension.

  Args:
    num_heads: h, the heads of the logits and the softmax.
    key_dim: d_k. Not tied to d_model / h: any size works, including the
      sequence length (see `thattn.layers.fixed_head_size`).
    value_dim: d_v; defaults to key_dim.
    num_key_heads: h_k, heads of the queries and keys; defaults to h.
    num_value_heads: h_v, heads of the values; defaults to h.
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
    project_logits: learn P_l[h_k, h]. False needs h_k == h.
    project_weights: learn P_w[h, h_v]. False needs h == h_v.
      With both False the layer is multi-head attention.
    dynamic_projections: any subset of ("x2l", "m2l", "x2w", "m2w"): the
      input-dependent terms P_Xl, P_Ml, P_Xw, P_Mw of Appendix A. m2l is
      generated from the key input and m2w from the value input (both M
      when `key` is not given).
    output_shape: d_Y, an int or a 1-tuple; defaults to the query width
      (alias: output_dim).
    use_bias: biases on P_q, P_k, P_v and P_o (the paper has none).
    dropout: dropout on U, the weights applied to the values (alias:
      dropout_rate).
    kernel_initializer: for P_q (scaled by d_k**-0.5), P_k, P_v and P_o.
    bias_initializer: for the biases.
    talking_heads_initializer: for P_l and P_w; defaults to a normal with
      stddev 1/sqrt(fan_in), as Mesh TensorFlow does.
    kernel_regularizer, bias_regularizer, activity_regularizer: as in
      tf_keras; kernel_regularizer also applies to P_l, P_w and the
      dynamic projections (as Model Garden does for its pre- and
      post-softmax weights).
    kernel_constraint, bias_constraint: as in tf_keras; kernel_constraint
      also applies to P_l, P_w and the dynamic projections (as Model
      Garden does).
    query_chunk_size: if set, compute the attention core in chunks of this
      many queries and recompute the scores in the backward pass
      (`thattn.layers.chunked`): same results, memory about linear in the
      sequence length. Used without `return_attention_scores`, when
      attention dropout is off, and, with dynamic projections, only
      through the fused kernel (the rules, with the kernel's, are
      `thattn.kernels.dispatch`).
    num_head_groups: G, which must divide h_k, h and h_v. P_l, P_w and the
      dynamic projections become block-diagonal (heads mix only within
      their group; see the module docstring for the head order) and are
      stored as their blocks: P_l[G, h_k/G, h/G], P_w[G, h/G, h_v/G],
      P_Xl[d_X, G, h_k/G, h/G] and so on, with logical axes
      (head_groups, key_heads_per_group, heads_per_group, ...). G=1, the
      default, is the paper's layer with weights P_l[h_k, h], P_w[h, h_v].
      G=h with h_k = h = h_v is multi-head attention whose logits and
      weights are scaled by a learned scalar per head.
    fused_kernel: whether J -> L -> W -> U runs as one fused CPU op
      (`thattn.kernels.talking_heads_softmax`: same results to float32
      rounding, faster, and the training step keeps neither L nor W).
      None (default): wherever it can, i.e. float32 (or bfloat16 /
      float16 under mixed precision, computed in float32 inside), on CPU,
      not head groups and dynamic projections together (either alone is
      fused),
      not under XLA, DTensor or SavedModel tracing, and the kernel
      compiled (on first use, needs a C++ compiler); otherwise
      TensorFlow ops. The plain and the
      chunked (`query_chunk_size`) core both use it. False: never. True:
      always, with a ValueError saying why when it cannot.
  """

  def __init__(self, num_heads, key_dim, value_dim=None, num_key_heads=None,
               num_value_heads=None, project_logits=True,
               project_weights=True, dynamic_projections=(),
               output_shape=None, use_bias=False, dropout=0.0,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               talking_heads_initializer=None, query_chunk_size=None,
               num_head_groups=1, fused_kernel=None, **kwargs):
    num_key_heads, num_heads, num_value_heads = attention_spec.checked_heads(
        num_heads, num_key_heads, num_value_heads, project_logits,
        project_weights)
    super().__init__(num_key_heads, num_heads, num_value_heads, key_dim,
                     value_dim=value_dim, output_shape=output_shape,
                     use_bias=use_bias, dropout=dropout,
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer,
                     query_chunk_size=query_chunk_size, **kwargs)
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
        tf_keras.initializers.get(talking_heads_initializer))
    if fused_kernel is not None and not isinstance(fused_kernel, bool):
      raise ValueError(f"fused_kernel must be None, True or False, got "
                       f"{fused_kernel!r}.")
    self.fused_kernel = fused_kernel

  def _projection_initializer(self, fan_in):
    if self.talking_heads_initializer is not None:
      return initializers.fresh(self.talking_heads_initializer)
    return initializers.fan_in_normal(fan_in)

  def create_weights(self, query_width, key_width, value_width):
    super().create_weights(query_width, key_width, value_width)
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
    widths = {"x2l": query_width, "m2l": key_width,
              "x2w": query_width, "m2w": value_width}
    generators = (attention_spec.DYNAMIC_GENERATORS
                  if self.num_head_groups == 1 else
                  attention_spec.GROUPED_DYNAMIC_GENERATORS)
    self._dynamic_dense = {}
    for name in self.dynamic_projections:
      kind = name[-1]  # "l" or "w"
      shape, axes = shapes.static(kind)
      self._dynamic_dense[name] = self.add_axes_sublayer(
          tf_keras.layers.EinsumDense(
              generators[name], output_shape=(None, *shape),
              kernel_initializer=initializers.fan_in_normal(
                  widths[name] * shapes.fan_in(kind),
                  attention_spec.DYNAMIC_INIT_SCALE),
              kernel_regularizer=self.kernel_regularizer,
              kernel_constraint=self.kernel_constraint,
              dtype=self.dtype_policy, name=name),
          [None, None, widths[name]],
          {"kernel": (dims.D_MODEL,) + axes})

  @property
  def attention_scores_heads(self):
    """h_v; the scores returned are U, the weights applied to the values."""
    return self.num_value_heads

  def get_config(self):
    initializer = self.talking_heads_initializer
    return dict(super().get_config(),
                **attention_spec.talking_heads_config(self),
                talking_heads_initializer=(
                    None if initializer is None else
                    tf_keras.initializers.serialize(initializer)))
