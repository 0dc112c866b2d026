"""The Keras 3 attention layer base: masks, caches, gates, building, configs.

The Keras 3 counterpart of `thattn.layers.base.AttentionLayer`, written
with `keras.ops` so it runs on the TensorFlow, JAX and PyTorch backends.
A variant says three things:
- how the queries X[b, n, d_X] become per-query tensors (`project_query`),
- how the memory M[b, m, d_M] becomes per-memory tensors (`project_memory`),
- how those produce the per-head context O[b, n, heads, d] (`attend`),
  which `project_output` turns into Y[b, n, d_Y] (`_output_dense`).

Constructor, call and weights are `thattn.layers`' (tf_keras's positional
call order and names; weights with the same names, shapes and order), so
`set_weights(tf_keras_layer.get_weights())` carries a layer across. On top,
keras.layers.MultiHeadAttention's (Keras 3.15) conventions:
- `query_dense`, `key_dense`, `value_dense`, `output_dense` (and `gate_dense`)
  are the projections, EinsumDense layers, so `enable_lora(rank)` and
  `quantize(mode)` work on them as on Keras's layer;
- `use_gate`: O is multiplied by sigmoid(X P_g) [b, n, heads, d] before the
  output projection (with thattn's `headwise_gate`, by sigmoid(X P_g)
  [b, n, heads], one gate per head: `thattn.ops.output_gate`);
  `sliding_window`: one more mask (`thattn.keras3.masks`);
- masks of rank 2, 3 and 4; Keras implicit masks (`query_mask`,
  `value_mask`, `key_mask`) folded into the attention mask and cleared
  before the projections;
- `_compute_attention(query, key, value, attention_mask=None, training=None,
  return_attention_scores=False)` is the core every variant goes through and
  the one override point (`thattn.keras3.conventions`);
- the build is `build(query_shape, value_shape, key_shape=None)` and
  `compute_output_shape` checks the shapes as Keras does.
"""

import keras
from keras import ops

from thattn.core import attention_spec
from thattn.core import validation
from thattn.keras3 import attention_math
from thattn.keras3 import conventions
from thattn.keras3 import initializers
from thattn.keras3 import masks
from thattn.ops import output_gate


