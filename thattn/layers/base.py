"""The plumbing every thattn attention layer shares.

An attention variant only says three things (see `AttentionLayer`):
- how the queries X[b, n, d_X] become per-query tensors (`project_query`),
- how the memory M[b, m, d_M] becomes per-memory tensors (`project_memory`),
- how those produce the output Y[b, n, d_Y] (`attend`).

Everything else lives here once: argument checking, boolean and causal masks,
Keras implicit masks, T5-style position bias, the incremental-decoding cache,
lazy weight creation from the first call's shapes, and the logical axes of
every weight.

The decoding cache is simply the dictionary `project_memory` returns, with
the memory axis (axis 1) padded to the maximum decode length. Because every
variant keeps all of its memory-side state in that dictionary (keys, values,
and for dynamic projections R_Ml and R_Mw), caching works the same for all
of them.
"""

import json

import tensorflow as tf
import tf_keras

from thattn.core import attention_spec
from thattn.ops import autograph
from thattn.core import validation
from thattn.layers import attention_ops
from thattn.layers import initializers
from thattn.layers import keras_arguments
from thattn.ops import output_gate
from thattn.ops import tf_ops

# written[b, m, x] = einsum(update[b, s, x], one_hot[s, m]) (attention_spec).


def _write_positions(cache, update, start):
  """Writes `update[b, s, ...]` into `cache[b, m, ...]` at [start, start+s).

  Uses a one-hot contraction rather than a scatter: it is exact (each entry
  is multiplied by 1 or 0 once), keeps static shapes for XLA and tf.function,
  and decoding writes only a step or a few at a time.
  """
  cache_shape = tf.shape(cache)
  flat_cache = tf.reshape(cache, [cache_shape[0], cache_shape[1], -1])
  flat_update = tf.reshape(update, [cache_shape[0], tf.shape(update)[1], -1])
  positions = start + tf.range(tf.shape(update)[1])
  # one_hot[s, m] is 1 where new step s lands on cache position m.
  one_hot = tf.one_hot(positions, cache_shape[1], dtype=cache.dtype)
  keep = 1 - tf.reduce_sum(one_hot, axis=0)
  written = (flat_cache * tf.reshape(keep, [1, -1, 1]) +
             tf.einsum(attention_spec.CACHE_WRITE, flat_update, one_hot))
  return tf.reshape(written, cache_shape)


