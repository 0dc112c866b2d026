"""What each task adds to a model, written once for both front ends: its
head layers' computations and its loss.

Plain Python, beside `wiring` (the models) and `block_wiring` (the blocks):
nothing here imports a framework. Two kinds of glue come from each front
end:

- `TaskOps`, the handful of tensor functions the heads and losses use
  (`thattn.models.front_end.TF_KERAS_OPS` in TensorFlow,
  `thattn.keras3.models.front_end.KERAS3_OPS` in `keras.ops`);
- class attributes of each front end's head classes, which mix in the
  `...Wiring` classes here: `_framework` (tf_keras or keras), `_ops` (its
  `TaskOps`), `_build_sublayer(layer, shape)`, and for the masked-LM head
  `_activation_of` and `_TokenEmbedding`.

The heads (letters as in `thattn.core.dims`; p counts the masked positions, e
is the embedding width, c the classes):

- `MaskedLMHeadWiring`, BERT's masked-LM output layer, tied to the word
  embeddings E (Devlin et al., 2019, and the released code):
      H[b, p, d] = gather(X[b, n, d], positions[b, p])
      T[b, p, e] = LayerNorm(act(H W_t + b_t))
      logits[b, p, t] = einsum(T[b, p, e], E[t, e]) + bias[t]
- `ClassificationHeadWiring`: logits[b, c] = dropout(pooled[b, d]) W + b,
  after an optional Dense+tanh pooler; regression (c = 1) returns [b];
- `SpanHeadWiring` (SQuAD): start and end logits [b, n] = X[b, n, d] W[d, 2]
  + b, -1e9 where no answer may start or end.

and the recall task's whole model, `RecallEncoderWiring` (its front ends'
glue: `_framework`, `_ops`, `_attention_front_end`, the front end's
name in `thattn.core.variants`, and `_RelativePositionBias`).

The losses: each task's `(sum of losses, count)` in float32 nats, so that
a mean over batches or replicas weighs every position or example alike
(the run drivers divide), from the backbone, the head and a batch:
`masked_lm_loss`, `span_corruption_loss`, `classification_loss`,
`squad_loss`, `recall_loss`.
"""

import collections

from thattn.core import dims
from thattn.core import variants
from thattn.models import block_wiring
from thattn.models import wiring

BERT_INPUTS = wiring.BERT_INPUTS

TaskOps = collections.namedtuple("TaskOps", [
    "cast",  # (x, dtype name) -> x as that dtype
    "sum",  # (x) -> the sum of all its elements
    "ones_like",  # (x) -> ones of x's shape and dtype
    "arange",  # (n) -> int32 [n]: 0, 1, ..., n - 1
    "length",  # (x) -> x's axis 1 (static or a scalar tensor)
    "pad_right_shift",  # (x [b, n]) -> [0, x[:, :-1]] along axis 1
    "cross_entropy",  # (labels [...], logits [..., c]) -> float32 [...]
    "gather_positions",  # (x [b, n, d], positions [b, p]) -> [b, p, d]
])


# ---- the heads ---------------------------------------------------------------