class AttentionLayer(keras.layers.Layer):
  """Base class; subclasses implement `create_weights`, `project_query`,
  `project_memory` and `attend` (see the module docstring).

  Call::

    layer(query, value, key=None, attention_mask=None,
          return_attention_scores=False, training=None,
          use_causal_mask=False, *, position_bias=None, cache=None,
          decode_step=None)

  as `thattn.layers.AttentionLayer`: `attention_mask` is boolean or 0/1, of
  rank 2 [n, m], 3 [b, n, m] or 4 [b, h, n, m] (Keras's broadcasting);
  `position_bias` is added to the logits L[b, h, n, m]; `cache` /
  `decode_step` decode incrementally (`initial_cache`, `memory_cache`).
  Returns Y, or (Y, scores), and the cache last whenever one was passed in.
  """

  def __init__(self, output_shape=None, dropout=0.0,
               kernel_initializer="glorot_uniform", kernel_regularizer=None,
               bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, bias_constraint=None, *,
               output_dim=None, dropout_rate=None, use_gate=False,
               headwise_gate=False, sliding_window=None, seed=None,
               **kwargs):
    super().__init__(activity_regularizer=activity_regularizer, **kwargs)
    output_name, output_shape = attention_spec.resolve_alias(
        self.name, ("output_shape", output_shape), ("output_dim", output_dim),
        None)
    dropout_name, dropout = attention_spec.resolve_alias(
        self.name, ("dropout", dropout), ("dropout_rate", dropout_rate), 0.0)
    self.output_dim = validation.positive_int(
        output_name, attention_spec.output_width(self.name, output_shape),
        optional=True)
    self.dropout = validation.rate(dropout_name, dropout)
    self.use_gate, self.headwise_gate = attention_spec.checked_gate(
        self.name, use_gate, headwise_gate)
    self.sliding_window = masks.check_window(self.name, sliding_window)
    self.seed = seed
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
    self.bias_regularizer = keras.regularizers.get(bias_regularizer)
    self.kernel_constraint = keras.constraints.get(kernel_constraint)
    self.bias_constraint = keras.constraints.get(bias_constraint)
    self._dropout_layer = keras.layers.Dropout(dropout, seed=seed,
                                               dtype=self.dtype_policy)
    self._axes_by_path = {}
    # The initializer of each weight add_axes_weight makes (its sublayers
    # keep theirs as Keras layers do, `kernel_initializer`): a run's seeded
    # initial weights are drawn from them (thattn.keras3.models.
    # initial_weights).
    self._initializer_by_path = {}
    self._gate_dense = None
    self.supports_masking = True

  # ---- hooks --------------------------------------------------------------
  def create_weights(self, query_width, key_width, value_width):
    raise NotImplementedError

  def project_query(self, query):
    raise NotImplementedError

  def project_memory(self, key, value):
    raise NotImplementedError

  def with_positions(self, state, offset):
    """A query or memory state with its positions applied, those of its
    rows being offset + [0, length) (a decoding step's offset; a cache
    holds the memory so): the same here; layers with rotary position
    embeddings turn the queries and keys."""
    del offset  # no positions here
    return state

  def cached_memory_state(self, memory_state):
    """The memory state a decoding cache keeps, from one `project_memory`
    made (and `with_positions` turned), in the same [b, m, ...] layout:
    the same here; DCMHA keeps each key's head-mixing matrix in place of
    the factors it was made from."""
    return memory_state

  def repeat_shared_heads(self, memory_state):
    """The memory state `attend` reads, from the one `project_memory` made
    (and a decoding cache holds): the same here; layers whose K and V heads
    are shared by several query heads repeat them."""
    return memory_state

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    """(O[b, n, heads, d], scores) before the output projection;
    `need_scores` False lets a kernel that never forms the scores return
    None for them."""
    raise NotImplementedError

  def gate_shape(self):
    """(heads, d) of O, which the gate multiplies (all of its d, or each of
    them)."""
    raise NotImplementedError

  def create_query_key_norms(self):
    """The weights of the queries' and keys' norms, made after the
    variant's own weights and before the gate (the same order on both
    fronts); none here: projected layers make them (`query_key_norm_
    epsilon`)."""

  def project_output(self, context):
    """Y[b, n, d_Y] from O (the output projection)."""
    return self._output_dense(context)

  @property
  def attention_scores_heads(self):
    """The heads of the returned scores (h_v for talking heads)."""
    return self.num_heads

  # ---- the projections, as keras.layers.MultiHeadAttention names them ------
  @property
  def query_dense(self):
    return getattr(self, "_query_dense", None)

  @property
  def key_dense(self):
    return getattr(self, "_key_dense", None)

  @property
  def value_dense(self):
    return getattr(self, "_value_dense", None)

  @property
  def output_dense(self):
    return getattr(self, "_output_dense", None)

  @property
  def gate_dense(self):
    return self._gate_dense

  @property
  def _sliding_window(self):
    """keras.layers.MultiHeadAttention's name for `sliding_window`."""
    return self.sliding_window

  def enable_lora(self, rank, lora_alpha=None, a_initializer="he_uniform",
                  b_initializer="zeros",
                  projections=("query", "key", "value", "output")):
    """LoRA on the named projections, as `query_dense.enable_lora(rank)`
    on each (Keras's EinsumDense LoRA: the kernel frozen, trainable factors
    [.., rank] and [rank, ..], the second zero so the outputs start
    unchanged); `rank` and `lora_alpha` checked first. P_l and P_w stay
    trainable."""
    conventions.enable_lora(self, rank, lora_alpha, a_initializer,
                            b_initializer, projections)

  def quantize(self, mode=None, type_check=True, config=None):
    """Quantizes the projections (every EinsumDense sublayer) in `mode`, as
    `Model.quantize` does; P_l and P_w stay as they are, in the layer's
    dtype and trainable. The config then carries the quantized policies
    (`conventions.quantized_policies`) so a saved model reloads."""
    for layer in conventions.projections(self):
      layer.quantize(mode, type_check=type_check, config=config)
    self._is_quantized = True

  # ---- weights and their logical axes -------------------------------------
  def add_axes_weight(self, name, shape, axes, initializer):
    """`add_weight` for a kernel, recording its logical axes."""
    variable = self.add_weight(name=name, shape=tuple(shape),
                               initializer=initializers.fresh(initializer),
                               regularizer=self.kernel_regularizer,
                               constraint=self.kernel_constraint)
    self._axes_by_path[variable.path] = tuple(axes)
    self._initializer_by_path[variable.path] = initializer
    return variable

  def add_axes_sublayer(self, layer, input_shape, axes_by_weight):
    """Builds a sublayer and records the logical axes of its weights (a
    quantized projection's scales and LoRA factors have none: replicated)."""
    layer.build(input_shape)
    for variable in layer.weights:
      if variable.name in axes_by_weight:
        self._axes_by_path[variable.path] = tuple(
            axes_by_weight[variable.name])
    return layer

  def einsum_dense(self, name, equation, output_shape, input_shape, *,
                   initializer, bias_axes=None, activation=None, axes=None):
    """A built projection with the layer's regularizers and constraints;
    `axes` ({"kernel", "bias": logical axes}) defaults to `name`'s in
    `attention_spec.PROJECTION_AXES`."""
    layer = keras.layers.EinsumDense(
        equation, output_shape=output_shape, bias_axes=bias_axes,
        activation=activation,
        kernel_initializer=initializers.fresh(initializer),
        bias_initializer=initializers.fresh(
            getattr(self, "bias_initializer", "zeros")),
        kernel_regularizer=self.kernel_regularizer,
        bias_regularizer=self.bias_regularizer,
        kernel_constraint=self.kernel_constraint,
        bias_constraint=self.bias_constraint,
        dtype=self.dtype_policy, name=name)
    return self.add_axes_sublayer(
        layer, input_shape,
        attention_spec.PROJECTION_AXES[name] if axes is None else axes)

  @property
  def logical_axes(self):
    """{variable path -> logical axes tuple} for every weight of the layer."""
    return dict(self._axes_by_path)

  @property
  def weight_initializers(self):
    """{variable path -> initializer} of the weights the layer makes
    itself (P_l, P_w, a variant's own weights); its projections keep
    theirs (`kernel_initializer`, `bias_initializer`)."""
    return dict(self._initializer_by_path)

  # ---- building -----------------------------------------------------------
  def build(self, query_shape, value_shape, key_shape=None):
    key_shape = value_shape if key_shape is None else key_shape
    attention_spec.check_memory_shapes(self.name, value_shape, key_shape)
    for name, shape in (("query", query_shape), ("value", value_shape),
                        ("key", key_shape)):
      if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"{self.name}: {name} must have shape [batch, length, width] "
            f"with a known width, got {tuple(shape)}.")
    self._widths = {"query": query_shape[-1], "key": key_shape[-1],
                    "value": value_shape[-1]}
    try:
      self.create_weights(query_shape[-1], key_shape[-1], value_shape[-1])
      self.create_query_key_norms()
      if self.use_gate:
        equation, gate_shape, axes, bias_axes = attention_spec.gate_projection(
            *self.gate_shape(), self.headwise_gate)
        self._gate_dense = self.einsum_dense(
            "gate", equation, gate_shape, (None, None, query_shape[-1]),
            initializer=self.kernel_initializer, activation="sigmoid",
            bias_axes=bias_axes if getattr(self, "use_bias", False) else None,
            axes=axes)
    except ValueError as error:
      distribution = keras.distribution.distribution()
      if distribution is None:
        raise
      # The backend's message names an array size and a mesh axis, not the
      # layer, its heads or the rules that asked for the split.
      mesh = distribution.device_mesh
      heads = {name: getattr(self, name) for name in
               ("num_key_heads", "num_heads", "num_value_heads",
                "num_head_groups") if hasattr(self, name)}
      raise ValueError(
          f"{self.name}: its weights could not be laid out on the device "
          f"mesh {dict(zip(mesh.axis_names, mesh.shape))} of the active "
          f"keras.distribution ({error}). Each sharded dimension must be a "
          "multiple of the size of the mesh axis its layout rule names; "
          "this layer has "
          + ", ".join(f"{name}={value}" for name, value in heads.items())
          + " (see thattn.keras3.layout_map).") from error

  # ---- decoding caches ----------------------------------------------------
  def initial_cache(self, batch_size, max_length, dtype=None):
    """An all-zeros self-attention cache for `max_length` decoding steps."""
    if not self.built:
      raise ValueError(f"{self.name}: call or build the layer before asking "
                       "for a cache, so its weights and widths are known.")
    probe = ops.zeros((1, 1, self._widths["value"]),
                      dtype or self.compute_dtype)
    state = self.cached_memory_state(
        self.project_memory(probe, probe))
    return {name: ops.zeros((batch_size, max_length) + tuple(t.shape[2:]),
                            t.dtype) for name, t in state.items()}

  def memory_cache(self, value, key=None):
    """The projected memory for cross-attention decoding, computed once."""
    key = value if key is None else key
    return self.cached_memory_state(self.with_positions(
        self.project_memory(self._cast(key), self._cast(value)), 0))

  # ---- call ---------------------------------------------------------------
  def call(self, query, value=None, key=None, attention_mask=None,
           return_attention_scores=False, training=None,
           use_causal_mask=False, *, query_mask=None, value_mask=None,
           key_mask=None, position_bias=None, cache=None, decode_step=None):
    attention_spec.check_call(self.name, value, cache, decode_step,
                              self.sliding_window)
    if key is value:
      key_mask = None  # counted once, as in Keras
    masks.clear_implicit_masks(query, value, key)
    query = self._cast(query)
    value = self._cast(value)
    key = value if key is None else self._cast(key)
    self._check_inputs(query, key, value)
    gate = None if self._gate_dense is None else self._gate_dense(query)
    decoding = cache is not None and decode_step is not None
    query_offset = decode_step if decoding else 0
    query_state = self.with_positions(self.project_query(query),
                                      query_offset)
    if cache is None:
      memory_state = self.with_positions(self.project_memory(key, value), 0)
    elif decode_step is None:
      memory_state = cache  # cross-attention: the memory was projected once
      value_mask = key_mask = None
    else:
      new_state = self.cached_memory_state(self.with_positions(
          self.project_memory(key, value), decode_step))
      memory_state = {name: attention_math.write_positions(
          cache[name], new_state[name], decode_step) for name in cache}
      use_causal_mask = True  # later cache slots are still empty
      value_mask = key_mask = None
    window = masks.positions_band(
        ops.shape(query)[1], ops.shape(next(iter(memory_state.values())))[1],
        query_offset, window=self.sliding_window)
    mask = masks.combine(
        None if attention_mask is None else masks.attention_mask(
            self.name, attention_mask, self.num_heads),
        masks.implicit_attention_mask(query_mask, value_mask, key_mask),
        window)
    causal_offset = query_offset if use_causal_mask else None
    # The core reads K and V with every head it attends with (a cache keeps
    # them as projected), as Keras's GroupQueryAttention hands them to
    # its `_compute_attention`.
    attended = self.repeat_shared_heads(memory_state)
    if conventions.overrides_compute_attention(self, AttentionLayer):
      context, scores = conventions.override_call(
          self, query_state, attended, mask, position_bias, training,
          causal_offset, return_attention_scores)
    else:
      context, scores = self._compute_attention(
          query_state["query"], attended["key"], attended["value"],
          mask, training, return_attention_scores,
          causal_offset=causal_offset, position_bias=position_bias,
          dynamic_projections=conventions.dynamic_tensors(query_state,
                                                          attended))
    if gate is not None:
      context = output_gate.gated_context(ops, context, gate,
                                          self.headwise_gate)
    output = self.project_output(context)
    results = (output, scores) if return_attention_scores else (output,)
    if cache is not None:
      results += (memory_state,)
    return results[0] if len(results) == 1 else results

  def _compute_attention(self, query, key, value, attention_mask=None,
                         training=None, return_attention_scores=False,
                         use_causal_mask=False, *, causal_offset=None,
                         position_bias=None, dynamic_projections=None):
    """The attention core on projected tensors: Keras's override point.

    Args (Keras's, then thattn's keyword-only extras):
      query, key, value: the projected Q[b, n, h_k, d_k], K[b, m, h_k, d_k],
        V[b, m, h_v, d_v] (general bilinear attention: X P [b, n, h, d_M]
        and the memory M[b, m, d_M] as both key and value).
      attention_mask: boolean, rank 2 [n, m], 3 [b, n, m] or 4 [b, h, n, m].
      training: dropout on the weights when True.
      return_attention_scores: also return the weights U[b, heads, n, m].
      use_causal_mask: AND the causal mask (query i sees keys j <= i).
      causal_offset: the causal mask's offset (a decoding step), implying
        use_causal_mask.
      position_bias: added to the logits L[b, h, n, m].
      dynamic_projections: {name: tensor} of the states' entries beyond Q,
        K and V (talking heads' dynamic projections R, DCMHA's dynamic
        weights).

    Returns:
      (O[b, n, heads, d], the weights or None).
    """
    query_state, memory_state = conventions.states(query, key, value,
                                                   dynamic_projections)
    mask = None if attention_mask is None else masks.attention_mask(
        self.name, attention_mask, self.num_heads)
    if use_causal_mask and causal_offset is None:
      causal_offset = 0
    return self.attend(query_state, memory_state, mask, position_bias,
                       training, causal_offset,
                       need_scores=return_attention_scores)

  def _cast(self, tensor):
    if tensor is None:
      return None
    tensor = ops.convert_to_tensor(tensor)
    if "float" not in str(tensor.dtype):
      return tensor
    return ops.cast(tensor, self.compute_dtype)

  def _check_inputs(self, query, key, value):
    """Widths against the built weights, batch and memory lengths."""
    inputs = {name: tensor for name, tensor in
              (("query", query), ("key", key), ("value", value))
              if tensor is not None}
    for name, tensor in inputs.items():
      width, expected = tensor.shape[-1], self._widths[name]
      if width is not None and width != expected:
        raise ValueError(
            f"{self.name}: built for {name} width {expected}, called with "
            f"a {name} of width {width} (shape {tuple(tensor.shape)}); build "
            "a new layer for the new width.")
    attention_spec.check_lengths(self.name, {
        name: list(tensor.shape) for name, tensor in inputs.items()})

  def full_mask(self, mask, causal_offset, query_length, memory_length):
    """`mask` AND the causal mask: boolean [b or 1, h or 1, n or 1, m], or
    None."""
    if causal_offset is None:
      return mask
    return masks.combine(mask, masks.positions_band(
        query_length, memory_length, causal_offset, causal=True))

  def dropout_weights(self, weights, training):
    return self._dropout_layer(weights, training=training)

  def compute_output_shape(self, query_shape, value_shape, key_shape=None):
    """Y's shape [b, n, d_Y] (keras.layers.MultiHeadAttention's signature
    and checks: key and value agree but for their widths; and the widths
    the layer was built for)."""
    query_shape = tuple(query_shape)
    if value_shape is not None:
      key_shape = value_shape if key_shape is None else key_shape
      attention_spec.check_memory_shapes(self.name, value_shape, key_shape)
    if self.built:
      for name, shape in (("query", query_shape), ("value", value_shape),
                          ("key", key_shape)):
        if shape is not None and shape[-1] not in (None,
                                                   self._widths[name]):
          raise ValueError(
              f"{self.name}: The last dimension of `{name}_shape` must be "
              f"equal to the width the layer was built for, "
              f"{self._widths[name]}. Received: {name}_shape="
              f"{tuple(shape)}")
    return query_shape[:-1] + (self.output_dim or query_shape[-1],)

  def compute_output_spec(self, query, value=None, key=None,
                          attention_mask=None, return_attention_scores=False,
                          training=None, use_causal_mask=False, **kwargs):
    """Symbolic outputs for the functional API, as `call` returns them."""
    del attention_mask, training, use_causal_mask
    cache = kwargs.get("cache")
    output = keras.KerasTensor(
        self.compute_output_shape(
            query.shape, None if value is None else value.shape,
            None if key is None else key.shape), self.compute_dtype)
    results = (output,)
    if return_attention_scores:
      memory = value if cache is None else next(iter(cache.values()))
      results += (keras.KerasTensor(
          (query.shape[0], self.attention_scores_heads, query.shape[1],
           memory.shape[1]), self.compute_dtype),)
    if cache is not None:
      results += ({name: keras.KerasTensor(tensor.shape, tensor.dtype)
                   for name, tensor in cache.items()},)
    return results[0] if len(results) == 1 else results

  def get_config(self):
    config = super().get_config()
    serialize = keras.saving.serialize_keras_object
    config.update({
        "output_shape": self.output_dim,
        "dropout": self.dropout,
        "use_gate": self.use_gate,
        "headwise_gate": self.headwise_gate,
        "sliding_window": self.sliding_window,
        "seed": self.seed,
        "kernel_initializer": serialize(self.kernel_initializer),
        "kernel_regularizer": serialize(self.kernel_regularizer),
        "bias_regularizer": serialize(self.bias_regularizer),
        "activity_regularizer": serialize(self.activity_regularizer),
        "kernel_constraint": serialize(self.kernel_constraint),
        "bias_constraint": serialize(self.bias_constraint),
    })
    policies = conventions.quantized_policies(self)
    if policies is not None:
      config["dtype"] = keras.dtype_policies.serialize(policies)
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    # A thattn.layers (tf_keras) config carries its build shapes; Keras 3
    # keeps them in the build config instead.
    build_shapes = config.pop("build_shapes", None)
    layer = cls(**config)
    if build_shapes:
      layer.build(**build_shapes)
    return layer
