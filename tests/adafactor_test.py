"""thattn.optimizers.Adafactor against Mesh TensorFlow's AdafactorOptimizer.

The golden test runs mtf's optimizer for real: mtf variables on a one-device
placement mesh, the same gradients fed each step, the update ops lowered to a
tf.compat.v1 graph and run in a Session.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from thattn import optimizers
from thattn.mtf import compat

STEPS = 6
# Each step's gradient scale; the jumps make update clipping act.
GRAD_SCALES = (1.0, 10.0, 0.1, 3.0, 30.0, 1.0)
ULPS = 4
# Shapes for min_dim_size_to_factor=128, with the axes mtf factors over.
SHAPES = (
    (256, 130),       # factored over axes 0 and 1
    (128, 300),       # factored, largest axis last
    (3, 160, 136),    # rank 3, factored over axes 1 and 2
    (130, 4, 130),    # rank 3, a tie for largest: axes 0 and 2
    (200, 100),       # rank 2, second largest < 128: unfactored
    (5, 7),           # small: unfactored
    (9,),             # vector
    (),               # scalar
)
# Shapes for min_dim_size_to_factor=4, where ties for second place decide
# which axes are factored (mtf: a stable sort, so the earlier axis wins).
TIED_SHAPES = (
    (6, 5, 5),        # axes 0 and 1, not 0 and 2
    (5, 6, 5),        # axes 1 and 0
    (4, 4, 4),        # axes 0 and 1
    (3, 5, 2, 5),     # rank 4: axes 1 and 3
    (3, 5),           # second largest < 4: unfactored
)


def _problem(shapes, seed=0):
  rng = np.random.default_rng(seed)
  initial = [rng.standard_normal(shape).astype(np.float32) * 0.05
             for shape in shapes]
  initial[-2][...] = 0.0  # zero-initialized: the parameter scale is epsilon2
  grads = [[(rng.standard_normal(shape) * scale).astype(np.float32)
            for shape in shapes] for scale in GRAD_SCALES]
  return initial, grads


def _learning_rate(kind):
  if kind == "schedule":
    return optimizers.InverseSqrtSchedule(warmup_steps=2, scale=0.05)
  return 0.01


def _mtf_values(initial, grads, *, learning_rate, beta1,
                multiply_by_parameter_scale, min_dim_size_to_factor):
  """Runs mtf's AdafactorOptimizer; returns each step's variable values."""
  mtf = compat.import_mesh_tensorflow()
  v1 = tf.compat.v1
  with tf.Graph().as_default() as graph:
    global_step = v1.train.get_or_create_global_step()
    if callable(learning_rate):
      learning_rate = learning_rate(global_step)
    mesh_graph = mtf.Graph()
    mesh = mtf.Mesh(mesh_graph, "mesh")
    optimizer = mtf.optimize.AdafactorOptimizer(
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        learning_rate=learning_rate,
        decay_rate=mtf.optimize.adafactor_decay_rate_pow(0.8),
        beta1=beta1, clipping_threshold=1.0, epsilon1=1e-30, epsilon2=1e-3,
        min_dim_size_to_factor=min_dim_size_to_factor)
    placeholders, variables, update_ops = [], [], []
    for i, value in enumerate(initial):
      shape = mtf.Shape([mtf.Dimension(f"w{i}_{axis}", size)
                         for axis, size in enumerate(value.shape)])
      variable = mtf.get_variable(
          mesh, f"w{i}", shape,
          initializer=v1.constant_initializer(value)).operation
      placeholder = v1.placeholder(tf.float32, value.shape)
      grad = mtf.import_tf_tensor(mesh, placeholder, shape)
      update_ops += optimizer.apply_grad(grad, variable)
      placeholders.append(placeholder)
      variables.append(variable)
    lowering = mtf.Lowering(
        mesh_graph,
        {mesh: mtf.placement_mesh_impl.PlacementMeshImpl(
            shape=[], layout={}, devices=[""])},
        autostack=False)
    train_op = tf.group([lowering.lowered_operation(op) for op in update_ops])
    increment = v1.assign_add(global_step, 1)
    initialize = [v1.global_variables_initializer(),
                  lowering.copy_masters_to_slices()]
    copy_to_masters = lowering.copy_slices_to_masters()
    masters = [variable.get_master() for variable in variables]
    values = []
    with v1.Session(graph=graph) as session:
      session.run(initialize)
      for step_grads in grads:
        # Run the step, then advance the step it reads, as mtf's trainers do.
        session.run(train_op, dict(zip(placeholders, step_grads)))
        session.run(increment)
        session.run(copy_to_masters)
        values.append(session.run(masters))
  return values


def _thattn_values(initial, grads, *, learning_rate, beta1,
                   multiply_by_parameter_scale, min_dim_size_to_factor):
  variables = [tf.Variable(value) for value in initial]
  optimizer = optimizers.Adafactor(
      learning_rate, beta1=beta1,
      multiply_by_parameter_scale=multiply_by_parameter_scale,
      min_dim_size_to_factor=min_dim_size_to_factor)
  values = []
  for step_grads in grads:
    optimizer.apply_gradients(
        zip([tf.constant(g) for g in step_grads], variables))
    values.append([variable.numpy() for variable in variables])
  return values


def _assert_matches_mesh_tensorflow(shapes, lr_kind, **kwargs):
  initial, grads = _problem(shapes)
  expected = _mtf_values(initial, grads, learning_rate=_learning_rate(lr_kind),
                         **kwargs)
  actual = _thattn_values(initial, grads,
                          learning_rate=_learning_rate(lr_kind), **kwargs)
  for step in range(STEPS):
    for i, shape in enumerate(shapes):
      want, got = expected[step][i], actual[step][i]
      before = initial[i] if step == 0 else expected[step - 1][i]
      where = f"step {step + 1}, shape {shape}"
      # float32 rounding: within ULPS units in the last place of the
      # variable's largest entry. The same formulas run in the same order;
      # tf.reduce_mean and mtf's reduce_sum * (1/n) may differ in the last bit.
      tolerance = ULPS * np.spacing(np.max(np.abs(want)).astype(np.float32))
      # Each step moves the variable by far more than that tolerance.
      assert np.max(np.abs(want - before)) > 25 * tolerance, where
      np.testing.assert_allclose(got, want, rtol=0, atol=tolerance,
                                 err_msg=where)


@pytest.mark.parametrize("beta1,multiply_by_parameter_scale,lr_kind", [
    (0.0, True, "constant"),
    (0.9, True, "schedule"),
    (0.0, False, "schedule"),
    (0.9, False, "constant"),
])
def test_matches_mesh_tensorflow(beta1, multiply_by_parameter_scale, lr_kind):
  _assert_matches_mesh_tensorflow(
      SHAPES, lr_kind, beta1=beta1,
      multiply_by_parameter_scale=multiply_by_parameter_scale,
      min_dim_size_to_factor=128)


def test_matches_mesh_tensorflow_on_ties_for_the_factored_axes():
  _assert_matches_mesh_tensorflow(
      TIED_SHAPES, "schedule", beta1=0.5, multiply_by_parameter_scale=True,
      min_dim_size_to_factor=4)


def test_slots_are_factored():
  kernel = tf.Variable(tf.zeros([1024, 512]))
  optimizer = optimizers.Adafactor(0.01)
  optimizer.build([kernel])
  floats = sum(int(np.prod(v.shape)) for v in optimizer.variables)
  assert floats < 2000, floats  # vr [512] + vc [1024] + the step counter
  assert sorted(tuple(v.shape) for v in optimizer.variables
                if v.shape.rank) == [(512,), (1024,)]


def test_momentum_slot_and_unfactored_slot_shapes():
  kernel = tf.Variable(tf.zeros([5, 7]))
  optimizer = optimizers.Adafactor(0.01, beta1=0.9)
  optimizer.build([kernel])
  assert sorted(tuple(v.shape) for v in optimizer.variables
                if v.shape.rank) == [(5, 7), (5, 7)]


def test_model_fit_lowers_the_loss():
  tf_keras.utils.set_random_seed(0)
  x = np.random.default_rng(1).standard_normal((256, 128)).astype(np.float32)
  y = np.tanh(x[:, :8] @ np.ones((8, 1), np.float32))
  model = tf_keras.Sequential([
      tf_keras.layers.Dense(130, activation="relu"),  # factored kernel
      tf_keras.layers.Dense(1)])
  model.compile(optimizer=optimizers.Adafactor(
      optimizers.InverseSqrtSchedule(warmup_steps=10, scale=0.1)), loss="mse")
  history = model.fit(x, y, batch_size=32, epochs=5, verbose=0)
  losses = history.history["loss"]
  assert losses[-1] < 0.5 * losses[0], losses
  assert int(model.optimizer.iterations) == 5 * 8


def test_custom_loop_in_tf_function():
  variable = tf.Variable(tf.ones([4, 3]))
  optimizer = optimizers.Adafactor(0.1, beta1=0.5)

  @tf.function
  def train_step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(variable))
    optimizer.apply_gradients(
        [(tape.gradient(loss, variable), variable)])
    return loss

  first = float(train_step())
  for _ in range(20):
    last = float(train_step())
  assert last < 0.5 * first, (first, last)


def test_get_config_round_trip():
  optimizer = optimizers.Adafactor(
      optimizers.InverseSqrtSchedule(100, 1000), decay_rate=0.5, beta1=0.9,
      clipping_threshold=None, multiply_by_parameter_scale=False,
      min_dim_size_to_factor=32, epsilon1=1e-20, epsilon2=1e-4, clipnorm=2.0)
  clone = tf_keras.optimizers.deserialize(
      tf_keras.optimizers.serialize(optimizer))
  assert isinstance(clone, optimizers.Adafactor)
  assert clone.get_config() == optimizer.get_config()
  assert clone.get_config()["decay_rate"] == 0.5
  assert isinstance(clone._learning_rate, optimizers.InverseSqrtSchedule)
  constant = optimizers.Adafactor(0.25)
  assert np.isclose(optimizers.Adafactor.from_config(
      constant.get_config()).get_config()["learning_rate"], 0.25)


def _train(optimizer, variables, grads):
  for step_grads in grads:
    optimizer.apply_gradients(
        zip([tf.constant(g) for g in step_grads], variables))


def test_checkpoint_restores_slots_and_continues_identically(tmp_path):
  initial, grads = _problem(SHAPES, seed=3)
  variables = [tf.Variable(value) for value in initial]
  optimizer = optimizers.Adafactor(0.01, beta1=0.9)
  _train(optimizer, variables, grads[:3])
  path = tf.train.Checkpoint(optimizer=optimizer, variables=variables).save(
      str(tmp_path / "ckpt"))

  restored_variables = [tf.Variable(tf.zeros_like(value)) for value in initial]
  restored = optimizers.Adafactor(0.01, beta1=0.9)
  tf.train.Checkpoint(optimizer=restored, variables=restored_variables
                      ).restore(path).assert_existing_objects_matched()
  restored.build(restored_variables)  # slots appear and take saved values
  assert int(restored.iterations) == 3
  assert len(restored.variables) == len(optimizer.variables)
  for saved, loaded in zip(optimizer.variables, restored.variables):
    assert saved.shape == loaded.shape
    np.testing.assert_array_equal(loaded.numpy(), saved.numpy())

  _train(optimizer, variables, grads[3:])
  _train(restored, restored_variables, grads[3:])
  for a, b in zip(variables, restored_variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kwargs,message", [
    ({"learning_rate": -0.1}, r"learning_rate must be >= 0, got -0.1"),
    ({"decay_rate": 1.5}, r"decay_rate .* must be in \(0, 1\], got 1.5"),
    ({"decay_rate": 0.0}, r"decay_rate .* got 0.0"),
    ({"beta1": 1.0}, r"beta1 must be in \[0, 1\), got 1.0"),
    ({"beta1": -0.1}, r"beta1 must be in \[0, 1\), got -0.1"),
    ({"clipping_threshold": 0.0}, r"clipping_threshold must be > 0 or None"),
    ({"min_dim_size_to_factor": 0}, r"min_dim_size_to_factor .* got 0"),
    ({"min_dim_size_to_factor": 1.5}, r"min_dim_size_to_factor .* got 1.5"),
    ({"epsilon1": 0.0}, r"epsilon1 must be > 0, got 0.0"),
    ({"epsilon2": -1e-3}, r"epsilon2 must be >= 0, got -0.001"),
])
def test_bad_arguments(kwargs, message):
  kwargs = {"learning_rate": 0.01, **kwargs}
  with pytest.raises(ValueError, match=message):
    optimizers.Adafactor(**kwargs)
