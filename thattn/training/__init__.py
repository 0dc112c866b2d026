"""Training: the run driver, its backends' protocol, options, devices.

`thattn.training.run.train(...)` (also `thattn.training.trainer.train`)
trains any registered task (`thattn.tasks`) with either backend: the
protocol is `backend`, the Keras backend `keras_backend` (the Mesh
TensorFlow one is `thattn.mtf.training`); `run_dir` owns the model_dir's
layout; `devices` and `dtensor` put a Keras model on a
`tf.distribute.Strategy` or a DTensor mesh.
"""