class AttentionLayer(tf_keras.layers.Layer):
  """Base class: subclasses implement the three hooks below.

  Hooks (public, so subclasses never touch a private method)::

    create_weights(query_width, key_width, value_width)
    project_query(query) -> dict of `[b, n, ...]` tensors
    project_memory(key, value) -> dict of `[b, m, ...]` tensors
    with_positions(state, offset) -> the state, its Q or K turned by position
    cached_memory_state(memory_state) -> what a decoding cache keeps of it
    repeat_shared_heads(memory_state) -> memory_state as `attend` reads it
    attend(query_state, memory_state, mask, position_bias, training,
           causal_offset, need_scores=True)
        -> (O[b, n, heads, d], scores[b, heads, n, m] or None)
    project_output(O) -> Y[b, n, d_Y]

  The same hooks, with the same contracts, as `thattn.keras3`'s layers:
  `attend` stops before the output projection (`need_scores` False lets a
  core that never forms the scores return None for them).

  `mask` excludes the causal part, which comes as `causal_offset` (None, or
  the memory position of the first query), so that an implementation may
  generate it piecewise instead of as an [n, m] tensor; `full_mask` combines
  the two.

  Constructor (shared): `output_shape` (d_Y, an int or a 1-tuple; defaults
  to the query width), `dropout`, `kernel_initializer`, and tf_keras's
  `kernel_regularizer`, `bias_regularizer`, `activity_regularizer`,
  `kernel_constraint`, `bias_constraint`; `output_dim` and `dropout_rate`
  are accepted aliases (see `thattn.layers.keras_arguments`). `use_gate`
  (Keras 3's `keras.layers.MultiHeadAttention` argument; the element-wise
  gate of Qiu et al., 2025) multiplies O by sigmoid(X P_g)[b, n, heads, d]
  before the output projection; with `headwise_gate` by sigmoid(X P_g)[b,
  n, heads], one gate per head (`thattn.ops.output_gate`).
  `sliding_window` (Keras 3's argument): query i attends only memory j
  with abs(i - j) < sliding_window (with the causal mask, the last
  sliding_window keys, its own included; a decoding step's query sits at
  its step).

  Call, in tf_keras.layers.MultiHeadAttention's positional order::

    layer(query, value, key=None, attention_mask=None,
          return_attention_scores=False, training=None,
          use_causal_mask=False, *, position_bias=None, cache=None,
          decode_step=None)

    query: X[b, n, d_X].  value: the memory M[b, m, d_M].  key: defaults to
    value.  attention_mask: broadcastable to [b, n, m], True (or nonzero)
    means "may attend"; 0/1 numbers are cast to bool as tf_keras does.
    Keras implicit masks of query, value and a separate key are combined
    with it. Query, value and key may be RaggedTensors [b, (length), d]:
    densified, their padding masked, and Y ragged again when the query was.
    position_bias: added to the logits L[b, h, n, m] after the
    pre-softmax projection (e.g. `RelativePositionBias`).

    Incremental decoding:
      - self-attention: `cache = layer.initial_cache(batch, max_length)`, then
        `y, cache = layer(x_t, x_t, cache=cache, decode_step=t)`. The new
        steps attend causally to every cached step up to themselves.
      - cross-attention: `cache = layer.memory_cache(memory)`, then
        `y, cache = layer(x_t, None, cache=cache)`; the memory is projected
        only once.

    Returns Y, or (Y, scores) with `return_attention_scores`, and the cache
    last whenever one was passed in.
  """

  def __init__(self, output_shape=None, dropout=0.0,
               kernel_initializer="glorot_uniform", kernel_regularizer=None,
               bias_regularizer=None, activity_regularizer=None,
               kernel_constraint=None, bias_constraint=None, *,
               output_dim=None, dropout_rate=None, use_gate=False,
               headwise_gate=False, sliding_window=None, **kwargs):
    # As in tf_keras.layers.MultiHeadAttention, the activity regularizer
    # applies to the layer's output (Keras's Layer does that).
    super().__init__(activity_regularizer=tf_keras.regularizers.get(
        activity_regularizer), **kwargs)
    # tf_keras's names are canonical; the older thattn names stay accepted
    # (see thattn.layers.keras_arguments).
    output_name, output_shape = attention_spec.resolve_alias(
        self.name, ("output_shape", output_shape), ("output_dim", output_dim),
        None)
    dropout_name, dropout = attention_spec.resolve_alias(
        self.name, ("dropout", dropout), ("dropout_rate", dropout_rate), 0.0)
    # Stored as `output_dim`: Keras layers already have an `output_shape`
    # property (the shape of their output tensor).
    self.output_dim = validation.positive_int(
        output_name, attention_spec.output_width(self.name, output_shape),
        optional=True)
    self.dropout = validation.rate(dropout_name, dropout)
    self.use_gate, self.headwise_gate = attention_spec.checked_gate(
        self.name, use_gate, headwise_gate)
    self.sliding_window = validation.positive_int(
        "sliding_window", sliding_window, optional=True, owner=self.name)
    self.kernel_initializer = tf_keras.initializers.get(kernel_initializer)
    self.kernel_regularizer = tf_keras.regularizers.get(kernel_regularizer)
    self.bias_regularizer = tf_keras.regularizers.get(bias_regularizer)
    self.kernel_constraint = tf_keras.constraints.get(kernel_constraint)
    self.bias_constraint = tf_keras.constraints.get(bias_constraint)
    self._dropout = tf_keras.layers.Dropout(dropout, dtype=self.dtype_policy)
    self._gate_dense = None  # P_g, made after the variant's own weights
    # The shapes the weights were built for, as a JSON string: Keras would
    # track a dict attribute and a SavedModel reload would restore it as
    # empty lists. `get_config` carries them so that `from_config` (which
    # SavedModel and .keras loading call) creates the weights before their
    # values are restored, as tf_keras.layers.MultiHeadAttention does.
    self._build_shapes_json = None
    # Keyed by variable name, not by variable: Keras would treat variables
    # held in a list attribute as this layer's own weights when saving.
    self._axes_by_variable_name = {}
    # The initializer of each weight add_axes_weight makes (its sublayers
    # keep theirs as Keras layers do, `kernel_initializer`): a run's seeded
    # initial weights are drawn from them (thattn.models.initial_weights).
    self._initializer_by_variable_name = {}
    # Keras implicit masks (e.g. from Embedding(mask_zero=True)) are read
    # from the inputs in `call`, as tf_keras.layers.MultiHeadAttention does.
    self.supports_masking = True

  @property
  def dropout_rate(self):
    """The attention dropout rate (the older name of `dropout`)."""
    return self.dropout

  # ---- hooks -------------------------------------------------------------
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
    raise NotImplementedError

  def project_output(self, context):
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

  @staticmethod
  def full_mask(mask, causal_offset, query_length, memory_length):
    """`mask` AND the causal mask: boolean [b or 1, 1, n or 1, m], or None."""
    return attention_ops.full_mask(mask, causal_offset, query_length,
                                   memory_length)

  # ---- weights and their logical axes ------------------------------------
  def add_axes_weight(self, name, shape, axes, initializer):
    """`add_weight`, recording the weight's logical axes (see thattn.core.dims).

    Every such weight is a kernel in tf_keras's sense: it takes the layer's
    kernel regularizer and constraint (Model Garden does the same for its
    talking-heads projections).
    """
    if len(shape) != len(axes):
      raise ValueError(f"Weight {name!r} has shape {shape} but logical axes "
                       f"{axes}; they must have the same length.")
    variable = self.add_weight(name=name, shape=shape,
                               initializer=initializers.fresh(initializer),
                               regularizer=self.kernel_regularizer,
                               constraint=self.kernel_constraint,
                               trainable=True)
    self._axes_by_variable_name[variable.name] = tuple(axes)
    self._initializer_by_variable_name[variable.name] = initializer
    return variable

  def add_axes_sublayer(self, layer, input_shape, axes_by_weight):
    """Builds a sublayer and records the logical axes of its weights.

    `axes_by_weight` maps "kernel" / "bias" to axes tuples.
    """
    # Built outside its own __call__, the sublayer must open its name scope
    # itself, so its variables are named ".../query/kernel" and so on.
    with tf.name_scope(layer.name):
      layer.build(input_shape)
    for variable in layer.weights:
      short = variable.name.split("/")[-1].split(":")[0]
      self._axes_by_variable_name[variable.name] = tuple(axes_by_weight[short])
    return layer

  @property
  def logical_axes(self):
    """{variable name -> logical axes tuple} for every weight of the layer."""
    return dict(self._axes_by_variable_name)

  @property
  def weight_initializers(self):
    """{variable name -> initializer} of the weights the layer makes
    itself (P_l, P_w, a variant's own weights); its projections keep
    theirs (`kernel_initializer`, `bias_initializer`)."""
    return dict(self._initializer_by_variable_name)

  # ---- building ----------------------------------------------------------
  def build_from_shapes(self, query_shape, value_shape, key_shape=None):
    """Creates the weights for the given input shapes; idempotent.

    Called directly (not from the first call), it opens the layer's name
    scope itself, so the weights get the same names either way.
    """
    with tf.name_scope(self.name):
      self._create_weights_once(query_shape, value_shape, key_shape)

  def _create_weights_once(self, query_shape, value_shape, key_shape):
    if self._build_shapes_json is not None:
      return
    query_shape = tf.TensorShape(query_shape)
    value_shape = tf.TensorShape(value_shape)
    key_shape = value_shape if key_shape is None else tf.TensorShape(key_shape)
    for name, shape in (("query", query_shape), ("value", value_shape),
                        ("key", key_shape)):
      if shape.rank != 3 or shape[-1] is None:
        raise ValueError(
            f"{self.name}: {name} must have shape [batch, length, width] with "
            f"a known width, got {shape}.")
    with tf.init_scope():
      self.create_weights(query_shape[-1], key_shape[-1], value_shape[-1])
      self.create_query_key_norms()
      if self.use_gate:
        self._gate_dense = self._create_gate(query_shape[-1])
    self._build_shapes_json = json.dumps(
        {"query_shape": query_shape.as_list(),
         "value_shape": value_shape.as_list(),
         "key_shape": key_shape.as_list()})
    self.built = True

  def _create_gate(self, query_width):
    """P_g: an EinsumDense named "gate" ending in a sigmoid, after the
    variant's weights, as on Keras 3 (so the weights' order is the same)."""
    equation, shape, axes, bias_axes = attention_spec.gate_projection(
        *self.gate_shape(), self.headwise_gate)
    layer = tf_keras.layers.EinsumDense(
        equation, output_shape=shape, activation="sigmoid",
        bias_axes=bias_axes if getattr(self, "use_bias", False) else None,
        kernel_initializer=initializers.fresh(
            self.kernel_initializer or "glorot_uniform"),
        bias_initializer=initializers.fresh(
            getattr(self, "bias_initializer", "zeros")),
        kernel_regularizer=self.kernel_regularizer,
        bias_regularizer=self.bias_regularizer,
        kernel_constraint=self.kernel_constraint,
        bias_constraint=self.bias_constraint,
        dtype=self.dtype_policy, name="gate")
    return self.add_axes_sublayer(layer, [None, None, query_width], axes)

  def get_build_config(self):
    return self.build_shapes

  @property
  def build_shapes(self):
    """{"query_shape", "value_shape", "key_shape"} once built, else None."""
    if self._build_shapes_json is None:
      return None
    return json.loads(self._build_shapes_json)

  def build_from_config(self, config):
    if config:
      self.build_from_shapes(**config)

  # ---- decoding caches ---------------------------------------------------
  def initial_cache(self, batch_size, max_length, dtype=None):
    """An all-zeros self-attention cache for `max_length` decoding steps."""
    if self._build_shapes_json is None:
      raise ValueError(f"{self.name}: call or build the layer before asking "
                       "for a cache, so its weights and widths are known.")
    width = self.build_shapes["value_shape"][-1]
    dtype = dtype or self.compute_dtype
    probe = tf.zeros([1, 1, width], dtype)
    state = self.cached_memory_state(
        self.project_memory(probe, probe))
    return {name: tf.zeros([batch_size, max_length] +
                           tensor.shape.as_list()[2:], tensor.dtype)
            for name, tensor in state.items()}

  def memory_cache(self, value, key=None):
    """The projected memory for cross-attention decoding, computed once."""
    key = value if key is None else key
    if self._build_shapes_json is None:
      raise ValueError(f"{self.name}: call or build the layer before asking "
                       "for a cache, so its query width is known.")
    return self.cached_memory_state(self.with_positions(
        self.project_memory(self._to_compute_dtype(key),
                            self._to_compute_dtype(value)), 0))

  # ---- call ----------------------------------------------------------------
  @autograph.unconverted
  def __call__(self, *args, **kwargs):
    # Before Keras's own __call__, whose error for a Keras 3 tensor does not
    # say that this is a tf_keras layer.
    keras_arguments.refuse_keras3_tensors(
        self.name, list(args) + list(kwargs.values()))
    return super().__call__(*args, **kwargs)

  @autograph.unconverted
  def call(self, query, value=None, key=None, attention_mask=None,
           return_attention_scores=False, training=None,
           use_causal_mask=False, *, position_bias=None, cache=None,
           decode_step=None):
    attention_spec.check_call(self.name, value, cache, decode_step,
                              self.sliding_window)
    query, value, key, query_lengths, implicit_masks = self._dense_inputs(
        query, value, key, cache)
    # Keras autocasts only the first argument under a mixed-precision
    # policy; the memory must follow it into the compute dtype.
    value = self._to_compute_dtype(value)
    key = value if key is None else self._to_compute_dtype(key)
    if self._build_shapes_json is None:
      if value is None:
        raise ValueError(f"{self.name}: build the layer before calling it "
                         "with only a cache.")
      # Inside __call__ Keras has opened this layer's name scope already.
      self._create_weights_once(query.shape, value.shape, key.shape)
    self._check_widths(query=query, key=key, value=value)
    keras_arguments.check_lengths(self.name, query=query, key=key,
                                  value=value)

    decoding = cache is not None and decode_step is not None
    query_offset = decode_step if decoding else 0
    gate = None if self._gate_dense is None else self._gate_dense(query)
    query_state = self.with_positions(self.project_query(query),
                                      query_offset)
    if cache is None:
      memory_state = self.with_positions(self.project_memory(key, value), 0)
    elif decode_step is None:
      memory_state = cache  # cross-attention: the memory was projected once
    else:
      new_state = self.cached_memory_state(self.with_positions(
          self.project_memory(key, value), decode_step))
      memory_state = {name: _write_positions(cache[name], new_state[name],
                                             decode_step)
                      for name in cache}
      use_causal_mask = True  # later cache slots are still empty
    memory_length = tf.shape(next(iter(memory_state.values())))[1]

    mask = attention_ops.combine_masks(
        self._combined_mask(query, implicit_masks, attention_mask,
                            memory_length),
        attention_ops.window_mask(tf.shape(query)[1], memory_length,
                                  query_offset, self.sliding_window))
    causal_offset = query_offset if use_causal_mask else None
    context, scores = self.attend(query_state,
                                  self.repeat_shared_heads(memory_state),
                                  mask, position_bias, training,
                                  causal_offset,
                                  need_scores=return_attention_scores)
    if gate is not None:
      context = output_gate.gated_context(tf_ops.TF_OPS, context, gate,
                                          self.headwise_gate)
    output = keras_arguments.reragged(self.project_output(context),
                                      query_lengths)
    results = (output, scores) if return_attention_scores else (output,)
    if cache is not None:
      results += (memory_state,)
    return results[0] if len(results) == 1 else results

  def _dense_inputs(self, query, value, key, cache):
    """(query, value, key, query row lengths, implicit masks), dense.

    The implicit masks are the Keras masks (e.g. Embedding(mask_zero=True)),
    read before any cast, which would drop them: the query's, then the
    value's and a separate key's (as in tf_keras), then the padding of
    ragged memory inputs (see `keras_arguments.densify_ragged`).
    """
    implicit_masks = [getattr(query, "_keras_mask", None)]
    if cache is None:
      implicit_masks += [getattr(value, "_keras_mask", None),
                         None if key is None or key is value else
                         getattr(key, "_keras_mask", None)]
    query, value, key, query_lengths, padding_mask = (
        keras_arguments.densify_ragged(self.name, query, value, key))
    if query_lengths is not None or padding_mask is not None:
      if cache is not None:
        raise ValueError(f"{self.name}: decoding caches take dense inputs; "
                         "densify the RaggedTensor with `.to_tensor()`.")
      implicit_masks.append(padding_mask)
    return query, value, key, query_lengths, implicit_masks

  # The heads of the attention scores `call` returns; subclasses whose
  # scores have other heads (talking heads: h_v) override it.
  @property
  def attention_scores_heads(self):
    return self.num_heads

  def compute_output_shape(self, query_shape, value_shape, key_shape=None,
                           return_attention_scores=False):
    """Y's shape [b, n, d_Y], and the scores' [b, heads, n, m] if asked.

    tf_keras.layers.MultiHeadAttention's signature; `key_shape` defaults to
    `value_shape`.
    """
    query_shape = tf.TensorShape(query_shape)
    value_shape = tf.TensorShape(value_shape)
    key_shape = value_shape if key_shape is None else tf.TensorShape(key_shape)
    for name, shape in (("query_shape", query_shape),
                        ("value_shape", value_shape),
                        ("key_shape", key_shape)):
      if shape.rank != 3:
        raise ValueError(f"{self.name}: {name} must be [batch, length, "
                         f"width], got {shape}.")
    # tf_keras's checks, but for its query width == value width: thattn's
    # layers take d_X != d_M (cross-attention), as tf_keras's call does.
    attention_spec.check_memory_shapes(self.name, value_shape.as_list(),
                                       key_shape.as_list())
    built = self.build_shapes or {}
    for name, shape in (("query", query_shape), ("value", value_shape),
                        ("key", key_shape)):
      expected = built.get(f"{name}_shape", [None])[-1]
      if None not in (expected, shape[-1]) and shape[-1] != expected:
        raise ValueError(
            f"{self.name}: The last dimension of `{name}_shape` must be "
            f"equal to the width the layer was built for, {expected}. "
            f"Received: {name}_shape={shape}")
    output_shape = query_shape[:-1].concatenate(
        [self.output_dim or query_shape[-1]])
    if not return_attention_scores:
      return output_shape
    scores_shape = tf.TensorShape([query_shape[0], self.attention_scores_heads,
                                   query_shape[1], value_shape[1]])
    return output_shape, scores_shape

  def _check_widths(self, **inputs):
    """Refuses inputs whose width is not the one the weights were built for.

    Without this, a wrong width fails deep inside a projection's einsum with
    a message that names neither the layer nor the widths.
    """
    built = self.build_shapes
    for name, tensor in inputs.items():
      if tensor is None or tensor.shape.rank is None:
        continue
      width, expected = tensor.shape[-1], built[f"{name}_shape"][-1]
      if width is not None and width != expected:
        raise ValueError(
            f"{self.name}: built for {name} width {expected}, called with "
            f"a {name} of width {width} (shape {tensor.shape}); build a new "
            "layer for the new width.")

  def _to_compute_dtype(self, tensor):
    if tensor is None:
      return None
    if not tf.is_tensor(tensor):
      tensor = tf.convert_to_tensor(tensor)  # NumPy arrays, lists
    if not tensor.dtype.is_floating:
      return tensor
    return tf.cast(tensor, self.compute_dtype)

  def _combined_mask(self, query, implicit_masks, attention_mask,
                     memory_length):
    """The non-causal masks as one boolean [b, 1, n, m]-broadcastable mask.

    `implicit_masks` is the query's [b, n] Keras mask, then any number of
    [b, m] memory masks (the value's and key's Keras masks, ragged padding),
    each None or a tensor.
    """
    masks = []
    if attention_mask is not None:
      masks.append(self._checked_mask(attention_mask, query, memory_length))
    implicit_query, *implicit_memory = implicit_masks
    if implicit_query is not None:
      masks.append(tf.expand_dims(tf.cast(implicit_query, tf.bool), 2))
    masks += [tf.expand_dims(tf.cast(memory_mask, tf.bool), 1)
              for memory_mask in implicit_memory if memory_mask is not None]
    mask = attention_ops.combine_masks(*masks)
    return None if mask is None else tf.expand_dims(mask, 1)  # heads axis

  def _checked_mask(self, mask, query, memory_length):
    """A user mask as bool, its static shape checked against [b, n, m]."""
    mask = keras_arguments.boolean_mask(self.name, mask)
    static_memory_length = tf.get_static_value(memory_length)
    expected = [query.shape[0], query.shape[1],
                None if static_memory_length is None else
                int(static_memory_length)]
    shape = mask.shape
    fits = shape.rank == 3 and all(
        got is None or want is None or got in (1, want)
        for got, want in zip(shape.as_list(), expected))
    if not fits:
      raise ValueError(
          f"{self.name}: attention_mask has shape {shape}, expected "
          f"[batch, query_length, memory_length] = {expected} "
          "(dimensions of size 1 broadcast).")
    return mask

  def dropout_weights(self, weights, training):
    """Attention dropout on the weights that multiply the values."""
    return self._dropout(weights, training=training)

  def get_config(self):
    config = super().get_config()
    serialize = {"initializer": tf_keras.initializers.serialize,
                 "regularizer": tf_keras.regularizers.serialize,
                 "constraint": tf_keras.constraints.serialize}
    config.update({
        "output_shape": self.output_dim,
        "dropout": self.dropout,
        "use_gate": self.use_gate,
        "headwise_gate": self.headwise_gate,
        "kernel_initializer": serialize["initializer"](self.kernel_initializer),
        "kernel_regularizer": serialize["regularizer"](self.kernel_regularizer),
        "bias_regularizer": serialize["regularizer"](self.bias_regularizer),
        "activity_regularizer":
            serialize["regularizer"](self.activity_regularizer),
        "kernel_constraint": serialize["constraint"](self.kernel_constraint),
        "bias_constraint": serialize["constraint"](self.bias_constraint),
        "build_shapes": self.build_shapes,
    })
    if self.sliding_window is not None:  # other layers' configs unchanged
      config["sliding_window"] = self.sliding_window
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    build_shapes = config.pop("build_shapes", None)
    layer = cls(**config)
    if build_shapes:
      layer.build_from_shapes(**build_shapes)
    return layer
