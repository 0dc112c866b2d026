"""The graph of one Mesh TensorFlow training step, lowered onto a mesh.

`build(...)` makes, in a fresh `tf.Graph`, what `thattn.mtf.training` runs:
mtf's own model (a `Bitransformer`, or for masked LM an aligned
`Unitransformer`, from the run's gin config) fed a batch [batch, length]
of inputs and targets, the task's loss, mtf's
`AdafactorOptimizer` and the lowering onto `PlacementMeshImpl` (one device,
or logical CPUs laid out by thattn's rules).

The loss is the Keras backend's (`thattn.tasks.base.masked_cross_entropy`):
the sum of cross-entropies over the targets that are not padding (id 0),
divided by their count (for masked LM the targets hold the original tokens
at the masked positions and 0 elsewhere). mtf's own `Unitransformer` loss divides by every
position of the batch and adds a z-loss (1e-4 * logsumexp**2) in training;
thattn computes its loss from mtf's logits instead, so that both backends
minimize, and report, the same number.

The optimizer is Adafactor with thattn's settings (`thattn.optimizers.
Adafactor`'s defaults, golden-tested against this very class): decay
exponent 0.8, update clipping 1, epsilon1 1e-30, epsilon2 1e-3, parameter
scaling, factoring from 128, no momentum. Its learning rate is fed at every
step (the schedule's rate at the global step before the update) and the
global step is advanced after the update, as mtf's trainers do.
"""

import dataclasses

import tensorflow as tf

from thattn.mtf import compat
from thattn.mtf import layout as layout_lib
from thattn.mtf import models as mtf_models

mtf = compat.import_mesh_tensorflow()
v1 = tf.compat.v1
_TRAIN = v1.estimator.ModeKeys.TRAIN
# The held-out loss before training, saved with the model (a resumed run
# reports it): a plain TF variable in thattn's scope of the checkpoint.
INITIAL_EVAL = mtf_models.TRAINER_SCOPE + "initial_eval"


@dataclasses.dataclass
class StepGraph:
  """What the training loop runs: feeds, fetches and ops of one graph."""
  graph: tf.Graph
  inputs: tf.Tensor  # int32 [batch, input length] placeholder
  targets: tf.Tensor  # int32 [batch, target length] placeholder
  learning_rate: tf.Tensor  # float32 [] placeholder
  loss_sum: tf.Tensor  # sum of cross-entropies over non-padding targets
  count: tf.Tensor  # how many targets are not padding
  train_op: tf.Operation  # update every variable, then the global step
  global_step: tf.Variable
  initial_eval: tf.Variable
  set_initial_eval: tuple  # (float32 placeholder, op assigning it)
  initialize: list  # initializers of every variable, then the slices
  load_feeds: dict  # placeholders -> initial values of the model variables
  load_ops: list  # assign the initial values to the masters
  copy_to_slices: tf.Operation  # masters -> the slices the mesh computes on
  copy_to_masters: tf.Operation  # slices -> masters, before a save
  saver: object  # tf.compat.v1.train.Saver of the masters, slots and step
  model_type: str  # "bitransformer" or "aligned" (thattn.mtf.models.kind_of)
  variable_names: tuple  # the model's mtf variable names
  sharded: tuple  # the names of those the mesh splits
  masters: dict  # mtf variable name -> its master tf.Variable


def _masked_cross_entropy(logits, targets, targets_only=False):
  """(sum over non-padding targets, their count) as mtf scalars; with
  `targets_only` (a prefix LM), over the targets after each prefix, as
  mtf's `Unitransformer.loss_on_targets_only`."""
  vocab_dim = logits.shape.dims[-1]
  cross_entropy = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, vocab_dim, dtype=logits.dtype), vocab_dim)
  weights = mtf.layers.weights_nonzero(targets, dtype=logits.dtype)
  if targets_only:
    weights *= mtf.cast(mtf.logical_not(
        mtf_models.transformer.delimited_lm_inputs_mask(targets)),
                        logits.dtype)
  return mtf.reduce_sum(cross_entropy * weights), mtf.reduce_sum(weights)


def _optimizer(learning_rate):
  return mtf.optimize.AdafactorOptimizer(
      learning_rate=learning_rate,
      decay_rate=mtf.optimize.adafactor_decay_rate_pow(0.8), beta1=0.0,
      clipping_threshold=1.0, epsilon1=1e-30, epsilon2=1e-3,
      multiply_by_parameter_scale=True, min_dim_size_to_factor=128)


