"""The Mesh TensorFlow backend of thattn.

Mesh TensorFlow's own attention layers (`mesh_tensorflow.transformer`) run
on TensorFlow 2.21 and are shown equal to thattn's Keras layers:

- `compat`: makes mesh-tensorflow 0.1.21 and `mesh_tensorflow.transformer`
  importable on TF 2.21 (`import_mesh_tensorflow`, `import_transformer`).
- `layers`: thattn's own mtf layer for what mtf lacks, grouped talking
  heads (`GroupedTalkingHeadsSelfAttention`, `...EncDecAttention`, gin names
  `thattn.*`), and `attention_layer(gin_name, **kwargs)`.
- `layout`: thattn's sharding rules as mtf `layout` / `mesh_shape`, and
  `PlacementMeshImpl` over logical CPU devices.
- `layer_weights`: per-layer weight conversion, mtf variables <-> Keras
  weights (keyword-only; the conventions that differ are in its docstring).
- `runner`: runs one mtf attention layer forward and backward on a mesh.
- `weight_maps`: which mtf variable is which Keras weight, by dim name.
- `models`: whole mtf models from a gin config (mtf's defaults.gin first):
  build, logits on a mesh, initial variables, and mtf model_dirs
  (`operative_config.gin` + `model.ckpt-N`) written and read.
- `architecture`: an mtf Bitransformer as thattn's T5Config, and a
  T5Config as mtf gin.
- `model_map`: every variable of an mtf Bitransformer as a weight of
  thattn's T5 model, both ways.
- `convert`: model_dir conversion both ways (`mtf_to_thattn`,
  `thattn_to_mtf`, behind `thattn-convert`), and the per-layer functions
  of `layer_weights`.

See docs/mtf.md. Importing this package does not import mesh_tensorflow;
the submodules other than `compat` need the `[mtf]` extra.
"""
