"""The Keras 3 half of `--backend=keras3`: a task's model and loss in
`keras.ops`, and one compiled step per Keras 3 backend.

`TaskLoss` is a Keras 3 layer holding the run's backbone (`thattn.keras3.
models`) and head, whose call is the task's loss as the tf_keras task
computes it: `(sum of weighted cross-entropies, sum of weights)`, in nats.
The tasks it knows are `TASKS`:

- `mlm` on BERT or ALBERT: `MaskedLMHead` at the masked positions; on a T5
  encoder: its LM logits gathered at them;
- `span_corruption` on a T5 encoder-decoder: teacher forcing, the decoder
  reading the targets shifted right after the start token 0, scored where
  the target is not padding.

`Steps` runs one train step (loss = total / max(count, 1), its gradient,
the optimizer's update) and one eval step (total, count) on NumPy batches:

- JAX: `jax.jit` of a pure function of (trainable, non-trainable,
  optimizer) values, through `stateless_call` and `stateless_apply`; the
  values live in `Steps.state` and are written back into the Keras
  variables only when asked (`sync`), before a save;
- TensorFlow: a `tf.function` with a gradient tape; PyTorch: eager autograd
  (Keras 3's own trainers do the same per backend). Their variables are
  always current.

Mixed precision: the model and head compute in the dtype policy they are
made under (`dtype_policy`), the loss in float32. Each step
differentiates `optimizer.scale_loss(loss)`, as Keras 3's trainers do: the
loss itself, but under a `keras.optimizers.LossScaleOptimizer` (float16)
the loss times its dynamic scale; that optimizer unscales the gradients
and skips a step whose gradients are not finite. A skipped step still
counts in `optimizer.iterations` (the run's step and the schedule's), as
in tf_keras's LossScaleOptimizer, where Keras 3's leaves it behind.
"""

import contextlib

import keras
from keras import ops
import numpy as np

from thattn.keras3 import models
from thattn.keras3.models import heads
from thattn.models import config as config_lib

TASKS = ("mlm", "span_corruption")
_BERT_INPUTS = ("input_word_ids", "input_mask", "input_type_ids")
_MASKED = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


@contextlib.contextmanager
def dtype_policy(mixed_precision):
  """The scope a run's `TaskLoss` is made in: for `--mixed_precision=<dtype>`
  ("bfloat16" or "float16"; "off": float32) Keras 3's global dtype policy
  `mixed_<dtype>`, float32 variables and a bfloat16 or float16
  computation; the previous global policy is restored after.

  A Keras 3 layer reads the global policy once, when it is made (its
  `dtype_policy`), so the model keeps it for the whole run and nothing
  else in the process sees it. (run.py sets tf_keras's policy, for the
  tf_keras twin, around the run the same way.)
  """
  previous = keras.config.dtype_policy()
  if mixed_precision != "off":
    keras.config.set_dtype_policy(f"mixed_{mixed_precision}")
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def masked_cross_entropy(targets, logits, weights):
  """(sum of weighted cross-entropies, sum of weights) in float32 nats."""
  losses = ops.sparse_categorical_crossentropy(
      ops.cast(targets, "int32"), ops.cast(logits, "float32"),
      from_logits=True)
  weights = ops.cast(weights, "float32")
  return ops.sum(losses * weights), ops.sum(weights)