def build(*, model, batch_size, inputs_length, targets_length,
          initial_values, mesh_and_rules, seed, max_to_keep, devices=None,
          client_device=None):
  """The `StepGraph` of `model` (not yet called): an mtf Bitransformer
  (inputs: the encoder's; targets: the decoder's), or an aligned
  Unitransformer (inputs and targets of one length).

  Call inside `thattn.mtf.models.gin_scope` of the model's gin config.

  Args:
    model: from `thattn.mtf.models.build_model`, with the mesh and layout.
    batch_size, inputs_length, targets_length: the batches' shape.
    initial_values: {mtf variable name: array} loaded by `load_ops`.
    mesh_and_rules: (MeshSpec, LayoutRules), or None for one device.
    seed: the graph's random seed.
    max_to_keep: checkpoints the Saver keeps.
    devices: the device of each mesh position; None: the local CPUs.
    client_device: where everything but the slices goes (the feeds, the
      master variables, the Saver): the chief's CPU in a cluster
      (`thattn.mtf.cluster`); None: this process.
  """
  graph = tf.Graph()
  with graph.as_default(), tf.device(client_device):
    v1.set_random_seed(seed)
    # The trainer's own variables first, as mtf's trainers make them.
    global_step = v1.train.get_or_create_global_step()
    initial_eval = v1.get_variable(
        INITIAL_EVAL, [], tf.float32, trainable=False,
        initializer=v1.constant_initializer(float("nan")))
    feeds = _Feeds.make(batch_size, inputs_length, targets_length)
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    loss_sum, count, variables, update_ops = _loss_and_updates(
        model, mesh, feeds)
    mesh_spec, rules = mesh_and_rules or (None, None)
    # A dimension the mesh axis does not divide fails here, named.
    lowering, plan = layout_lib.lower(mesh, variables, mesh=mesh_spec,
                                      rules=rules, devices=devices)
    step_graph = _step_graph(
        graph=graph, feeds=feeds, lowering=lowering, variables=variables,
        global_step=global_step, initial_eval=initial_eval,
        loss_sum=loss_sum, count=count, update_ops=update_ops,
        initial_values=initial_values, max_to_keep=max_to_keep)
    step_graph.model_type = mtf_models.kind_of(model)
    step_graph.sharded = tuple(name for name, axes in plan.items()
                               if any(axes))
  graph.finalize()  # nothing is added while training
  return step_graph


@dataclasses.dataclass(frozen=True)
class _Feeds:
  """The placeholders of one step: the batch and the learning rate."""
  inputs: tf.Tensor
  targets: tf.Tensor
  learning_rate: tf.Tensor

  @classmethod
  def make(cls, batch_size, inputs_length, targets_length):
    learning_rate = v1.placeholder(tf.float32, [], "learning_rate")
    return cls(
        inputs=v1.placeholder(tf.int32, [batch_size, inputs_length],
                              "inputs"),
        targets=v1.placeholder(tf.int32, [batch_size, targets_length],
                               "targets"),
        learning_rate=learning_rate)


def _loss_and_updates(model, mesh, feeds):
  """(loss sum, count, variables, Adafactor's update ops), as mtf ops."""
  mtf_targets = mtf_models.ids_to_mtf(mesh, feeds.targets)
  logits = mtf_models.call(
      model, inputs=mtf_models.ids_to_mtf(mesh, feeds.inputs),
      targets=mtf_targets, mode=_TRAIN)
  loss_sum, count = _masked_cross_entropy(
      logits, mtf_targets,
      targets_only=getattr(model, "input_full_attention", False))
  variables = list(mesh.graph.trainable_variables)
  grads = mtf.gradients([loss_sum / count],
                        [v.outputs[0] for v in variables])
  update_ops = _optimizer(feeds.learning_rate).apply_grads(grads, variables)
  return loss_sum, count, variables, update_ops


def _step_graph(*, graph, feeds, lowering, variables, global_step,
                initial_eval, loss_sum, count, update_ops, initial_values,
                max_to_keep):
  """The lowered step's `StepGraph`."""
  update = tf.group([lowering.lowered_operation(op) for op in update_ops])
  with tf.control_dependencies([update]):
    train_op = v1.assign_add(global_step, 1).op
  load_feeds, load_ops = mtf_models.assign_ops(variables, initial_values)
  eval_value = v1.placeholder(tf.float32, [], "initial_eval_value")
  return StepGraph(
      graph=graph, inputs=feeds.inputs, targets=feeds.targets,
      learning_rate=feeds.learning_rate,
      loss_sum=lowering.export_to_tf_tensor(loss_sum),
      count=lowering.export_to_tf_tensor(count), train_op=train_op,
      global_step=global_step, initial_eval=initial_eval,
      set_initial_eval=(eval_value, v1.assign(initial_eval, eval_value)),
      initialize=[v1.global_variables_initializer()],
      load_feeds=load_feeds, load_ops=load_ops,
      copy_to_slices=lowering.copy_masters_to_slices(),
      copy_to_masters=lowering.copy_slices_to_masters(),
      # The masters (model variables and Adafactor's slots), the global
      # step and the initial eval, under their own names, as mtf saves.
      saver=v1.train.Saver(v1.global_variables(), max_to_keep=max_to_keep,
                           save_relative_paths=True),
      model_type=None, variable_names=tuple(v.name for v in variables),
      sharded=(), masters={v.name: v.get_master() for v in variables})
