"""Logical axis -> mesh axis rules, DTensor layouts and Mesh TF layout strings.

One rules table shards every thattn model (docs/architecture.md, "Style"):
layers declare the logical axes of their weights, and
`LayoutRules` maps logical axes to the axes of a `MeshSpec`.

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

from thattn.sharding.dtensor_layouts import batch_layout
from thattn.sharding.dtensor_layouts import build_sharded
from thattn.sharding.dtensor_layouts import connect_clients
from thattn.sharding.dtensor_layouts import copy_weights
from thattn.sharding.dtensor_layouts import layout
from thattn.sharding.dtensor_layouts import logical_axes_of
from thattn.sharding.dtensor_layouts import make_distributed_mesh
from thattn.sharding.dtensor_layouts import make_mesh
from thattn.sharding.dtensor_layouts import mesh_spec_of
from thattn.sharding.dtensor_layouts import plan_weights
from thattn.sharding.dtensor_layouts import shard
from thattn.sharding.dtensor_layouts import ShardedBuild
from thattn.sharding.dtensor_layouts import to_numpy
from thattn.sharding.dtensor_layouts import variable_layout
from thattn.sharding.dtensor_layouts import weight_layouts
from thattn.sharding.rules import ACTIVATION_AXES
from thattn.sharding.rules import BATCH
from thattn.sharding.rules import check_layouts
from thattn.sharding.rules import EXPERTS
from thattn.sharding.rules import known_logical_axes
from thattn.sharding.rules import LayoutRules
from thattn.sharding.rules import LENGTH
from thattn.sharding.rules import MeshSpec
from thattn.sharding.rules import plan_layouts
