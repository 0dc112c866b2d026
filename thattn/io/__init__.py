"""What thattn reads and writes on disk.

- `run_dir`: the model_dir's file names and layout;
- `staged_writes`: outputs written beside their target and renamed into
  place, so a failed write leaves nothing that looks valid;
- `write_failures`: writes the machine refused (a full disk, a size limit),
  told apart from bugs;
- `checkpoint_reading`: a run's checkpoint found and read, into tf_keras
  objects or as NumPy values, whichever backend wrote it;
- `orbax_checkpoints`: a Keras 3 run's Orbax checkpoints;
- `paths`: the cache folder for what is built once per machine.

Nothing here is imported by `import thattn.io`: each module imports its own
framework (TensorFlow, Keras 3), so a reader takes only what it needs;
`run_dir` and `checkpoint_reading` import none (TensorFlow is loaded when
a `tf.train` checkpoint is read), so the Keras 3 models read runs without
it.
"""
