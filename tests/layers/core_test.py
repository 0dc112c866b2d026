"""`core.choose_path` follows the table in thattn/layers/core.py."""

import pytest
import tensorflow as tf

from thattn.layers import core
from thattn.layers import talking_heads

FLOAT32 = tf.zeros([1, 2, 2, 3])
BFLOAT16 = tf.zeros([1, 2, 2, 3], tf.bfloat16)
FLOAT64 = tf.zeros([1, 2, 2, 3], tf.float64)


def _path(**overrides):
  arguments = dict(chunk_size=None, return_scores=False, dropout_rate=0.0,
                   training=None, fused_kernel=None, dynamic_projections=(),
                   head_groups=1, scores_like=FLOAT32,
                   projections=(tf.eye(2), tf.eye(2)), owner="layer")
  arguments.update(overrides)
  return core.choose_path(**arguments)


@pytest.mark.parametrize("overrides, chunked", [
    ({}, False),
    ({"chunk_size": 4}, True),
    ({"chunk_size": 4, "return_scores": True}, False),
    # Dynamic projections chunk through the kernel only.
    ({"chunk_size": 4, "dynamic_projections": ("x2l",)}, True),
    ({"chunk_size": 4, "dynamic_projections": ("x2l",),
      "fused_kernel": False}, False),
    ({"chunk_size": 4, "dynamic_projections": ("x2l",),
      "scores_like": FLOAT64}, False),
    ({"chunk_size": 4, "dropout_rate": 0.1, "training": True}, False),
    ({"chunk_size": 4, "dropout_rate": 0.1, "training": False}, True),
    ({"chunk_size": 4, "dropout_rate": 0.1, "training": None}, True),
    ({"chunk_size": 4, "head_groups": 2}, True),
])
def test_when_the_chunked_core_runs(overrides, chunked):
  assert _path(**overrides).chunked is chunked


@pytest.mark.parametrize("overrides, fused", [
    ({}, True),
    ({"chunk_size": 4}, True),
    ({"fused_kernel": False}, False),
    ({"dynamic_projections": ("m2w",)}, True),
    ({"dynamic_projections": ("x2l", "m2w"), "chunk_size": 4}, True),
    ({"head_groups": 2}, True),
    ({"head_groups": 2, "chunk_size": 4}, True),
    ({"head_groups": 2, "dynamic_projections": ("x2l",)}, False),
    ({"scores_like": BFLOAT16}, True),  # mixed precision
    ({"scores_like": FLOAT64}, False),
])
def test_when_the_kernel_runs(overrides, fused):
  assert _path(**overrides).fused is fused


@pytest.mark.parametrize("overrides, reason", [
    # Checked in the documented order: the first obstacle is the reason.
    ({"dynamic_projections": ("x2l",), "head_groups": 2,
      "scores_like": FLOAT64},
     "the kernel has no grouped dynamic projections"),
    ({"head_groups": 2, "scores_like": FLOAT64},
     "the scores are float64"),
    ({"scores_like": FLOAT64},
     "the scores are float64; the kernel takes float32, bfloat16, float16"),
])
def test_a_required_kernel_names_the_first_obstacle(overrides, reason):
  with pytest.raises(ValueError, match=f"layer: fused_kernel=True, but "
                     f"{reason}"):
    _path(fused_kernel=True, **overrides)


def test_the_layer_and_the_config_share_the_dynamic_projection_check():
  assert talking_heads.checked_dynamic_projections(["m2w", "x2l"]) == (
      "x2l", "m2w")
  with pytest.raises(ValueError, match=r"^owner: unknown dynamic "
                     r"projections \['q2l'\]"):
    talking_heads.checked_dynamic_projections(["q2l"], owner="owner")
  with pytest.raises(ValueError, match="'x2l' is added to the static P_l, "
                     "so it needs project_logits=True"):
    talking_heads.checked_dynamic_projections(["x2l"], project_logits=False)
