"""Training: the run driver, its backends' protocol, options, devices.

`thattn.training.run.train(...)` (also `thattn.training.trainer.train`),
the run driver, trains any registered task (`thattn.tasks`) with any of the
three backends: the protocol is `backend`, the Keras backend
`keras_backend`, the Keras 3 one `keras3_backend` (the Mesh TensorFlow one
is `thattn.mtf.training`); `thattn.launch.train` is `thattn-train`'s
library function around it (export, CPU split). `run_dir` owns the model_dir's
layout; `devices` and `dtensor` put a Keras model on a
`tf.distribute.Strategy` or a DTensor mesh.

The package imports nothing itself: `keras3_steps` (the Keras 3 step) is
plain Keras 3 and serves JAX without TensorFlow (benchmarks/model_steps.py
on the GPU machines); the driver (`run`) names the `[tensorflow]` extra
where TensorFlow is missing.
"""
