"""The computations of thattn's Transformer blocks, written once for both
front ends.

Mixins for each front end's Layer classes (`thattn.models.blocks`,
`thattn.keras3.models.blocks`), which add only their framework's glue as
class attributes (`_framework`: tf_keras or keras; and what else each
mixin names) and their building and serialization. Plain Python: nothing
here imports a framework.

- `FeedForwardWiring`: the position-wise feed-forward network;
- `PostNormWiring`: BERT's and ALBERT's layer,
      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))
- `PreNormWiring`: T5's layer, with RMSNorm,
      x = x + dropout(self_attention(norm(x), norm(x)))
      x = x + dropout(cross_attention(norm(x), memory))    (decoder only)
      x = x + dropout(feed_forward(norm(x)))
  and its incremental decoding with the attention layers' caches.
"""

from thattn.core import dims
from thattn.core import validation


def activations(relu, gelu):
  """`activation_function(name)` for the names of config.ACTIVATIONS, from
  a framework's relu(x) and gelu(x, approximate): "gelu" is BERT's exact
  (erf) form, "gelu_approximate" the tanh form of ALBERT v2 and T5.1.1. A
  name not among them raises ValueError."""
  table = {"relu": relu,
           "gelu": lambda x: gelu(x, approximate=False),
           "gelu_approximate": lambda x: gelu(x, approximate=True)}

  def activation_function(name):
    validation.one_of("activation", name, tuple(table))
    return table[name]
  return activation_function


def deserialize_layers(config, names, deserialize):
  """`config` with its sublayers named in `names` deserialized by the front
  end's `deserialize` (those already layers or None kept)."""
  config = dict(config)
  for name in names:
    if isinstance(config.get(name), dict):
      config[name] = deserialize(config[name])
  return config


def glue(name, framework, **functions):
  """A base class of a front end's glue for the mixins here and in
  `embedding_wiring`: `_framework` (tf_keras or keras) and each function
  of `functions` (serialize, deserialize, serialize_initializer, fresh) as
  a static method `_<name>`. Each front end's layer classes inherit it
  after their mixin."""
  attributes = {f"_{key}": staticmethod(function)
                for key, function in functions.items()}
  return type(name, (), dict(attributes, _framework=framework,
                             __doc__=f"{framework.__name__}'s glue for "
                             "thattn.models' shared wiring."))


def variable_key(variable):
  """A weight's key in `logical_axes`: its path in Keras 3, its name in
  tf_keras (which has no paths)."""
  return getattr(variable, "path", None) or variable.name


