"""Runs thattn layers under DTensor on logical CPU devices; prints JSON lines.

Logical devices must be configured before TensorFlow initializes its
devices, which a pytest process has usually done already, so
`dtensor_test.py` runs this file in a fresh Python:

    python tests/sharding/dtensor_script.py --devices 4 \
        --mesh batch:2,model:2 --case layer:A --case functional:A

Each case builds its layer or model twice with `thattn.sharding` (an
unsharded reference and a sharded twin with the same weights), runs a
forward and backward pass of both, and prints one JSON line with every
weight's layout, every gradient's layout and the largest differences,
relative to the reference's largest magnitude. The test asserts on them.
"""

import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf

RULES = {
    # Shard the query/key heads and the value heads; the softmax heads of
    # talking heads stay whole, so P_l and P_w are split along one side.
    "A": "batch:batch;key_heads:model;value_heads:model;d_ff:model;vocab:model",
    # Shard only the softmax heads: P_l, P_w and the dynamic projections
    # are split, the query/key/value/output kernels are replicated.
    "B": "batch:batch;heads:model",
    # The models: as A, but the vocabulary stays whole. A vocab-sharded
    # embedding table fails in DTensor's ResourceGather ("does not support
    # sharded 0th dimension for the resource tensor").
    "M": "batch:batch;key_heads:model;value_heads:model;d_ff:model",
    # Grouped talking heads with G = the model-axis size: every head set and
    # the blocks of P_l, P_w and the dynamic projections on model, so each
    # device holds whole groups.
    "G": ("batch:batch;head_groups:model;key_heads:model;value_heads:model;"
          "d_ff:model"),
}
WIDTH, QUERY_LENGTH, MEMORY_LENGTH, BATCH = 16, 5, 6, 4


def _configure_devices(count):
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def _talking_heads(layers, name="tha"):
  return layers.TalkingHeadsAttention(
      num_heads=4, key_dim=8, num_key_heads=8, num_value_heads=8,
      dynamic_projections=layers.DYNAMIC_PROJECTIONS, use_bias=True,
      name=name)


def _build_layer():
  from thattn import layers  # pylint: disable=g-import-not-at-top
  layer = _talking_heads(layers)
  layer.build_from_shapes([None, None, WIDTH], [None, None, WIDTH])
  return layer


def _build_grouped(groups):
  """Grouped talking heads: G blocks in P_l, P_w and dynamic projections."""
  from thattn import layers  # pylint: disable=g-import-not-at-top
  layer = layers.TalkingHeadsAttention(
      num_heads=4, key_dim=8, num_key_heads=8, num_value_heads=8,
      num_head_groups=groups, dynamic_projections=layers.DYNAMIC_PROJECTIONS,
      use_bias=True, name="tha")
  layer.build_from_shapes([None, None, WIDTH], [None, None, WIDTH])
  return layer


