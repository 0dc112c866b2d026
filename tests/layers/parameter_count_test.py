"""count_params() of real layers equals the paper's "parameters per att. layer".

Every row of Tables 1, 2, 3, 8 and 9 with a number, at d_model 768 and no
biases, and thattn.core.complexity agrees with both.
"""

import pytest
import tensorflow as tf

from thattn.core import complexity
from thattn import layers

D_MODEL = 768


def _layer_for(shape):
  if shape.variant == "general_bilinear":
    return layers.GeneralBilinearAttention(shape.h)
  if shape.variant == "multi_head":
    return layers.MultiHeadAttention(shape.h, shape.d_k, value_dim=shape.d_v)
  return layers.TalkingHeadsAttention(
      shape.h, shape.d_k, value_dim=shape.d_v, num_key_heads=shape.h_k,
      num_value_heads=shape.h_v, project_logits=shape.project_logits,
      project_weights=shape.project_weights,
      dynamic_projections=shape.dynamic_projections)


@pytest.mark.parametrize(
    "row", complexity.PAPER_ROWS,
    ids=[f"table{row.table}-{row.label}" for row in complexity.PAPER_ROWS])
def test_count_params_equals_paper(row):
  layer = _layer_for(row.shape)
  layer.build_from_shapes([None, None, D_MODEL], [None, None, D_MODEL])
  assert layer.count_params() == row.parameters
  assert complexity.parameters(row.shape) == row.parameters


def test_twelve_talking_heads_add_two_h_squared():
  multi = layers.MultiHeadAttention(12, 64)
  talking = layers.TalkingHeadsAttention(12, 64)
  for layer in (multi, talking):
    layer.build_from_shapes([None, None, D_MODEL], [None, None, D_MODEL])
  assert talking.count_params() - multi.count_params() == 2 * 12 * 12


def test_biases_add_the_projection_biases():
  layer = layers.MultiHeadAttention(12, 64, use_bias=True)
  layer(tf.zeros([1, 2, D_MODEL]), tf.zeros([1, 2, D_MODEL]))
  # BERT-base's attention layer: 4 * 768 * 768 kernels + 4 * 768 biases.
  assert layer.count_params() == 4 * D_MODEL * D_MODEL + 4 * D_MODEL
