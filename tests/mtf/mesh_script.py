"""Runs mtf attention layers on meshes of 4 logical CPUs; prints JSON lines.

Logical devices must exist before TensorFlow initializes its devices, which
a pytest process has usually done already, so `mesh_test.py` runs this file
in a fresh Python:

    python tests/mtf/mesh_script.py

For each case (an mtf layer and thattn rules) it runs the layer on one
device and on the meshes batch:2, model:2 and batch:2,model:2, each with the
rules that name its axes, and prints one JSON line with the largest
differences of the outputs and gradients from the one-device run (relative
to its largest magnitude) and every variable's lowered slice shapes.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=g-import-not-at-top,wrong-import-position
from thattn import sharding
from thattn.mtf import layout

layout.configure_logical_cpus(4)

from thattn.mtf import layers as mtf_layers
from thattn.mtf import runner
import variants as v
# pylint: enable=g-import-not-at-top,wrong-import-position

tl = mtf_layers.transformer_layers
MESHES = ("batch:2", "model:2", "batch:2,model:2")
RULES = {
    "heads": "batch:batch;heads:model",
    "kv_heads": "batch:batch;key_heads:model;value_heads:model",
    "groups": ("batch:batch;head_groups:model;key_heads:model;"
               "value_heads:model"),
}


def _talking_heads(enc_dec=False):
  cls = (tl.TalkingHeadsEncDecAttention if enc_dec else
         tl.TalkingHeadsSelfAttention)
  return cls(key_heads_dims=[("key_heads", 2)],
             softmax_heads_dims=[("heads", 4)],
             value_heads_dims=[("value_heads", 6)], key_size=4, value_size=3,
             dynamic_projections=v.ALL_DYNAMIC)


CASES = {
    "multi_head": (lambda: tl.SelfAttention(num_heads=2, key_value_size=4),
                   "heads", False),
    "talking_heads:kv_heads": (_talking_heads, "kv_heads", False),
    "talking_heads:heads": (_talking_heads, "heads", False),
    "talking_heads_enc_dec:kv_heads": (lambda: _talking_heads(True),
                                       "kv_heads", True),
    "general_bilinear": (
        lambda: tl.GeneralBilinearSelfAttention(heads_dims=[("heads", 2)]),
        "heads", False),
    "grouped": (lambda: mtf_layers.GroupedTalkingHeadsSelfAttention(
        num_heads=2, key_dim=4, value_dim=3, num_key_heads=4,
        num_value_heads=6, num_head_groups=2,
        dynamic_projections=v.ALL_DYNAMIC), "groups", False),
}


def _rules_for(rules, mesh):
  """The rules whose mesh axis the mesh has (thattn refuses the others)."""
  names = sharding.MeshSpec.parse(mesh).names
  return ";".join(f"{logical}:{axis}" for logical, axis in
                  sharding.LayoutRules.parse(rules).rules if axis in names)


def _flat(result):
  return {"output": result.output, **result.input_grads,
          **{f"d/d{k}": g for k, g in result.variable_grads.items()}}


def _case(name):
  make, rules, enc_dec = CASES[name]
  data = v.inputs()
  args = dict(query=data["query"], cotangent=data["cotangent"],
              memory=data["memory"] if enc_dec else None,
              causal=not enc_dec, query_segments=data["query_segments"],
              memory_segments=data["memory_segments"] if enc_dec else None)
  reference = runner.run_layer(make(), **args)
  report = {"case": name, "rules": RULES[rules],
            "variable_dims": reference.variable_dims,
            "shapes": {k: list(x.shape) for k, x in
                       reference.variables.items()}, "meshes": {}}
  for mesh in MESHES:
    mesh_rules = _rules_for(RULES[rules], mesh)
    result = runner.run_layer(make(), variables=reference.variables,
                              mesh=mesh, rules=mesh_rules, **args)
    want, got = _flat(reference), _flat(result)
    report["meshes"][mesh] = {
        "rules": mesh_rules, "slice_shapes": result.slice_shapes,
        "errors": {k: v.relative_error(got[k], want[k]) for k in want}}
  return report


def main():
  for name in sys.argv[1:] or CASES:
    print(json.dumps(_case(name)), flush=True)


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
