"""A script: a model_dir's backbone through thattn.keras3.models.load.

    python tests/keras3/load_backbone.py MODEL_DIR IDS.npy OUT.npy

loads MODEL_DIR's backbone on the Keras 3 backend KERAS_BACKEND names,
saves its sequence output for the token ids in IDS.npy ([batch, length],
every token attended, one segment) to OUT.npy, and prints whether
TensorFlow was imported. tests/install_test.py runs it in a venv of
`.[jax]` alone and tests/training/keras3_backend_test.py where TensorFlow
cannot be imported; both compare OUT.npy with thattn.models.load's output.
"""

import sys

import numpy as np

from thattn.keras3 import models

model_dir, ids_path, out_path = sys.argv[1:]
ids = np.load(ids_path)
model = models.load(model_dir)
outputs = model({"input_word_ids": ids, "input_mask": np.ones_like(ids),
                 "input_type_ids": np.zeros_like(ids)}, training=False)
np.save(out_path, np.asarray(outputs["sequence_output"]))
print("tensorflow imported:", sys.modules.get("tensorflow") is not None)