class TaskLoss(keras.layers.Layer):
  """The loss of task `task_name` on a Keras 3 model of `config`.

  Attributes:
    backbone: the Keras 3 model (`thattn.keras3.models.build_model`).
    head: the masked-LM head of a BERT or ALBERT, else None.
    input_keys: the batch's keys the loss reads.
  """

  def __init__(self, task_name, config, pad_id=0, **kwargs):
    # float32 whatever the global dtype policy: the loss is computed in
    # float32 (as Keras keeps a model's last layer), its model and head in
    # the policy they are made under (see the module).
    kwargs.setdefault("dtype", "float32")
    super().__init__(name="task_loss", **kwargs)
    if task_name not in TASKS:
      raise ValueError(f"--backend=keras3 trains the tasks {', '.join(TASKS)}"
                       f"; got --task={task_name}.")
    self.task_name, self.pad_id = task_name, pad_id
    self.backbone = models.build_model(config)
    self.head = None
    t5 = isinstance(config, config_lib.T5Config)
    if task_name == "span_corruption":
      self.input_keys = ("inputs", "targets")
    elif t5:
      self.input_keys = ("input_word_ids",) + _MASKED
    else:
      self.input_keys = _BERT_INPUTS + _MASKED
      self.head = heads.MaskedLMHead(
          self.backbone.get_layer("word_embeddings"),
          activation=config.activation,
          initializer_range=config.initializer_range,
          layer_norm_epsilon=config.layer_norm_epsilon, name="masked_lm")
      self.head.build((None, None, config.d_model))
    self.built = True  # the functional backbone and the head hold every weight

  def call(self, batch, training=False):
    if self.task_name == "span_corruption":
      targets = batch["targets"]
      decoder_inputs = ops.pad(targets[:, :-1], [[0, 0], [1, 0]])
      logits = self.backbone({"encoder_input_tokens": batch["inputs"],
                              "decoder_input_tokens": decoder_inputs},
                             training=training)
      return masked_cross_entropy(targets, logits,
                                  ops.not_equal(targets, self.pad_id))
    if self.head is None:  # a T5 encoder: its LM logits at the positions
      logits = self.backbone({"encoder_input_tokens":
                              batch["input_word_ids"]}, training=training)
      logits = ops.take_along_axis(
          logits, ops.expand_dims(batch["masked_lm_positions"], -1), axis=1)
    else:
      outputs = self.backbone({key: batch[key] for key in _BERT_INPUTS},
                              training=training)
      logits = self.head(outputs["sequence_output"],
                         batch["masked_lm_positions"])
    return masked_cross_entropy(batch["masked_lm_ids"], logits,
                                batch["masked_lm_weights"])


def mean_loss(total, count):
  """The loss a step differentiates: the mean over the weighted positions
  (the Keras backend's, on one replica)."""
  return total / ops.maximum(count, 1.0)


