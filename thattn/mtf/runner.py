"""Runs one Mesh TensorFlow attention layer on a PlacementMeshImpl.

`run_layer` builds the layer in an mtf graph with a real
`mesh_tensorflow.transformer.transformer.Context` (its `model` a real
`Unitransformer`, so relative attention and the 2-D sharding helpers see
what they see in a model), lowers it on
`mtf.placement_mesh_impl.PlacementMeshImpl` (one device, or a mesh of
logical CPUs with thattn's rules), loads the given variable values and
returns the output Y[batch, length, d_model], mtf's gradients of
sum(Y * cotangent) with respect to the inputs and every variable, the
variables' values, dimension names and per-device slice shapes.

    result = runner.run_layer(
        transformer_layers.TalkingHeadsSelfAttention(...), query=x,
        causal=True, query_segments=ids, mesh="batch:2,model:2",
        rules="batch:batch;heads:model")

Masks are mtf's: `causal` gives the model `autoregressive=True` (read and
write priorities equal to the position), and segment ids are mtf's
`sequence_id` / `encoder_sequence_id` (0 is padding; a position sees only
positions with its own id, so padding sees padding). Both become -1e9
added to the logits, as in mtf models. The context's mode is EVAL, so
dropout is off.
"""

import dataclasses
import importlib

import numpy as np
import tensorflow as tf

from thattn.mtf import compat
from thattn.mtf import layout
from thattn.mtf import models as mtf_models

compat.install_transformer()
mtf = compat.import_mesh_tensorflow()
# After the compat patches: mtf's transformer package imports only with them.
transformer = importlib.import_module("mesh_tensorflow.transformer.transformer")

SCOPE = "attention"
_EVAL = tf.compat.v1.estimator.ModeKeys.EVAL


@dataclasses.dataclass
class Result:
  """What `run_layer` returns; variable names are relative to the layer."""
  output: np.ndarray  # Y[batch, length, d_model]
  input_grads: dict  # {"query": ..., "memory": ...}
  variable_grads: dict  # {name: gradient}
  variables: dict  # {name: value}, read back from the mtf masters
  variable_dims: dict  # {name: (dimension name, ...)}
  slice_shapes: dict  # {name: [slice shape per device]}


@dataclasses.dataclass
class _Graph:
  output: object
  grads: dict
  variables: list


