"""The Keras 3 attention layer base: masks, caches, building, configs.

The Keras 3 counterpart of `thattn.layers.base.AttentionLayer`, written
with `keras.ops` so it runs on the TensorFlow, JAX and PyTorch backends.
A variant says three things:
- how the queries X[b, n, d_X] become per-query tensors (`project_query`),
- how the memory M[b, m, d_M] becomes per-memory tensors (`project_memory`),
- how those produce the output Y[b, n, d_Y] (`attend`).

Constructor, call and weights are `thattn.layers`' (tf_keras's positional
call order and names; weights with the same names, shapes and order), so
`set_weights(tf_keras_layer.get_weights())` carries a layer across.
Keras 3 conventions where they differ: the build is
`build(query_shape, value_shape, key_shape=None)` (recorded by Keras in the
build config), and Keras implicit masks arrive as `query_mask`,
`value_mask` and `key_mask`, as in `keras.layers.MultiHeadAttention`.
"""

import keras
from keras import ops

from thattn import attention_spec
from thattn import validation
from thattn.keras3 import attention_math


class AttentionLayer(keras.layers.Layer):
  """Base class; subclasses implement `create_weights`, `project_query`,
  `project_memory` and `attend` (see the module docstring).

  Call:
    layer(query, value, key=None, attention_mask=None,
          return_attention_scores=False, training=None,
          use_causal_mask=False, *, position_bias=None, cache=None,
          decode_step=None)

  as `thattn.layers.AttentionLayer`: `attention_mask` is boolean or 0/1,
  broadcastable to [b, n, m]; `position_bias` is added to the logits
  L[b, h, n, m]; `cache` / `decode_step` decode incrementally
  (`initial_cache`, `memory_cache`). Returns Y, or (Y, scores), and the
  cache last whenever one was passed in.
  """

  def __init__(self, output_shape=None, dropout=0.0,
               kernel_initializer="glorot_uniform", kernel_regularizer=None,
               bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, bias_constraint=None, *,
               output_dim=None, dropout_rate=None, **kwargs):
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
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
    self.bias_regularizer = keras.regularizers.get(bias_regularizer)
    self.kernel_constraint = keras.constraints.get(kernel_constraint)
    self.bias_constraint = keras.constraints.get(bias_constraint)
    self._dropout_layer = keras.layers.Dropout(dropout,
                                               dtype=self.dtype_policy)
    self._axes_by_path = {}
    self.supports_masking = True

  # ---- hooks --------------------------------------------------------------
  def create_weights(self, query_width, key_width, value_width):
    raise NotImplementedError

  def project_query(self, query):
    raise NotImplementedError

  def project_memory(self, key, value):
    raise NotImplementedError

  def attend(self, query_state, memory_state, mask, position_bias, training,
             causal_offset, need_scores=True):
    """(Y, scores); `need_scores` False lets a kernel that never forms the
    scores return None for them."""
    raise NotImplementedError

  @property
  def attention_scores_heads(self):
    """The heads of the returned scores (talking heads: h_v)."""
    return self.num_heads

  # ---- weights and their logical axes -------------------------------------
  def add_axes_weight(self, name, shape, axes, initializer):
    """`add_weight` for a kernel, recording its logical axes."""
    variable = self.add_weight(name=name, shape=tuple(shape),
                               initializer=fresh(initializer),
                               regularizer=self.kernel_regularizer,
                               constraint=self.kernel_constraint)
    self._axes_by_path[variable.path] = tuple(axes)
    return variable

  def add_axes_sublayer(self, layer, input_shape, axes_by_weight):
    """Builds a sublayer and records the logical axes of its weights."""
    layer.build(input_shape)
    for variable in layer.weights:
      self._axes_by_path[variable.path] = tuple(axes_by_weight[variable.name])
    return layer

  @property
  def logical_axes(self):
    """{variable path: logical axes tuple} for every weight of the layer."""
    return dict(self._axes_by_path)

  # ---- building -----------------------------------------------------------
  def build(self, query_shape, value_shape, key_shape=None):
    key_shape = value_shape if key_shape is None else key_shape
    for name, shape in (("query", query_shape), ("value", value_shape),
                        ("key", key_shape)):
      if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"{self.name}: {name} must have shape [batch, length, width] "
            f"with a known width, got {tuple(shape)}.")
    self._widths = {"query": query_shape[-1], "key": key_shape[-1],
                    "value": value_shape[-1]}
    distribution = keras.distribution.distribution()
    if distribution is None:
      self.create_weights(query_shape[-1], key_shape[-1], value_shape[-1])
      return
    try:
      self.create_weights(query_shape[-1], key_shape[-1], value_shape[-1])
    except ValueError as error:
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
    state = self.project_memory(probe, probe)
    return {name: ops.zeros((batch_size, max_length) + tuple(t.shape[2:]),
                            t.dtype) for name, t in state.items()}

  def memory_cache(self, value, key=None):
    """The projected memory for cross-attention decoding, computed once."""
    key = value if key is None else key
    return self.project_memory(self._cast(key), self._cast(value))

  # ---- call ---------------------------------------------------------------
  def call(self, query, value=None, key=None, attention_mask=None,
           return_attention_scores=False, training=None,
           use_causal_mask=False, *, query_mask=None, value_mask=None,
           key_mask=None, position_bias=None, cache=None, decode_step=None):
    if value is None and cache is None:
      raise ValueError(f"{self.name}: `value` (the memory) is required unless "
                       "a cross-attention `cache` is given.")
    if decode_step is not None and cache is None:
      raise ValueError(f"{self.name}: decode_step={decode_step!r} needs a "
                       "cache; create one with `initial_cache`.")
    if key is value:
      key_mask = None  # counted once, as in tf_keras
    query = self._cast(query)
    value = self._cast(value)
    key = value if key is None else self._cast(key)
    self._check_inputs(query, key, value)
    query_state = self.project_query(query)
    query_offset = 0
    if cache is None:
      memory_state = self.project_memory(key, value)
    elif decode_step is None:
      memory_state = cache  # cross-attention: the memory was projected once
      value_mask = key_mask = None
    else:
      new_state = self.project_memory(key, value)
      memory_state = {name: attention_math.write_positions(
          cache[name], new_state[name], decode_step) for name in cache}
      query_offset = decode_step
      use_causal_mask = True  # later cache slots are still empty
      value_mask = key_mask = None
    mask = self._combined_mask(attention_mask, query_mask, value_mask,
                               key_mask)
    causal_offset = query_offset if use_causal_mask else None
    output, scores = self.attend(query_state, memory_state, mask,
                                 position_bias, training, causal_offset,
                                 need_scores=return_attention_scores)
    results = (output, scores) if return_attention_scores else (output,)
    if cache is not None:
      results += (memory_state,)
    return results[0] if len(results) == 1 else results

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

  def _combined_mask(self, attention_mask, query_mask, value_mask, key_mask):
    """The non-causal masks as one boolean [b, 1, n, m]-broadcastable mask."""
    masks = []
    if attention_mask is not None:
      attention_mask = ops.convert_to_tensor(attention_mask)
      if len(attention_mask.shape) != 3:
        raise ValueError(
            f"{self.name}: attention_mask has shape "
            f"{tuple(attention_mask.shape)}, expected [batch, query_length, "
            "memory_length] (dimensions of size 1 broadcast).")
      masks.append(ops.cast(attention_mask, "bool"))
    if query_mask is not None:
      masks.append(ops.expand_dims(ops.cast(query_mask, "bool"), 2))
    for memory_mask in (value_mask, key_mask):
      if memory_mask is not None:
        masks.append(ops.expand_dims(ops.cast(memory_mask, "bool"), 1))
    mask = attention_math.combine_masks(*masks)
    return None if mask is None else ops.expand_dims(mask, 1)  # heads axis

  def full_mask(self, mask, causal_offset, query_length, memory_length):
    """`mask` AND the causal mask: boolean [b or 1, 1, n or 1, m], or None."""
    if causal_offset is None:
      return mask
    causal = attention_math.causal_mask(query_length, memory_length,
                                        causal_offset)
    return attention_math.combine_masks(
        mask, ops.reshape(causal, (1, 1, query_length, memory_length)))

  def dropout_weights(self, weights, training):
    return self._dropout_layer(weights, training=training)

  def compute_output_shape(self, query_shape, value_shape, key_shape=None):
    """Y's shape [b, n, d_Y] (keras.layers.MultiHeadAttention's signature)."""
    del value_shape, key_shape  # Y follows the queries
    return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

  def compute_output_spec(self, query, value=None, key=None,
                          attention_mask=None, return_attention_scores=False,
                          training=None, use_causal_mask=False, **kwargs):
    """Symbolic outputs for the functional API, as `call` returns them."""
    del key, attention_mask, training, use_causal_mask
    cache = kwargs.get("cache")
    output = keras.KerasTensor(
        self.compute_output_shape(query.shape, None), self.compute_dtype)
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
        "kernel_initializer": serialize(self.kernel_initializer),
        "kernel_regularizer": serialize(self.kernel_regularizer),
        "bias_regularizer": serialize(self.bias_regularizer),
        "activity_regularizer": serialize(self.activity_regularizer),
        "kernel_constraint": serialize(self.kernel_constraint),
        "bias_constraint": serialize(self.bias_constraint),
    })
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


def fresh(initializer):
  """A new instance of `initializer`, so no two weights share one (an
  unseeded Keras initializer instance may return the same values twice)."""
  if initializer is None:
    return None
  initializer = keras.initializers.get(initializer)
  return initializer.__class__.from_config(initializer.get_config())


@keras.saving.register_keras_serializable(package="thattn")
class ScaledInitializer(keras.initializers.Initializer):
  """Another initializer's samples times a constant: P_q starts as
  `kernel_initializer * d_k**-0.5`, the 1/sqrt(d_k) never applied at run
  time (as `thattn.layers.ScaledInitializer`)."""

  def __init__(self, initializer, scale):
    self.initializer = keras.initializers.get(initializer)
    self.scale = float(scale)

  def __call__(self, shape, dtype=None):
    return fresh(self.initializer)(shape, dtype=dtype) * self.scale

  def get_config(self):
    return {"initializer":
                keras.saving.serialize_keras_object(self.initializer),
            "scale": self.scale}

  @classmethod
  def from_config(cls, config):
    return cls(keras.saving.deserialize_keras_object(config["initializer"]),
               config["scale"])