class Steps:
  """The compiled train and eval steps of a `TaskLoss`; see the module."""

  def __init__(self, task_loss, optimizer, batch_layout=None):
    """`batch_layout(shape)`: the `keras.distribution.TensorLayout` of a
    batch's array on a mesh (JAX), or None to leave batches in host memory."""
    self.task_loss, self.optimizer = task_loss, optimizer
    self.batch_layout = batch_layout
    self.backend = keras.backend.backend()
    optimizer.build(task_loss.trainable_variables)
    # Where the step count is in optimizer.variables, if a step can be
    # skipped (see the module); else None.
    self._iterations_index = None
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
      self._iterations_index = [id(v) for v in optimizer.variables].index(
          id(optimizer.iterations))
    if self.backend == "jax":
      self._init_jax()
    elif self.backend == "tensorflow":
      self._init_tensorflow()
    else:
      self.train_step, self.eval_step = self._torch_train, self._torch_eval

  def inputs(self, batch):
    """The batch's arrays the loss reads, as int32 NumPy (float32 weights),
    split over the mesh's batch axis where there is one."""
    arrays = {key: np.asarray(batch[key]).astype(
        "float32" if key == "masked_lm_weights" else "int32")
              for key in self.task_loss.input_keys}
    if self.batch_layout is None:
      return arrays
    return {key: keras.distribution.distribute_tensor(
        array, self.batch_layout(array.shape))
            for key, array in arrays.items()}

  # JAX: pure functions of the values, compiled once.
  def _init_jax(self):
    import jax  # pylint: disable=g-import-not-at-top
    self.state = self._values()
    loss_layer, optimizer = self.task_loss, self.optimizer
    shardings = (None if self.batch_layout is None else
                 jax.tree.map(lambda value: value.sharding, self.state))

    def train(state, batch):
      trainable, non_trainable, optimizer_values = state

      def loss_of(values):
        (total, count), updated = loss_layer.stateless_call(
            values, non_trainable, batch, training=True)
        loss = mean_loss(total, count)
        with keras.StatelessScope(state_mapping=list(zip(
            optimizer.variables, optimizer_values))):  # the current scale
          return optimizer.scale_loss(loss), (loss, updated)

      (_, (loss, non_trainable)), grads = jax.value_and_grad(
          loss_of, has_aux=True)(trainable)
      counted = list(optimizer_values)
      trainable, optimizer_values = optimizer.stateless_apply(
          optimizer_values, grads, trainable)
      if self._iterations_index is not None:  # a skipped step counts too
        optimizer_values = list(optimizer_values)
        optimizer_values[self._iterations_index] = (
            counted[self._iterations_index] + 1)
      state = (trainable, non_trainable, optimizer_values)
      if shardings is not None:  # outputs laid out as the inputs: one compile
        state = jax.tree.map(jax.lax.with_sharding_constraint, state,
                             shardings)
      return state, loss

    def evaluate(state, batch):
      (total, count), _ = loss_layer.stateless_call(
          state[0], state[1], batch, training=False)
      return total, count

    train, evaluate = jax.jit(train, donate_argnums=0), jax.jit(evaluate)

    def train_step(batch):
      self.state, loss = train(self.state, self.inputs(batch))
      return float(loss)

    self.train_step = train_step
    self.eval_step = lambda batch: evaluate(self.state, self.inputs(batch))

  def _values(self):
    layer = self.task_loss
    return ([v.value for v in layer.trainable_variables],
            [v.value for v in layer.non_trainable_variables],
            [v.value for v in self.optimizer.variables])

  def sync(self):
    """Writes the compiled step's values into the Keras variables (JAX)."""
    if self.backend != "jax":
      return
    layer = self.task_loss
    for variables, values in zip(
        (layer.trainable_variables, layer.non_trainable_variables,
         self.optimizer.variables), self.state):
      for variable, value in zip(variables, values):
        variable.assign(value)

  def reload(self):
    """Reads the Keras variables into the compiled step (after a restore)."""
    if self.backend == "jax":
      self.state = self._values()

  # TensorFlow: one tf.function; PyTorch: eager.
  def _init_tensorflow(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    layer, optimizer = self.task_loss, self.optimizer

    def train(batch):
      with tf.GradientTape() as tape:
        loss = mean_loss(*layer(batch, training=True))
        scaled = optimizer.scale_loss(loss)
      variables = layer.trainable_variables
      # Embedding lookups give IndexedSlices; Adafactor's second moments
      # need the dense gradient (tf_keras's Adafactor densifies them too).
      gradients = [tf.convert_to_tensor(gradient)
                   for gradient in tape.gradient(scaled, variables)]
      if self._iterations_index is None:
        optimizer.apply(gradients, variables)
      else:  # a skipped step counts too
        step = tf.identity(optimizer.iterations.value)
        optimizer.apply(gradients, variables)
        optimizer.iterations.assign(step + 1)
      return loss

    train = tf.function(train, autograph=False)
    evaluate = tf.function(lambda batch: layer(batch, training=False),
                           autograph=False)
    self.train_step = lambda batch: float(train(self.inputs(batch)))
    self.eval_step = lambda batch: evaluate(self.inputs(batch))

  def _torch_train(self, batch):
    layer = self.task_loss
    variables = layer.trainable_variables
    for variable in variables:
      variable.value.grad = None
    loss = mean_loss(*layer(self.inputs(batch), training=True))
    self.optimizer.scale_loss(loss).backward()
    gradients = [v.value.grad for v in variables]
    if self._iterations_index is None:
      self.optimizer.apply(gradients, variables)
    else:  # a skipped step counts too
      step = int(ops.convert_to_numpy(self.optimizer.iterations))
      self.optimizer.apply(gradients, variables)
      self.optimizer.iterations.assign(step + 1)
    return float(ops.convert_to_numpy(loss))

  def _torch_eval(self, batch):
    import torch  # pylint: disable=g-import-not-at-top
    with torch.no_grad():  # no graph kept for a backward pass
      return self.task_loss(self.inputs(batch), training=False)

  def evaluate(self, batches):
    """Mean loss over every weighted position of `batches` (tf.data)."""
    total = count = 0.0
    for batch in batches.as_numpy_iterator():
      batch_total, batch_count = self.eval_step(batch)
      total += float(ops.convert_to_numpy(batch_total))
      count += float(ops.convert_to_numpy(batch_count))
    return total / max(count, 1.0)
