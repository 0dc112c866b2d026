"""`dispatch.choose` on tf_keras follows the rules of its docstring."""

import pytest
import tensorflow as tf

from thattn.kernels import dispatch

FLOAT32 = tf.zeros([1, 2, 2, 3])
BFLOAT16 = tf.zeros([1, 2, 2, 3], tf.bfloat16)
FLOAT64 = tf.zeros([1, 2, 2, 3], tf.float64)


def _path(dynamic_projections=(), **overrides):
  arguments = dict(owner="layer", front=dispatch.TF_KERAS, switch=None,
                   query=FLOAT32, projections=(tf.eye(2), tf.eye(2)),
                   dynamic={name: FLOAT32 for name in dynamic_projections})
  arguments.update(overrides)
  return dispatch.choose(dispatch.Call(**arguments))


@pytest.mark.parametrize("overrides, chunked", [
    ({}, False),
    ({"chunk_size": 4}, True),
    ({"chunk_size": 4, "need_scores": True}, False),
    # Dynamic projections chunk through the kernel only.
    ({"chunk_size": 4, "dynamic_projections": ("x2l",)}, True),
    ({"chunk_size": 4, "dynamic_projections": ("x2l",),
      "switch": False}, False),
    ({"chunk_size": 4, "dynamic_projections": ("x2l",),
      "query": FLOAT64}, False),
    ({"chunk_size": 4, "dropout": 0.1, "training": True}, False),
    ({"chunk_size": 4, "dropout": 0.1, "training": False}, True),
    ({"chunk_size": 4, "dropout": 0.1, "training": None}, True),
    ({"chunk_size": 4, "head_groups": 2}, True),
])
def test_when_the_chunked_core_runs(overrides, chunked):
  assert _path(**overrides).chunked is chunked


@pytest.mark.parametrize("overrides, fused", [
    ({}, True),
    ({"chunk_size": 4}, True),
    ({"switch": False}, False),
    ({"dynamic_projections": ("m2w",)}, True),
    ({"dynamic_projections": ("x2l", "m2w"), "chunk_size": 4}, True),
    ({"head_groups": 2}, True),
    ({"head_groups": 2, "chunk_size": 4}, True),
    ({"head_groups": 2, "dynamic_projections": ("x2l",)}, False),
    ({"query": BFLOAT16}, True),  # mixed precision
    ({"query": FLOAT64}, False),
])
def test_when_the_kernel_runs(overrides, fused):
  kernel = _path(**overrides).kernel
  assert kernel == (dispatch.CPU_OP if fused else dispatch.OPS)


@pytest.mark.parametrize("overrides, reason", [
    # Checked in the documented order: the first obstacle is the reason.
    ({"dynamic_projections": ("x2l",), "head_groups": 2,
      "query": FLOAT64},
     "the kernel has no grouped dynamic projections"),
    ({"head_groups": 2, "query": FLOAT64},
     "the scores are float64"),
    ({"query": FLOAT64},
     "the scores are float64; the kernel takes float32, bfloat16, float16"),
])
def test_a_required_kernel_names_the_first_obstacle(overrides, reason):
  with pytest.raises(ValueError, match=f"layer: fused_kernel=True, but "
                     f"{reason}"):
    _path(switch=True, **overrides)


def test_an_unknown_front_end_is_named():
  with pytest.raises(ValueError, match=r"^layer: unknown front end 'flax'; "
                     r"expected 'tf_keras' or 'keras3'"):
    _path(front="flax")
