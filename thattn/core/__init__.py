"""Plain Python that every part of thattn shares: no framework is imported.

- `dims`: the einsum letter legend and the logical axis names;
- `attention_spec`: the attention layers' equations, argument checks and
  projection axes, which both Keras front ends compute with;
- `validation`: the argument checks, each a `ValueError` naming the value;
- `complexity`: parameters and multiplies per attention layer, as in the
  paper's tables;
- `weight_names`: a weight's name as both front ends and a checkpoint know it;
- `requirements`: what each part needs installed, and the error that says so.
"""
