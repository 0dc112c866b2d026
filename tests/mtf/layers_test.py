"""thattn.mtf.layers: the grouped talking-heads layer in mtf models via gin."""

import gin
import numpy as np
import tensorflow as tf

from thattn.mtf import compat
from thattn.mtf import layer_weights
from thattn.mtf import layers as mtf_layers

mtf = compat.import_mesh_tensorflow()
transformer = mtf_layers.transformer

GIN_CONFIG = """
make_layer_stack.layers = [
    @thattn.GroupedTalkingHeadsSelfAttention,
    @transformer_layers.DenseReluDense,
]
make_layer_stack.num_layers = 2
thattn.GroupedTalkingHeadsSelfAttention.num_heads = 4
thattn.GroupedTalkingHeadsSelfAttention.num_key_heads = 8
thattn.GroupedTalkingHeadsSelfAttention.num_value_heads = 8
thattn.GroupedTalkingHeadsSelfAttention.num_head_groups = 2
thattn.GroupedTalkingHeadsSelfAttention.key_dim = 4
thattn.GroupedTalkingHeadsSelfAttention.dynamic_projections = ["x2l"]
thattn.GroupedTalkingHeadsSelfAttention.relative_attention_type = "bias"
DenseReluDense.hidden_size = 16
# mtf's defaults.gin (T5's layer stack): pre-norm, residual.
LayerStack.sublayers_initial = [@transformer.sublayer_dropout]
LayerStack.sublayers_per_layer = [
    @transformer.sublayer_rms_norm,
    @transformer.sublayer_call_layer,
    @transformer.sublayer_dropout,
    @transformer.sublayer_residual,
]
LayerStack.sublayers_final = [
    @transformer.sublayer_rms_norm,
    @transformer.sublayer_dropout,
]
"""


def _variables_of_a_gin_language_model():
  """Builds and runs a 2-layer mtf language model configured by gin."""
  gin.clear_config()
  try:
    gin.parse_config(GIN_CONFIG)
    stack = transformer.make_layer_stack()
  finally:
    gin.clear_config()
  model = transformer.Unitransformer(
      layer_stack=stack, d_model=8, input_vocab_size=32,
      output_vocab_size=32, autoregressive=True, max_length=6)
  with tf.Graph().as_default() as graph:
    mesh_graph = mtf.Graph()
    mesh = mtf.Mesh(mesh_graph, "mesh")
    batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 6)
    ids = np.arange(12, dtype=np.int32).reshape(2, 6) % 31 + 1
    targets = mtf.import_tf_tensor(mesh, tf.constant(ids), [batch, length])
    inputs = transformer.autoregressive_inputs(targets)
    logits, loss = model.call_simple(inputs=inputs, targets=targets,
                                     compute_loss=True, mode="eval")
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        shape=[], layout={}, devices=[""])
    lowering = mtf.Lowering(mesh_graph, {mesh: mesh_impl}, autostack=False)
    fetches = [lowering.export_to_tf_tensor(logits),
               lowering.export_to_tf_tensor(loss)]
    names = {v.name: v.shape.to_integer_list
             for v in mesh_graph.trainable_variables}
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(lowering.copy_masters_to_slices())
      logits_value, loss_value = session.run(fetches)
  return names, logits_value, loss_value


def test_a_gin_config_names_the_grouped_layer_in_an_mtf_model():
  names, logits, loss = _variables_of_a_gin_language_model()
  assert logits.shape == (2, 6, 128)  # the vocabulary padded to 128
  assert np.isfinite(loss)
  scope = "transformer/block_000/layer_000/GroupedTalkingHeadsSelfAttention/"
  # Group-major blocks: P_l[G, h_k/G, h/G], P_Xl[d_model, G, h_k/G, h/G].
  assert names[scope + "logits/kernel"] == [2, 4, 2]
  assert names[scope + "logits/logits_dynamic_0/kernel"] == [8, 2, 4, 2]
  assert names[scope + "q/kernel"] == [8, 2, 4, 4]
  assert names[scope + "relative_attention_bias"] == [2, 2, 32]


def test_the_grouped_layer_maps_to_the_keras_num_head_groups_layer():
  layer = mtf_layers.GroupedTalkingHeadsSelfAttention(
      num_heads=4, key_dim=4, num_key_heads=8, num_value_heads=6,
      num_head_groups=2, dynamic_projections=["m2w"])
  keras = layer_weights.keras_layer(layer=layer, d_model=8)
  config = {k: keras.get_config()[k] for k in layer.keras_config()}
  assert config == layer.keras_config()
  assert layer.heads_dims() == (
      [("head_groups", 2), ("key_heads_per_group", 4)],
      [("head_groups", 2), ("heads_per_group", 2)],
      [("head_groups", 2), ("value_heads_per_group", 3)])


def test_one_group_names_the_dims_as_thattn_and_projections_off_share():
  layer = mtf_layers.GroupedTalkingHeadsSelfAttention(
      num_heads=4, key_dim=4, num_value_heads=6, project_logits=False)
  # No P_l in mtf: the key and softmax lists have the same names.
  assert layer.heads_dims() == ([("heads", 4)], [("heads", 4)],
                                [("value_heads", 6)])
  assert layer_weights.mtf_variable_shapes(layer=layer, d_model=8) == {
      "q/kernel": (8, 4, 4), "k/kernel": (8, 4, 4), "v/kernel": (8, 6, 4),
      "y/kernel": (6, 4, 8), "weights/kernel": (4, 6)}


def test_attention_layer_accepts_gin_names_with_and_without_modules():
  for name in ("SelfAttention", "transformer_layers.SelfAttention",
               "mesh_tensorflow.transformer.transformer_layers."
               "SelfAttention"):
    assert type(mtf_layers.attention_layer(name, num_heads=2)) is (
        mtf_layers.transformer_layers.SelfAttention)
  for name in ("thattn.GroupedTalkingHeadsEncDecAttention",
               "GroupedTalkingHeadsEncDecAttention"):
    layer = mtf_layers.attention_layer(name, num_heads=2, key_dim=4)
    assert isinstance(layer, mtf_layers.GroupedTalkingHeadsEncDecAttention)
