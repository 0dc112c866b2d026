"""The GPU machine's Python, as far as imports go: no TensorFlow.

The device machines that benchmarks/gpu_session.sh runs on have JAX,
PyTorch and Triton but no TensorFlow (and so no tf-keras, tensorflow-text,
Mesh TensorFlow, TensorFlow Datasets or Model Garden), nor Kaggle's
packages, which KerasHub lists as needs but imports only to download
presets; Keras 3 and KerasHub are carried there as wheels
(/work/.library/device/KINDS.md lists what is installed). A process whose
PYTHONPATH starts with this folder imports this module at start-up
(Python's `site` does), and each of those packages then fails to import
(a None in sys.modules raises ImportError), as on that machine.
PYTHONPATH is inherited, so the processes a benchmark starts are held to
it too.
"""

import sys

for _name in ("tensorflow", "tf_keras", "tensorflow_text", "mesh_tensorflow",
              "tensorflow_datasets", "official", "kagglehub", "kagglesdk"):
  sys.modules[_name] = None