class MaskedLMHeadWiring:
  """Float32 logits [b, p, t] at the masked positions; see the module.

  Args:
    embedding: the backbone's `TokenEmbedding` (`word_embeddings`), whose
      table scores the outputs (tied; not serialized: rebuild the head
      around the backbone's layer).
    activation: a name from thattn.models.config.ACTIVATIONS.
    initializer_range: stddev of the truncated-normal transform kernel.
  """

  def __init__(self, embedding, activation="gelu", initializer_range=0.02,
               layer_norm_epsilon=1e-12, **kwargs):
    super().__init__(**kwargs)
    if not isinstance(embedding, self._TokenEmbedding):
      raise ValueError(f"embedding must be a TokenEmbedding, got "
                       f"{embedding!r}.")
    self._activation_of(activation)  # fails early on an unknown name
    self.embedding = embedding
    self.activation = activation
    self.initializer_range = initializer_range
    self.layer_norm_epsilon = layer_norm_epsilon
    framework = self._framework
    self.transform = framework.layers.Dense(
        embedding.width, kernel_initializer=framework.initializers
        .TruncatedNormal(stddev=initializer_range), name="transform")
    self.norm = framework.layers.LayerNormalization(
        epsilon=layer_norm_epsilon, name="transform_norm")

  def build(self, input_shape, positions_shape=None):
    del positions_shape  # any number of positions
    input_shape = list(input_shape)
    self._build_sublayer(self.transform, input_shape)
    self._build_sublayer(self.norm, input_shape[:-1] + [self.embedding.width])
    self.output_bias = self.add_weight(
        name="output_bias", shape=(self.embedding.vocab_size,),
        initializer="zeros")
    super().build(input_shape)

  @property
  def logical_axes(self):
    # The bias follows the tied table's vocab axis, so a vocab rule shards
    # both alike; the transform (d_model -> embedding width) stays whole.
    return {block_wiring.variable_key(self.output_bias): (dims.VOCAB,)}

  def call(self, sequence_output, positions):
    ops = self._ops
    hidden = ops.gather_positions(sequence_output, positions)
    activation = self._activation_of(self.activation)
    hidden = self.norm(activation(self.transform(hidden)))
    logits = self.embedding(hidden, mode="logits")
    return logits + ops.cast(self.output_bias, "float32")

  def get_config(self):
    # The tied embedding is a live layer, not a config value.
    return dict(super().get_config(), activation=self.activation,
                initializer_range=self.initializer_range,
                layer_norm_epsilon=self.layer_norm_epsilon)


