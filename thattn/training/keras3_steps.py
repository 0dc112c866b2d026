"""The Keras 3 half of `--backend=keras3`: a task's model and loss in
`keras.ops`, and one compiled step per Keras 3 backend.

`TaskLoss` is a Keras 3 layer holding the run's backbone (`thattn.keras3.
models`) and head, whose call is the task's loss as the tf_keras task
computes it. What a task is lives in its own module (`thattn.tasks`): its
Keras 3 model and head (`Task.keras3_parts`), the arrays its loss reads
(`input_dtypes`), its loss and metric outputs over an ops namespace
(`loss_of`, `metric_outputs_of`, written once for both front ends); this
module names no task.

`Steps` runs one train step (loss = total / max(count, 1), its gradient,
the optimizer's update), one eval step (total, count) and the outputs the
task's metrics read (`predict`) on NumPy batches:

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

from thattn.keras3.models import front_end


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


class TaskLoss(keras.layers.Layer):
  """The loss of a task on a Keras 3 model, as the task writes it for both
  front ends (`thattn.tasks.base.Task`'s Keras 3 class methods).

  Args:
    task: the task's class (`thattn.tasks.get(name)`), one that
      `trains_on_keras3`.
    config: the backbone's `BertConfig` or `T5Config`; for recall, the
      `RecallEncoder`'s keywords (the task's `keras3_options` give them).
    pad_id: the tokenizer's padding id (span corruption scores the rest).
    head_config: the head's keywords (classification's: num_classes,
      dropout_rate).

  Attributes:
    backbone: the Keras 3 model (`thattn.keras3.models.build_model`, or a
      `RecallEncoder`).
    head: the task's head (`thattn.keras3.models.heads`), or None.
    input_keys: the batch's keys the loss reads; `input_dtypes` theirs.
  """

  def __init__(self, task, config, pad_id=0, head_config=None, **kwargs):
    # float32 whatever the global dtype policy: the loss is computed in
    # float32 (as Keras keeps a model's last layer), its model and head in
    # the policy they are made under (see the module).
    kwargs.setdefault("dtype", "float32")
    super().__init__(name="task_loss", **kwargs)
    if not task.trains_on_keras3():
      raise ValueError(f"--task={task.name} has no Keras 3 model; it trains "
                       "with --backend=keras.")
    self.task_name, self.pad_id = task.name, pad_id
    # The task's functions, not the class: Keras tracks a layer's
    # attributes, and the task is not one of its objects.
    self._loss_of = task.loss_of
    self._metric_outputs_of = task.metric_outputs_of
    self.backbone, self.head = task.keras3_parts(config, head_config or {})
    self.input_dtypes = task.input_dtypes(config, self.head)
    self.input_keys = tuple(self.input_dtypes)
    self.built = True  # the backbone and the head hold every weight

  def metric_outputs(self, batch):
    """The outputs the task's metrics read (`thattn.tasks.base.Task.
    metric_outputs`, the tf_keras model's the same): a tuple, in float32
    whatever the policy."""
    outputs = self._metric_outputs_of(front_end.KERAS3_OPS, self.backbone,
                                      self.head, batch)
    return tuple(ops.cast(output, "float32") for output in outputs)

  def call(self, batch, training=False):
    return self._loss_of(front_end.KERAS3_OPS, self.backbone, self.head,
                         batch, training, pad_id=self.pad_id)


def process_rows(sharding, shape):
  """The slice of a batch's rows (axis 0) that this process's devices hold
  under `sharding` (a JAX sharding): contiguous, as a mesh's batch axis
  lays them out; every row where the batch is not split across
  processes."""
  spans = [index[0].indices(shape[0]) if index else (0, shape[0], 1)
           for index in sharding.addressable_devices_indices_map(
               tuple(shape)).values()]
  return slice(min(start for start, _, _ in spans),
               max(stop for _, stop, _ in spans))


def host_value(value):
  """A step's output as NumPy. Across JAX processes an output replicated
  over the mesh is not wholly addressable from one process; its first
  local copy is the whole value."""
  if not getattr(value, "is_fully_addressable", True):
    value = value.addressable_data(0)
  return ops.convert_to_numpy(value)


def whole_value(value):
  """A step's output as one NumPy array on this process; across JAX
  processes, gathered from every process's shards where it spans
  several (a collective: every process calls it)."""
  if getattr(value, "is_fully_addressable", True):
    return ops.convert_to_numpy(value)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(value, tiled=True))


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
    self.processes = 1
    if self.backend == "jax":
      import jax  # pylint: disable=g-import-not-at-top
      self.processes = jax.process_count()
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
      self.output_step = self._torch_outputs

  def inputs(self, batch):
    """The batch's arrays the loss reads, as int32 NumPy (float32 weights
    and regression labels), split over the mesh's batch axis where there
    is one."""
    keys, dtypes = self.task_loss.input_keys, self.task_loss.input_dtypes
    if not isinstance(batch, dict):  # a tuple in `keys`' order, or one array
      batch = dict(zip(keys, batch if isinstance(batch, (tuple, list)) else
                       (batch,)))
    arrays = {key: np.asarray(batch[key]).astype(dtypes[key]) for key in keys}
    if self.batch_layout is None:
      return arrays
    return {key: self._global_array(array) for key, array in arrays.items()}

  def _global_array(self, array):
    """A batch's array laid out on the mesh. Across processes each process
    gives only the rows its devices hold (`process_rows`), and JAX
    assembles the global array from every process's."""
    layout = self.batch_layout(array.shape)
    if self.processes == 1:
      return keras.distribution.distribute_tensor(array, layout)
    import jax  # pylint: disable=g-import-not-at-top
    sharding = layout.backend_layout
    return jax.make_array_from_process_local_data(
        sharding, array[process_rows(sharding, array.shape)], array.shape)

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

    def outputs(state, batch):
      trainable, non_trainable, _ = state
      with keras.StatelessScope(state_mapping=list(zip(
          loss_layer.trainable_variables, trainable)) + list(zip(
              loss_layer.non_trainable_variables, non_trainable))):
        return loss_layer.metric_outputs(batch)

    train, evaluate = jax.jit(train, donate_argnums=0), jax.jit(evaluate)
    outputs = jax.jit(outputs)
    self.output_step = lambda batch: outputs(self.state, self.inputs(batch))

    def train_step(batch):
      self.state, loss = train(self.state, self.inputs(batch))
      return float(host_value(loss))

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
      # A weight the task's loss does not read (SQuAD's and masked LM's
      # unused pooler) gets zeros, as JAX's gradient gives it, not None.
      gradients = [
          tf.zeros_like(variable.value) if gradient is None else
          tf.convert_to_tensor(gradient)
          for variable, gradient in zip(variables,
                                        tape.gradient(scaled, variables))]
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
    outputs = tf.function(layer.metric_outputs, autograph=False)
    self.output_step = lambda batch: outputs(self.inputs(batch))
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

  def _torch_outputs(self, batch):
    import torch  # pylint: disable=g-import-not-at-top
    with torch.no_grad():
      return self.task_loss.metric_outputs(self.inputs(batch))

  def predict(self, batch):
    """The task's metric outputs (`TaskLoss.metric_outputs`) of one NumPy
    batch, as NumPy arrays (across processes, whole on every one)."""
    return tuple(whole_value(output) for output in self.output_step(batch))

  def evaluate(self, batches):
    """Mean loss over every weighted position of `batches` (tf.data)."""
    total = count = 0.0
    for batch in batches.as_numpy_iterator():
      batch_total, batch_count = self.eval_step(batch)
      total += float(host_value(batch_total))
      count += float(host_value(batch_count))
    return total / max(count, 1.0)