def _import(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(mesh, tf.constant(value, dtype),
                              mtf.Shape(dims))


def _context(mesh, query_dims, *, memory, causal, query_segments,
             memory_segments, mesh_shape, mtf_layout):
  """A Context as `Unitransformer.call_simple` builds it, for one layer."""
  batch, length, d_model = query_dims
  model = transformer.Unitransformer(
      layer_stack=None, d_model=d_model.size, input_vocab_size=1,
      output_vocab_size=1, autoregressive=causal, max_length=length.size,
      positional_embedding=False, layout=mtf_layout, mesh_shape=mesh_shape)
  position = mtf.range(mesh, length, tf.int32)
  priority = position if causal else None
  sequence_id = (None if query_segments is None else
                 _import(mesh, query_segments, [batch, length], tf.int32))
  encoder_sequence_id = None
  if memory is not None and memory_segments is not None:
    encoder_sequence_id = _import(mesh, memory_segments,
                                  memory.shape.dims[:2], tf.int32)
  return transformer.Context(
      model=model, mesh=mesh, batch_dims=[batch], length_dim=length,
      variable_dtype=mtf.VariableDType(tf.float32), mode=_EVAL,
      position=position, position_is_default=True, sequence_id=sequence_id,
      read_priority=priority, write_priority=priority,
      encoder_output=memory, encoder_sequence_id=encoder_sequence_id)


def _build(layer, mesh, *, query, memory, cotangent, **context_args):
  batch, length, width = query.shape
  dims = [mtf.Dimension("batch", batch), mtf.Dimension("length", length),
          mtf.Dimension("d_model", width)]
  x = _import(mesh, query, dims)
  inputs = {"query": x}
  if memory is not None:
    memory_dims = [dims[0], mtf.Dimension("memory_length", memory.shape[1]),
                   mtf.Dimension("d_model", memory.shape[2])]
    inputs["memory"] = _import(mesh, memory, memory_dims)
  context = _context(mesh, dims, memory=inputs.get("memory"), **context_args)
  with tf.compat.v1.variable_scope(SCOPE):
    y = layer.call(context, x)
  loss = mtf.reduce_sum(y * _import(mesh, cotangent, y.shape.dims))
  variables = list(mesh.graph.trainable_variables)
  sources = list(inputs.values()) + [v.outputs[0] for v in variables]
  grads = dict(zip(list(inputs) + variables,
                   mtf.gradients([loss], sources)))
  return _Graph(y, grads, variables)


def _short(variable):
  return variable.name[len(SCOPE) + 1:]


def run_layer(layer, *, query, memory=None, cotangent=None, causal=False,
              query_segments=None, memory_segments=None, variables=None,
              mesh=None, rules=None, devices=None):
  """Runs `layer` forward and backward; see the module docstring.

  Args:
    layer: an mtf `TransformerLayer` (attention).
    query: X[batch, length, d_model], float32.
    memory: the encoder output M[batch, memory_length, d_model] for
      encoder-decoder layers; None for self-attention.
    cotangent: dL/dY, defaults to ones.
    causal: autoregressive self-attention.
    query_segments: int [batch, length] sequence ids (0 = padding), or None.
    memory_segments: int [batch, memory_length], for enc-dec attention.
    variables: {name relative to the layer: value}; None keeps mtf's
      initialization.
    mesh: a MeshSpec or string such as "batch:2,model:2"; None for one
      device.
    rules: thattn layout rules (LayoutRules or string), with `mesh`.
    devices: device names for the mesh; defaults to the logical CPUs.

  Returns:
    A `Result`.
  """
  query = np.asarray(query, np.float32)
  cotangent = (np.ones_like(query) if cotangent is None else
               np.asarray(cotangent, np.float32))
  mesh_shape = None if mesh is None else layout.mtf_mesh_shape(mesh)
  mtf_layout = None if mesh is None else layout.mtf_layout(rules or "")
  with tf.Graph().as_default() as graph:
    mesh_graph = mtf.Graph()
    mtf_mesh = mtf.Mesh(mesh_graph, "mesh")
    built = _build(layer, mtf_mesh, query=query, memory=memory,
                   cotangent=cotangent, causal=causal,
                   query_segments=query_segments,
                   memory_segments=memory_segments, mesh_shape=mesh_shape,
                   mtf_layout=mtf_layout)
    lowering, _ = layout.lower(mtf_mesh, built.variables, mesh=mesh,
                               rules=rules, devices=devices,
                               prefix=SCOPE + "/")
    return _run(graph, lowering, built, variables)


def _run(graph, lowering, built, values):
  fetches = {"output": lowering.export_to_tf_tensor(built.output),
             "grads": {key if isinstance(key, str) else _short(key):
                       lowering.export_to_tf_tensor(grad)
                       for key, grad in built.grads.items()},
             "variables": {_short(v): v.get_master()
                           for v in built.variables}}
  feeds, assigns = ({}, []) if values is None else mtf_models.assign_ops(
      built.variables, values, name_of=_short, what="layer")
  slices = {_short(v): [s.shape.as_list() for s in
                        lowering.variables[v].laid_out_tensor.all_slices]
            for v in built.variables}
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(assigns, feeds)
    session.run(lowering.copy_masters_to_slices())
    out = session.run(fetches)
  grads = out["grads"]
  return Result(
      output=out["output"],
      input_grads={k: grads.pop(k) for k in ("query", "memory") if k in grads},
      variable_grads=grads, variables=out["variables"],
      variable_dims={_short(v): tuple(d.name for d in v.shape.dims)
                     for v in built.variables},
      slice_shapes=slices)
