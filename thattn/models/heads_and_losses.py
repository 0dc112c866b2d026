"""What each task adds to a model, written once for both front ends: its
head's computation and its loss, over `TaskOps`, the handful of tensor
functions they use (`thattn.models.front_end.TF_KERAS_OPS` in TensorFlow,
`thattn.keras3.models.front_end.KERAS3_OPS` in `keras.ops`). Plain
Python: nothing here imports a framework.

The heads (letters as in `thattn.core.dims`; p counts the masked
positions, e is the embedding width, c the classes), called by each front
end's head classes with their layers:

- `masked_lm_logits`, BERT's masked-LM output layer, tied to the word
  embeddings E (Devlin et al., 2019, and the released code):
      H[b, p, d] = gather(X[b, n, d], positions[b, p])
      T[b, p, e] = LayerNorm(act(H W_t + b_t))
      logits[b, p, t] = einsum(T[b, p, e], E[t, e]) + bias[t]
- `classification_logits`: logits[b, c] = dropout(pooled[b, d]) W + b,
  after an optional Dense+tanh pooler; regression (c = 1) returns [b];
- `split_span_logits` (SQuAD): start and end logits [b, n] of X[b, n, d]
  W[d, 2] + b, -1e9 where no answer may start or end;
- `recall_logits`: the recall task's whole model.

The losses: each task's `(sum of losses, count)` in float32 nats, so that
a mean over batches or replicas weighs every position or example alike
(the run drivers divide), from the backbone, the head and a batch:
`masked_lm_loss`, `span_corruption_loss`, `classification_loss`,
`squad_loss`, `recall_loss`.
"""

import collections

from thattn.models import wiring

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
# Each front end's head classes (thattn.tasks' on tf_keras, thattn.keras3.
# models.heads and recall_encoder on Keras 3) hold their arguments, layers
# and configs, and call these.


def masked_lm_logits(ops, sequence_output, positions, transform, act, norm,
                     embedding, output_bias):
  """BERT's masked-LM output at the masked positions, float32 [b, p, t]:

      H[b, p, d] = gather(X[b, n, d], positions[b, p])
      T[b, p, e] = norm(act(transform(H)))
      logits[b, p, t] = einsum(T, E[t, e]) + bias[t]   (E: `embedding`'s)
  """
  hidden = norm(act(transform(ops.gather_positions(sequence_output,
                                                   positions))))
  logits = embedding(hidden, mode="logits")
  return logits + ops.cast(output_bias, "float32")


def classification_logits(pooled_output, pooler_dense, dropout, out_proj,
                          num_classes, training=None):
  """logits[b, c] = dropout(pooled[b, d]) W + b, after `pooler_dense` (a
  Dense+tanh, or None); regression (c = 1) returns predictions [b]."""
  x = pooled_output
  if pooler_dense is not None:
    x = pooler_dense(x)
  logits = out_proj(dropout(x, training=training))
  return logits[:, 0] if num_classes == 1 else logits


def split_span_logits(ops, logits, mask, dtype):
  """(start_logits, end_logits) [b, n] from logits [b, n, 2]; with a
  boolean `mask` [b, n], -1e9 where it is False."""
  if mask is not None:
    excluded = 1.0 - ops.cast(mask, dtype)
    logits = logits + excluded[..., None] * -1e9  # not in place (torch)
  return logits[..., 0], logits[..., 1]


def recall_logits(ops, tokens, key_embedding, value_embedding,
                  position_bias, encoder_blocks, final_norm, classifier,
                  training=None):
  """The recall model's value logits [b, n, num_values] for (key, value)
  tokens [b, n, 2]: x = E_key[key] + E_value[value]; per block of
  `encoder_blocks` (dicts of its layers; T5-style pre-norm, one relative
  position bias B for all blocks)
      x = x + attention(norm(x), norm(x), position_bias=B)
      x = x + ff_out(relu(ff_in(norm(x))))
  then the final norm and the classifier."""
  x = key_embedding(tokens[..., 0]) + value_embedding(tokens[..., 1])
  length = ops.length(tokens)
  bias = position_bias(query_length=length, memory_length=length)
  # `x = x + ...`, never `x += ...`: on PyTorch `+=` adds in place, into a
  # tensor autograd keeps for the backward pass.
  for block in encoder_blocks:
    normed = block["attention_norm"](x)
    x = x + block["attention"](normed, normed, position_bias=bias,
                               training=training)
    x = x + block["ff_out"](block["ff_in"](block["ff_norm"](x)))
  return classifier(final_norm(x))


def recall_hyperparameters(num_keys, num_values, attention, num_layers,
                           d_model, num_heads, key_dim, d_ff):
  """The recall model's arguments with their defaults filled in (key_dim
  d_model / h, d_ff 4 d_model): its config on both front ends."""
  return dict(num_keys=num_keys, num_values=num_values, attention=attention,
              num_layers=num_layers, d_model=d_model, num_heads=num_heads,
              key_dim=key_dim or max(1, d_model // num_heads),
              d_ff=d_ff or 4 * d_model)


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
  return backbone({key: batch[key] for key in wiring.BERT_INPUTS},
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


def causal_lm_loss(ops, backbone, batch, training):
  """Next-token prediction over packed rows: the decoder-only LM reads the
  `inputs` and is scored on every `targets` token (a packed row has no
  padding; documents are separated by the end token, which is scored)."""
  targets = batch["targets"]
  logits = backbone({"decoder_input_tokens": batch["inputs"]},
                    training=training)
  weights = ops.cast(ops.ones_like(targets), "float32")
  return masked_cross_entropy(ops, targets, logits, weights)


def prefix_lm_loss(ops, backbone, batch, training):
  """The T5 paper's prefix LM: a prefix LM (`prefix_lm=True`) reads the
  `inputs` with `causal_attention` (1 over the prefix region, which
  attends both ways) and is scored on the target's tokens alone
  (`loss_weights`), as Mesh TensorFlow's `loss_on_targets_only`."""
  logits = backbone({"decoder_input_tokens": batch["inputs"],
                     "decoder_causal_attention": batch["causal_attention"]},
                    training=training)
  weights = ops.cast(batch["loss_weights"], "float32")
  return masked_cross_entropy(ops, batch["targets"], logits, weights)


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