class ClassificationHeadWiring:
  """Logits [b, num_classes] from a pooled output [b, d].

  inner_dim > 0 adds a Dense+tanh pooler first, for backbones without one
  (T5's encoder, after taking position 0). num_classes=1 is regression and
  returns [b].
  """

  def __init__(self, num_classes, *, inner_dim=0, dropout_rate=0.1,
               kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    if num_classes < 1:
      raise ValueError(f"num_classes must be positive, got {num_classes}.")
    self.num_classes = num_classes
    self.inner_dim = inner_dim
    self.dropout_rate = dropout_rate
    self.kernel_initializer = kernel_initializer
    layers = self._framework.layers
    self.dense = (layers.Dense(
        inner_dim, activation="tanh", kernel_initializer=kernel_initializer,
        name="pooler_dense") if inner_dim else None)
    self.dropout = layers.Dropout(dropout_rate)
    self.out_proj = layers.Dense(
        num_classes, kernel_initializer=kernel_initializer, name="logits")

  def build(self, input_shape):
    input_shape = list(input_shape)
    if self.dense is not None:
      self._build_sublayer(self.dense, input_shape)
      input_shape = input_shape[:-1] + [self.inner_dim]
    self._build_sublayer(self.out_proj, input_shape)
    super().build(input_shape)

  def call(self, pooled_output, training=None):
    x = pooled_output
    if self.dense is not None:
      x = self.dense(x)
    logits = self.out_proj(self.dropout(x, training=training))
    return logits[:, 0] if self.num_classes == 1 else logits

  def get_config(self):
    return dict(super().get_config(), num_classes=self.num_classes,
                inner_dim=self.inner_dim, dropout_rate=self.dropout_rate,
                kernel_initializer=self.kernel_initializer)


class SpanHeadWiring:
  """(start_logits, end_logits) [b, n] from a sequence output [b, n, d].

  With a boolean mask [b, n], positions where it is False get -1e9 logits.
  """

  def __init__(self, kernel_initializer="glorot_uniform", **kwargs):
    super().__init__(**kwargs)
    self.kernel_initializer = kernel_initializer
    self.dense = self._framework.layers.Dense(
        2, kernel_initializer=kernel_initializer, name="span_logits")

  def build(self, input_shape):
    self._build_sublayer(self.dense, list(input_shape))
    super().build(input_shape)

  def call(self, sequence_output, mask=None):
    logits = self.dense(sequence_output)
    if mask is not None:
      excluded = 1.0 - self._ops.cast(mask, self.compute_dtype)
      logits = logits + excluded[..., None] * -1e9  # not in place (torch)
    return logits[..., 0], logits[..., 1]

  def get_config(self):
    return dict(super().get_config(),
                kernel_initializer=self.kernel_initializer)


class RecallEncoderWiring:
  """The recall task's model: value logits [b, n, num_values] for (key,
  value) tokens [b, n, 2].

  The input embedding is E_key[key] + E_value[value]; value ids run up to
  num_values, the last one meaning "unknown". Per block (T5-style pre-norm,
  one relative position bias B shared by all blocks):
      x += attention(norm(x), norm(x), position_bias=B)
      x += W_2 relu(W_1 norm(x))
  then a final norm and a Dense to the values.
  """

  def __init__(self, *, num_keys, num_values, attention="talking_heads",
               num_layers=2, d_model=64, num_heads=4, key_dim=None, d_ff=None,
               **kwargs):
    super().__init__(**kwargs)
    key_dim = key_dim or max(1, d_model // num_heads)
    d_ff = d_ff or 4 * d_model
    self.hyperparameters = dict(
        num_keys=num_keys, num_values=num_values, attention=attention,
        num_layers=num_layers, d_model=d_model, num_heads=num_heads,
        key_dim=key_dim, d_ff=d_ff)
    layers = self._framework.layers
    self.key_embedding = layers.Embedding(num_keys, d_model,
                                          name="key_embedding")
    self.value_embedding = layers.Embedding(num_values + 1, d_model,
                                            name="value_embedding")
    self.position_bias = self._RelativePositionBias(
        num_heads, bidirectional=True, name="relative_position_bias")
    self.blocks = []
    for index in range(num_layers):
      self.blocks.append({
          "attention_norm": layers.LayerNormalization(
              name=f"block_{index}_attention_norm"),
          "attention": variants.make_attention(
              self._attention_front_end, attention, num_heads, key_dim,
              name=f"block_{index}_attention"),
          "ff_norm": layers.LayerNormalization(name=f"block_{index}_ff_norm"),
          "ff_in": layers.Dense(d_ff, activation="relu",
                                name=f"block_{index}_ff_in"),
          "ff_out": layers.Dense(d_model, name=f"block_{index}_ff_out"),
      })
    self.final_norm = layers.LayerNormalization(name="final_norm")
    self.classifier = layers.Dense(num_values, name="classifier")

  def call(self, tokens, training=None):
    x = (self.key_embedding(tokens[..., 0]) +
         self.value_embedding(tokens[..., 1]))
    length = self._ops.length(tokens)
    bias = self.position_bias(query_length=length, memory_length=length)
    # `x = x + ...`, never `x += ...`: on PyTorch `+=` adds in place, into a
    # tensor autograd keeps for the backward pass.
    for block in self.blocks:
      normed = block["attention_norm"](x)
      x = x + block["attention"](normed, normed, position_bias=bias,
                                 training=training)
      x = x + block["ff_out"](block["ff_in"](block["ff_norm"](x)))
    return self.classifier(self.final_norm(x))

  def get_config(self):
    return dict(self.hyperparameters)


# ---- the losses --------------------------------------------------------------


def masked_cross_entropy(ops, targets, logits, weights):
  """(sum of weighted cross-entropies, sum of weights), in float32 nats.

  Returned apart, so that a mean over several batches or replicas weighs
  every position alike: ln(PPL) = total / count.
  """
  losses = ops.cross_entropy(targets, ops.cast(logits, "float32"))
  weights = ops.cast(weights, "float32")
  return ops.sum(losses * weights), ops.sum(weights)


def _per_example(ops, losses):
  """(sum, count) of one float32 loss per example [b]."""
  return ops.sum(losses), ops.sum(ops.ones_like(losses))


def bert_outputs(backbone, batch, training):
  """A BERT's or ALBERT's outputs (sequence_output, pooled_output) for a
  batch holding its three inputs."""
  return backbone({key: batch[key] for key in BERT_INPUTS},
                  training=training)


def masked_lm_loss(ops, backbone, head, batch, training):
  """Masked LM: the head's logits at the masked positions (a BERT or
  ALBERT); with no head, a T5 encoder's own LM logits gathered there."""
  if head is None:
    logits = ops.gather_positions(
        backbone({"encoder_input_tokens": batch["input_word_ids"]},
                 training=training), batch["masked_lm_positions"])
  else:
    logits = head(bert_outputs(backbone, batch, training)["sequence_output"],
                  batch["masked_lm_positions"])
  return masked_cross_entropy(ops, batch["masked_lm_ids"], logits,
                              batch["masked_lm_weights"])


def span_corruption_loss(ops, backbone, batch, training, pad_id):
  """T5 span corruption with teacher forcing: the decoder reads the
  targets shifted right, after the start token 0, and is scored where the
  target is not padding."""
  targets = batch["targets"]
  logits = backbone({"encoder_input_tokens": batch["inputs"],
                     "decoder_input_tokens": ops.pad_right_shift(targets)},
                    training=training)
  weights = ops.cast(ops.cast(targets, "int32") != pad_id, "float32")
  return masked_cross_entropy(ops, targets, logits, weights)


def classification_outputs(backbone, head, batch, training):
  """The classification head's logits [b, c] (or predictions [b]) of the
  pooled output."""
  pooled = bert_outputs(backbone, batch, training)["pooled_output"]
  return head(pooled, training=training)


def classification_loss(ops, outputs, labels, regression):
  """Cross-entropy of logits [b, c], or for regression the squared error
  of predictions [b], per example."""
  outputs = ops.cast(outputs, "float32")
  if regression:
    difference = outputs - ops.cast(labels, "float32")
    return _per_example(ops, difference * difference)
  return _per_example(ops, ops.cross_entropy(labels, outputs))


def answer_mask(ops, batch):
  """[b, n], True where an answer may start or end: [CLS] and the context
  (the second segment's real tokens)."""
  context = ((ops.cast(batch["input_type_ids"], "int32") == 1) &
             (ops.cast(batch["input_mask"], "int32") == 1))
  first = ops.arange(ops.length(context)) == 0
  return context | first[None, :]


def span_logits(ops, backbone, head, batch, training):
  """float32 (start_logits, end_logits) [b, n] of a SQuAD batch."""
  sequence = bert_outputs(backbone, batch, training)["sequence_output"]
  start, end = head(sequence, mask=answer_mask(ops, batch))
  return ops.cast(start, "float32"), ops.cast(end, "float32")


def span_loss(ops, start_positions, end_positions, start_logits, end_logits):
  """(CE(start) + CE(end)) / 2 per example (nats)."""
  losses = (ops.cross_entropy(start_positions,
                              ops.cast(start_logits, "float32")) +
            ops.cross_entropy(end_positions, ops.cast(end_logits, "float32")))
  return _per_example(ops, losses / 2)


def squad_loss(ops, backbone, head, batch, training):
  start, end = span_logits(ops, backbone, head, batch, training)
  return span_loss(ops, batch["start_positions"], batch["end_positions"],
                   start, end)


def recall_loss(ops, backbone, batch, training):
  """Associative recall: the values' cross-entropy where a query is
  scored. `batch`: (tokens [b, n, 2], targets [b, n], weights [b, n])."""
  tokens, targets, weights = batch
  return masked_cross_entropy(ops, targets, backbone(tokens,
                                                     training=training),
                              weights)