class RMSNormWiring:
  """T5's layer norm: y = x / sqrt(mean(x**2) + epsilon) * scale, in
  float32 (under mixed precision too); unlike LayerNormalization it
  subtracts no mean and adds no bias. Glue: `_ops`, the front end's
  functions under keras.ops' names (keras.ops, `thattn.ops.tf_ops.TF_OPS`);
  the front end builds `scale`."""

  def __init__(self, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.epsilon = epsilon

  @property
  def logical_axes(self):
    return {variable_key(self.scale): (dims.D_MODEL,)}

  def call(self, inputs):
    ops = self._ops
    x = ops.cast(inputs, "float32")
    variance = ops.mean(ops.square(x), axis=-1, keepdims=True)
    y = x * ops.rsqrt(variance + self.epsilon)
    return ops.cast(y * ops.cast(self.scale, "float32"), self.compute_dtype)

  def get_config(self):
    return dict(super().get_config(), epsilon=self.epsilon)


class FeedForwardWiring:
  """The position-wise feed-forward network:

      H[f] = act(X[d] W_i[d, f] (+ b_i))            plain
      H[f] = act(X[d] W_i[d, f]) * X[d] W_g[d, f]   gated (T5.1.1)
      Y[d] = dropout(H[f]) W_o[f, d] (+ b_o)

  Mixed into a front end's Layer class, which names its glue in class
  attributes: `_framework` (tf_keras or keras), `_activation_of` (an
  activation name of config.ACTIVATIONS -> its function), `_fresh` (an
  initializer -> a fresh copy, one per weight) and `_serialize_initializer`
  (the front end's `glue` class gives all but the activations).
  """

  def __init__(self, d_ff, activation="relu", gated=False, use_bias=False,
               dropout_rate=0.0, kernel_initializer="glorot_uniform",
               output_initializer=None, **kwargs):
    super().__init__(**kwargs)
    self._activation_of(activation)  # fails early on an unknown name
    self.d_ff = d_ff
    self.activation = activation
    self.gated = gated
    self.use_bias = use_bias
    self.dropout_rate = dropout_rate
    initializers = self._framework.initializers
    self.kernel_initializer = initializers.get(kernel_initializer)
    self.output_initializer = initializers.get(
        output_initializer or kernel_initializer)
    self._dropout = self._framework.layers.Dropout(dropout_rate,
                                                   dtype=self.dtype_policy)

  def _dense(self, units, initializer, name):
    return self._framework.layers.Dense(
        units, use_bias=self.use_bias,
        kernel_initializer=self._fresh(initializer),
        dtype=self.dtype_policy, name=name)

  def make_dense_layers(self, input_shape):
    """W_i, W_g (gated only) and W_o, each with the shape (a list) to
    build it for."""
    kernel, output = self.kernel_initializer, self.output_initializer
    self.input_dense = self._dense(self.d_ff, kernel, "input")
    self.gate_dense = (self._dense(self.d_ff, kernel, "gate")
                       if self.gated else None)
    self.output_dense = self._dense(input_shape[-1], output, "output")
    hidden_shape = list(input_shape[:-1]) + [self.d_ff]
    return [(layer, shape) for layer, shape in
            ((self.input_dense, list(input_shape)),
             (self.gate_dense, list(input_shape)),
             (self.output_dense, hidden_shape)) if layer is not None]

  def get_config(self):
    return dict(super().get_config(), d_ff=self.d_ff,
                activation=self.activation, gated=self.gated,
                use_bias=self.use_bias, dropout_rate=self.dropout_rate,
                kernel_initializer=self._serialize_initializer(
                    self.kernel_initializer),
                output_initializer=self._serialize_initializer(
                    self.output_initializer))

  @property
  def logical_axes(self):
    axes = {}
    for layer, kernel_axes in ((self.input_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.gate_dense, (dims.D_MODEL, dims.D_FF)),
                               (self.output_dense, (dims.D_FF, dims.D_MODEL))):
      if layer is not None:
        axes[variable_key(layer.kernel)] = kernel_axes
        if layer.use_bias:
          axes[variable_key(layer.bias)] = kernel_axes[-1:]
    return axes

  def call(self, inputs, training=None):
    hidden = self._activation_of(self.activation)(self.input_dense(inputs))
    if self.gate_dense is not None:
      hidden = hidden * self.gate_dense(inputs)
    hidden = self._dropout(hidden, training=training)
    return self.output_dense(hidden)


class BlockConfig:
  """get_config / from_config of a block that holds other layers: its
  `_SUBLAYERS` serialized by the front end's `_serialize` (a class
  attribute, with `_deserialize`), and its `_FIELDS`."""

  def get_config(self):
    config = super().get_config()
    config.update({name: getattr(self, name) for name in self._FIELDS})
    for name in self._SUBLAYERS:
      layer = getattr(self, name)
      config[name] = None if layer is None else self._serialize(layer)
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**deserialize_layers(config, cls._SUBLAYERS,
                                    cls._deserialize))


