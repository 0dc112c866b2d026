"""Logical axis -> mesh axis rules, DTensor layouts and Mesh TF layout strings.

One rules table shards every thattn model (docs/architecture.md, "Style"):
layers declare the logical axes of their weights, and
`LayoutRules` maps logical axes to the axes of a `MeshSpec`::

    mesh_spec = sharding.MeshSpec.parse("batch:2,model:2")
    rules = sharding.LayoutRules.parse(
        "batch:batch;key_heads:model;value_heads:model;d_ff:model")
    mesh = sharding.make_mesh(mesh_spec)               # DTensor
    sharded, reference = sharding.build_sharded(build_fn, rules, mesh)
    rules.to_mtf_layout(), mesh_spec.to_mtf_mesh_shape()  # Mesh TensorFlow

Grouped talking heads (`TalkingHeadsAttention(num_head_groups=G)` with G a
multiple of the model-axis size) shard all three head sets with no
communication inside the attention core, each device holding whole groups:
"batch:batch;head_groups:model;key_heads:model;value_heads:model;d_ff:model".

Every check runs before any computation and raises a ValueError naming the
tensor, the logical axis and the sizes, and saying what to change.
"""

import importlib

from thattn.core import requirements
from thattn.sharding.rules import ACTIVATION_AXES
from thattn.sharding.rules import BATCH
from thattn.sharding.rules import check_layouts
from thattn.sharding.rules import DEFAULT_LAYOUT_RULES
from thattn.sharding.rules import EXPERTS
from thattn.sharding.rules import known_logical_axes
from thattn.sharding.rules import LayoutRules
from thattn.sharding.rules import LENGTH
from thattn.sharding.rules import MeshSpec
from thattn.sharding.rules import plan_layouts

# The DTensor half imports TensorFlow and tf_keras; it loads on first use,
# so the rules (plain Python) serve thattn.keras3 on JAX and PyTorch too.
_DTENSOR_NAMES = (
    "batch_layout",
    "build_sharded",
    "connect_clients",
    "copy_weights",
    "layout",
    "logical_axes_of",
    "make_distributed_mesh",
    "make_mesh",
    "mesh_spec_of",
    "plan_weights",
    "shard",
    "ShardedBuild",
    "to_numpy",
    "variable_layout",
    "weight_layouts",
)


def __getattr__(name):
  if name in _DTENSOR_NAMES:
    requirements.require(f"thattn.sharding.{name}", ("tensorflow", "tf_keras"))
    module = importlib.import_module("thattn.sharding.dtensor_layouts")
    return getattr(module, name)
  raise AttributeError(f"module 'thattn.sharding' has no attribute {name!r}")
