"""Training: the trainer, its options, the optimizer factory, the devices.

`thattn.training.trainer.train(...)` trains any registered task
(`thattn.tasks`); `run_dir` owns the model_dir's layout; `devices` and
`dtensor` put the model on a `tf.distribute.Strategy` or a DTensor mesh.
"""