def _build_functional():
  """Talking-heads, multi-head and bilinear attention, and Keras layers."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  from thattn import layers  # pylint: disable=g-import-not-at-top
  inputs = tf_keras.Input([None, WIDTH], name="x")
  hidden = inputs + _talking_heads(layers)(inputs, inputs)
  # epsilon < 1.001e-5 keeps tf_keras off FusedBatchNormV3, which DTensor
  # cannot lay out (BERT uses 1e-12 anyway).
  hidden = tf_keras.layers.LayerNormalization(epsilon=1e-6, name="norm")(hidden)
  hidden += layers.MultiHeadAttention(8, 4, name="mha")(hidden, hidden)
  hidden += layers.GeneralBilinearAttention(4, name="gba")(hidden, hidden)
  outputs = tf_keras.layers.Dense(3, name="head")(hidden)
  return tf_keras.Model(inputs, outputs, name="tiny")


def _build_model(preset):
  from thattn import models  # pylint: disable=g-import-not-at-top
  return models.create_model(preset, attention="talking_heads")


def _model_inputs(kind, reference):
  """Token ids (0 is padding in both models) with some padded positions."""
  rng = np.random.RandomState(0)
  lengths = rng.randint(3, QUERY_LENGTH + 3, [BATCH, 1])
  keep = np.arange(QUERY_LENGTH + 2)[np.newaxis] < lengths
  if kind == "bert":
    vocab = reference.get_layer("word_embeddings").vocab_size
    return {"input_word_ids": rng.randint(1, vocab, keep.shape) * keep,
            "input_mask": keep.astype(np.int32),
            "input_type_ids": rng.randint(0, 2, keep.shape) * keep}
  vocab = reference.get_layer("token_embedding").vocab_size
  return {"encoder_input_tokens": rng.randint(1, vocab, keep.shape) * keep,
          "decoder_input_tokens": rng.randint(1, vocab, keep.shape)}


def _inputs(kind, masked):
  rng = np.random.RandomState(0)
  query = rng.randn(BATCH, QUERY_LENGTH, WIDTH).astype(np.float32)
  if kind == "functional":
    return {"x": query}
  inputs = {"query": query,
            "value": rng.randn(BATCH, MEMORY_LENGTH, WIDTH).astype(np.float32)}
  if masked:
    inputs["attention_mask"] = rng.rand(BATCH, QUERY_LENGTH,
                                        MEMORY_LENGTH) > 0.3
  return inputs


def _loss_and_grads(model, inputs):
  with tf.GradientTape() as tape:
    if "x" not in inputs and "query" not in inputs:  # a BERT or T5 model
      outputs = model(inputs)
      if isinstance(outputs, dict):  # BERT: sequence and pooled outputs
        loss = tf.reduce_sum(outputs["pooled_output"] ** 2)
        outputs = outputs["sequence_output"]
      else:  # T5: logits
        loss = 0.0
      loss += tf.reduce_sum(outputs * outputs)
      grads = tape.gradient(loss, model.trainable_variables)
      # Embedding gradients are IndexedSlices; compare them dense.
      return outputs, loss, [tf.convert_to_tensor(g) for g in grads]
    if "x" in inputs:
      outputs = model(inputs["x"])
    else:
      outputs = model(inputs["query"], inputs["value"],
                      attention_mask=inputs.get("attention_mask"))
    loss = tf.reduce_sum(outputs * outputs)
  return outputs, loss, tape.gradient(loss, model.trainable_variables)


def _scaled_error(reference, value, floor=1e-30):
  """max |value - reference| / max |reference| (at least `floor`)."""
  reference = np.asarray(reference, np.float64)
  scale = max(np.abs(reference).max(), floor)
  return float(np.abs(reference - value).max() / scale)


def copy_weights_case(mesh):
  """copy_weights from unsharded to sharded and back keeps the layouts."""
  from thattn import sharding  # pylint: disable=g-import-not-at-top
  rules = sharding.LayoutRules.parse(RULES["A"])
  sharded, reference = sharding.build_sharded(_build_layer, rules, mesh)
  for variable in reference.variables:
    variable.assign_add(tf.ones_like(variable))
  sharding.copy_weights(reference, sharded)  # unsharded -> sharded
  other = _build_layer()
  sharding.copy_weights(sharded, other)  # sharded -> unsharded
  layouts = sharding.weight_layouts(reference, rules, mesh, strict=True)
  return {"case": "copy:weights", "copied": all(
      np.array_equal(sharding.to_numpy(s), r.numpy()) and
      np.array_equal(o.numpy(), r.numpy()) and
      s.layout.sharding_specs == layouts[s.name].sharding_specs
      for s, r, o in zip(sharded.variables, reference.variables,
                         other.variables))}


def run_error_case(case, mesh):
  """Bad layouts fail with a ValueError before any sharded weight exists."""
  from thattn import layers  # pylint: disable=g-import-not-at-top
  from thattn import sharding  # pylint: disable=g-import-not-at-top
  rules = sharding.LayoutRules.parse(RULES["A"])
  builds = []

  def build_fn():
    builds.append(1)
    layer = layers.TalkingHeadsAttention(4, 8, num_key_heads=3, name="tha")
    layer.build_from_shapes([None, None, WIDTH], [None, None, WIDTH])
    return layer

  attempts = {
      "error:heads": lambda: sharding.build_sharded(build_fn, rules, mesh),
      "error:batch": lambda: sharding.shard(
          np.zeros([3, QUERY_LENGTH, WIDTH], np.float32), mesh, rules,
          (sharding.BATCH,), "query"),
      "error:mesh": lambda: sharding.make_mesh(
          f"batch:2,model:{len(tf.config.list_logical_devices('CPU'))}"),
  }
  try:
    attempts[case]()
  except ValueError as error:
    return {"case": case, "error": str(error), "builds": len(builds)}
  return {"case": case, "error": None, "builds": len(builds)}


def run_case(case, mesh):
  # pylint: disable=g-import-not-at-top
  from tensorflow.experimental import dtensor
  from thattn import sharding
  # pylint: enable=g-import-not-at-top
  if case.startswith("error:"):
    return run_error_case(case, mesh)
  if case == "copy:weights":
    return copy_weights_case(mesh)
  kind, rules_name = case.split(":")
  rules = sharding.LayoutRules.parse(RULES[rules_name])
  build_fn = {"layer": _build_layer, "layer_masked": _build_layer,
              # One group per shard of the model axis.
              "grouped": lambda: _build_grouped(mesh.dim_size("model")),
              "functional": _build_functional,
              "bert": lambda: _build_model("bert_tiny"),
              "t5": lambda: _build_model("t5_tiny")}[kind]
  start = time.time()
  sharded, reference = sharding.build_sharded(build_fn, rules, mesh,
                                              strict=kind.startswith("layer"))
  if kind in ("bert", "t5"):
    inputs = _model_inputs(kind, reference)
  else:
    inputs = _inputs(kind, masked=kind == "layer_masked")
  step = tf.function(_loss_and_grads)
  ref_outputs, ref_loss, ref_grads = step(
      reference, {k: tf.constant(v) for k, v in inputs.items()})
  sharded_inputs = {k: sharding.shard(v, mesh, rules, (sharding.BATCH,), k)
                    for k, v in inputs.items()}
  outputs, loss, grads = step(sharded, sharded_inputs)
  specs = lambda t: list(dtensor.fetch_layout(t).sharding_specs)
  # Some gradients are exactly zero in exact arithmetic (e.g. a key bias
  # without dynamic projections: softmax ignores it), so each is scaled by
  # at least a thousandth of the largest gradient.
  grad_floor = 1e-3 * max(np.abs(g).max() for g in ref_grads)
  return {
      "case": case,
      "mesh": str(sharding.mesh_spec_of(mesh)),
      "rules": str(rules),
      "layouts": {v.name: list(v.layout.sharding_specs)
                  for v in sharded.variables},
      "shapes": {v.name: v.shape.as_list() for v in sharded.variables},
      "grad_layouts": {v.name: specs(g)
                       for v, g in zip(sharded.trainable_variables, grads)},
      "output_layout": specs(outputs),
      "batch_layout": list(sharding.batch_layout(mesh, rules,
                                                 3).sharding_specs),
      "same_initial_weights": all(
          np.array_equal(sharding.to_numpy(s), r.numpy())
          for s, r in zip(sharded.variables, reference.variables)),
      "errors": {
          "output": _scaled_error(ref_outputs, sharding.to_numpy(outputs)),
          "loss": _scaled_error(ref_loss, sharding.to_numpy(loss)),
          "grads": {v.name: _scaled_error(r, sharding.to_numpy(g),
                                          grad_floor)
                    for v, r, g in zip(reference.trainable_variables,
                                       ref_grads, grads)},
      },
      "seconds": round(time.time() - start, 2),
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--devices", type=int, required=True)
  parser.add_argument("--mesh", required=True)
  parser.add_argument("--case", action="append", required=True,
                      help="kind:rules, kind in layer, layer_masked, "
                      "grouped, functional, bert, t5 and rules in " + ", ".join(RULES) +
                      "; or error:heads, error:batch, error:mesh, "
                      "copy:weights")
  args = parser.parse_args(argv)
  _configure_devices(args.devices)  # first, before anything touches devices
  from thattn import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(args.mesh)
  for case in args.case:
    print(json.dumps(run_case(case, mesh)), flush=True)


if __name__ == "__main__":
  sys.exit(main())
