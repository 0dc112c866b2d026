"""`load(model_dir)`: the trained backbone of a thattn model_dir.

A model_dir that `thattn-train` or `thattn-convert` wrote records its
backbone as a preset and overrides in `run_config.json`, and keeps its
weights in `checkpoints/` (see `thattn.io.run_dir`). `load` rebuilds the
backbone from the first and restores it from the second:

    model = thattn.models.load("runs/span_corruption_t5_tiny")
    logits = model({"encoder_input_tokens": ids, "decoder_input_tokens": ...})

The head of a fine-tuning task (a classifier, SQuAD's span head) is not
part of the backbone; `thattn-export` serves a whole task.
"""

import tensorflow as tf

from thattn.io import checkpoint_reading
from thattn.io import run_dir
from thattn.models import factory

# What a damaged checkpoint, or one of another model, raises while it is
# read or matched.
_RESTORE_ERRORS = (tf.errors.OpError, IndexError, ValueError, AssertionError,
                   KeyError)


def load(model_dir, *, checkpoint=None):
  """The backbone of `model_dir` with the weights of its latest checkpoint.

  Args:
    model_dir: a folder `thattn-train` or `thattn-convert` wrote.
    checkpoint: a checkpoint prefix to restore instead of the latest.

  Returns:
    A `tf_keras.Model`: for T5 presets, token ids -> logits [b, n, vocab];
    for BERT and ALBERT, BERT's inputs -> sequence and pooled outputs (see
    `thattn.models.create_model`).

  Raises:
    ValueError when model_dir has no run_config.json or no checkpoint, when
    its run has no backbone preset (the recall task) or is a Mesh
    TensorFlow run (`--backend=mtf`: convert it first), or when the
    checkpoint cannot be read or does not hold this backbone (naming the
    checkpoint and the cause).
  """
  config = run_dir.backbone_run_config(model_dir)
  if checkpoint is None:
    checkpoint = run_dir.latest_checkpoint(model_dir)
  model = factory.create_model(config["preset"], **config.get("overrides", {}))
  try:
    checkpoint_reading.restore(checkpoint, backbone=model)
  except _RESTORE_ERRORS as error:
    cause = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    raise ValueError(f"{model_dir}: checkpoint {checkpoint} cannot be "
                     f"restored into the {config['preset']} backbone of its "
                     f"run_config.json: {cause}") from None
  return model
