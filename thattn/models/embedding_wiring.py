"""The layers around the Transformer blocks, written once for both front
ends: their arguments, configs, logical axes, and the pooler.

Mixins for the classes of `thattn.models.embeddings` (tf_keras) and
`thattn.keras3.models.embeddings` (Keras 3), which add their framework's
glue as class attributes (`_framework`: tf_keras or keras;
`_serialize_initializer`, `_serialize`, `_deserialize`, `_fresh`: an
initializer -> a fresh copy) and what differs per framework: building,
and the lookups (tf_keras gathers, laid out for DTensor; Keras 3 selects
small tables, `thattn.keras3.lookups`). Plain Python: nothing here imports
a framework. Letters follow `thattn.core.dims`.

- `TokenEmbeddingConfig`: E[t, d], which also scores vectors against
  itself (logits[b, n, t] = einsum(x * logits_scale, E));
- `PositionEmbeddingConfig`: BERT's learned positions, X + P[:n];
- `StackPositionBiasConfig`: a stack's one relative position bias;
- `PoolerWiring`: BERT's pooler, tanh(X[:, 0] W + b).
"""

from thattn.core import dims
from thattn.models import block_wiring

# logits[b, n, t] = einsum(X[b, n, d], E[t, d]): t indexes the vocabulary.
EMBEDDING_LOGITS = "bnd,td->bnt"


class TokenEmbeddingConfig:
  """Mixin for `TokenEmbedding`: its arguments, config and logical axes
  (vocab, d_model), also for ALBERT's narrower E."""

  def __init__(self, vocab_size, width, embeddings_initializer="uniform",
               logits_scale=1.0, **kwargs):
    super().__init__(**kwargs)
    self.vocab_size = vocab_size
    self.width = width
    self.embeddings_initializer = self._framework.initializers.get(
        embeddings_initializer)
    self.logits_scale = float(logits_scale)

  @property
  def logical_axes(self):
    return {block_wiring.variable_key(self.embeddings):
            (dims.VOCAB, dims.D_MODEL)}

  def get_config(self):
    return dict(super().get_config(), vocab_size=self.vocab_size,
                width=self.width,
                embeddings_initializer=self._serialize_initializer(
                    self.embeddings_initializer),
                logits_scale=self.logits_scale)


class PositionEmbeddingConfig:
  """Mixin for `PositionEmbedding`: its arguments, config and logical axes
  (no rule shards the position axis: it stays replicated)."""

  def __init__(self, max_length, initializer="uniform", **kwargs):
    super().__init__(**kwargs)
    self.max_length = max_length
    self.initializer = self._framework.initializers.get(initializer)

  @property
  def logical_axes(self):
    return {block_wiring.variable_key(self.embeddings): (None, dims.D_MODEL)}

  def get_config(self):
    return dict(super().get_config(), max_length=self.max_length,
                initializer=self._serialize_initializer(self.initializer))


class StackPositionBiasConfig:
  """Mixin for `StackPositionBias`: the wrapped `RelativePositionBias`
  (a layer, or its serialized config) and the config."""

  def __init__(self, relative_position_bias, **kwargs):
    super().__init__(**kwargs)
    if isinstance(relative_position_bias, dict):
      relative_position_bias = self._deserialize(relative_position_bias)
    self.relative_position_bias = relative_position_bias

  def get_config(self):
    return dict(super().get_config(), relative_position_bias=self._serialize(
        self.relative_position_bias))


class PoolerWiring:
  """BERT's pooler: tanh(X[:, 0] W + b), the first token's summary."""

  def __init__(self, width, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.width = width
    framework = self._framework
    self.kernel_initializer = framework.initializers.get(kernel_initializer)
    self.dense = framework.layers.Dense(
        width, activation="tanh",
        kernel_initializer=self._fresh(self.kernel_initializer),
        dtype=self.dtype_policy, name="dense")

  @property
  def logical_axes(self):
    key = block_wiring.variable_key
    return {key(self.dense.kernel): (dims.D_MODEL, dims.D_MODEL),
            key(self.dense.bias): (dims.D_MODEL,)}

  def call(self, inputs):
    return self.dense(inputs[:, 0])

  def get_config(self):
    return dict(super().get_config(), width=self.width,
                kernel_initializer=self._serialize_initializer(
                    self.kernel_initializer))
