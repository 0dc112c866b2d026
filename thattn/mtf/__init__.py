"""The Mesh TensorFlow backend of thattn.

For now this holds `compat`, which makes mesh-tensorflow 0.1.21 importable on
TensorFlow 2.21 (see its docstring for the two missing symbols it supplies):

    from thattn.mtf import compat
    mtf = compat.import_mesh_tensorflow()

thattn's tests use it to check `thattn.optimizers.Adafactor` against
`mesh_tensorflow.optimize.AdafactorOptimizer`. Importing this package does
not import mesh_tensorflow.
"""
