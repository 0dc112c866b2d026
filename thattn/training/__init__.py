"""Training: the run driver, its backends' protocol, options, devices.

`thattn.training.run.train(...)` (also `thattn.training.trainer.train`),
the run driver, trains any registered task (`thattn.tasks`) with any of the
three backends: the protocol is `backend`, the Keras backend
`keras_backend`, the Keras 3 one `keras3_backend` (the Mesh TensorFlow one
is `thattn.mtf.training`); `thattn.launch.train` is `thattn-train`'s
library function around it (export, CPU split). `run_dir` owns the model_dir's
layout; `devices` and `dtensor` put a Keras model on a
`tf.distribute.Strategy` or a DTensor mesh.
"""

from thattn import extras  # pylint: disable=g-bad-import-order

# Before the first TensorFlow import: names the pip extra if it is missing.
extras.require("thattn.training", extras.TENSORFLOW)