class PostNormWiring(BlockConfig):
  """BERT's Transformer layer, residual then LayerNorm (post-LN), mixed
  into a front end's Layer class with its `_framework` (tf_keras or keras)
  as a class attribute:

      x = LayerNorm(x + dropout(attention(x, x)))
      x = LayerNorm(x + dropout(feed_forward(x)))
  """

  _SUBLAYERS = ("attention", "feed_forward")
  _FIELDS = ("dropout_rate", "epsilon")

  def __init__(self, attention, feed_forward, dropout_rate=0.0,
               epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    self.attention = attention
    self.feed_forward = feed_forward
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    layers = self._framework.layers
    norm = lambda name: layers.LayerNormalization(
        epsilon=epsilon, dtype=self.dtype_policy, name=name)
    self.attention_norm = norm("attention_norm")
    self.feed_forward_norm = norm("feed_forward_norm")
    self._dropout = layers.Dropout(dropout_rate, dtype=self.dtype_policy)

  def call(self, inputs, attention_mask=None, position_bias=None,
           training=None):
    x = inputs
    y = self.attention(x, x, attention_mask=attention_mask,
                       position_bias=position_bias, training=training)
    x = self.attention_norm(x + self._dropout(y, training=training))
    y = self.feed_forward(x, training=training)
    return self.feed_forward_norm(x + self._dropout(y, training=training))


class PreNormWiring(BlockConfig):
  """T5's pre-norm Transformer layer, mixed into a front end's Layer class
  with `_framework` (tf_keras or keras) and `_rms_norm` (its RMSNorm class)
  as class attributes. `cross_attention` is None in an encoder."""

  _SUBLAYERS = ("self_attention", "feed_forward", "cross_attention")
  _FIELDS = ("causal", "dropout_rate", "epsilon")

  def __init__(self, self_attention, feed_forward, cross_attention=None,
               causal=False, dropout_rate=0.0, epsilon=1e-6, **kwargs):
    super().__init__(**kwargs)
    self.self_attention = self_attention
    self.feed_forward = feed_forward
    self.cross_attention = cross_attention
    self.causal = causal
    self.dropout_rate = dropout_rate
    self.epsilon = epsilon
    norm = lambda name: self._rms_norm(epsilon, dtype=self.dtype_policy,
                                       name=name)
    self.self_attention_norm = norm("self_attention_norm")
    self.cross_attention_norm = (norm("cross_attention_norm")
                                 if cross_attention is not None else None)
    self.feed_forward_norm = norm("feed_forward_norm")
    self._dropout = self._framework.layers.Dropout(dropout_rate,
                                                   dtype=self.dtype_policy)

  def initial_cache(self, batch_size, max_length, memory=None):
    """Empty self-attention cache; the cross-attention memory, projected."""
    cache = {"self_attention":
                 self.self_attention.initial_cache(batch_size, max_length)}
    if self.cross_attention is not None:
      if memory is None:
        raise ValueError(f"{self.name}: a decoder block's cache needs the "
                         "encoder output as `memory`.")
      cache["cross_attention"] = self.cross_attention.memory_cache(memory)
    return cache

  def call(self, inputs, memory=None, attention_mask=None, memory_mask=None,
           position_bias=None, training=None, cache=None, decode_step=None):
    # x = x + ..., never x += ...: a PyTorch tensor would be changed in
    # place, the caller's input with it.
    x = inputs
    new_cache = {}
    h = self.self_attention_norm(x)
    if cache is None:
      y = self.self_attention(h, h, attention_mask=attention_mask,
                              use_causal_mask=self.causal,
                              position_bias=position_bias, training=training)
    else:
      y, new_cache["self_attention"] = self.self_attention(
          h, h, attention_mask=attention_mask, position_bias=position_bias,
          training=training, cache=cache["self_attention"],
          decode_step=decode_step)
    x = x + self._dropout(y, training=training)
    if self.cross_attention is not None:
      h = self.cross_attention_norm(x)
      if cache is None:
        y = self.cross_attention(h, memory, attention_mask=memory_mask,
                                 training=training)
      else:  # the memory was projected once, into the cache
        y, new_cache["cross_attention"] = self.cross_attention(
            h, None, attention_mask=memory_mask, training=training,
            cache=cache["cross_attention"])
      x = x + self._dropout(y, training=training)
    y = self.feed_forward(self.feed_forward_norm(x), training=training)
    x = x + self._dropout(y, training=training)
    return x if cache is None else (x, new_cache)
