"""`thattn-train`'s library function: one run, from devices to export.

::

    from thattn import launch
    summary = launch.train(model_dir="runs/demo", task="mlm",
                           options=TrainOptions(train_steps=100))

`train` is what the binary calls after parsing its flags, and holds the run
policy around the driver (`thattn.training.run.train`), for both backends:

- the export target is checked before anything trains, and only the chief
  of a cluster exports (the other processes leave the model_dir alone);
- without a GPU, the CPU is split into the logical devices a mesh needs
  (`--strategy=dtensor`, or `--backend=mtf` in one process), before
  TensorFlow initializes; a multi-client DTensor job is joined then too;
- the backend is found by name (`thattn.training.backend.get`);
- after training, the run is exported through its backend
  (`export_run`: a Mesh TensorFlow run is converted to Keras first).

It sits above `thattn.export` and `thattn.training`, and reaches Mesh
TensorFlow only through the backends' registry.
"""

import os

from thattn import export as export_lib
from thattn.io import run_dir
from thattn.io import staged_writes
from thattn.training import backend as backend_lib
from thattn.training import cluster
from thattn.training import dtensor
from thattn.training import run


def train(*, model_dir, task, model=None, data=None, options, export=True,
          export_dir=None, log=print):
  """Trains (`thattn.training.run.train`), then exports; the summary.

  Args:
    model_dir, task, model, data, options, log: as
      `thattn.training.run.train`.
    export: whether the chief exports a SavedModel after training.
    export_dir: where; None: `<model_dir>/export`.
  Returns:
    The run's summary, with "export" added: the SavedModel's folder, or
    None where this process did not export. A process that only served
    another's Mesh TensorFlow run returns {"served", "model_dir"}.
  Raises:
    ValueError for bad options, data or export targets (before training
    where they can be known then).
  """
  backend_class = backend_lib.get(options.backend)
  if export and cluster.is_chief():  # the chief exports for a cluster
    export_dir = export_dir or run_dir.path(model_dir, run_dir.EXPORT)
    # Refused now, before training writes a file (a target that is, holds
    # or lies in this run's model_dir too).
    export_lib.check_export_dir(os.path.abspath(export_dir),
                                model_dir=model_dir)
  else:
    export_dir = None
  if options.mesh_shape and backend_class.logical_devices(options):
    split = dtensor.split_cpu(options.mesh_shape)
    if split:
      log(f"No GPU: the CPU runs the mesh as {split} logical devices, "
          "sharing its cores (sharded, not faster).")
    if dtensor.num_clients() > 1:  # before TensorFlow initializes
      dtensor.connect_clients(options.cluster_timeout, log)  # bounded
  summary = run.train(model_dir=model_dir, task=task, model=model, data=data,
                      options=options, log=log)
  if "served" in summary:
    return summary
  if not summary.get("chief", True):  # a JAX cluster's other processes
    export_dir = None
  if export_dir and not (summary.get("already_finished") and
                         export_lib.is_export(export_dir)):
    export_run(model_dir=model_dir, export_dir=export_dir, log=log)
  return dict(summary, export=export_dir)


def export_run(*, model_dir, export_dir, log=print, checkpoint=None,
               overwrite=False):
  """Exports a thattn-train run of either backend (`thattn.export.export`);
  a run of another backend is turned into a Keras model_dir first (its
  `model_dir_for_export`: a --backend=mtf run's newest checkpoint,
  converted in a staging folder beside export_dir, removed after)."""
  try:
    backend = run_dir.backend(model_dir)
  except ValueError:
    backend = run_dir.KERAS  # export.export names what is missing
  if backend in run_dir.KERAS_CHECKPOINTS:  # a Keras or Keras 3 run
    return export_lib.export(model_dir=model_dir, export_dir=export_dir,
                             checkpoint=checkpoint, overwrite=overwrite,
                             log=log)
  if checkpoint:
    raise ValueError("--checkpoint applies to Keras runs; "
                     f"{model_dir} is a --backend={backend} run, whose "
                     "newest checkpoint is exported.")
  # The converted copy is staged beside the target (thattn.io.staged_writes): a
  # killed export's copy is removed by the next export there.
  export_lib.check_export_dir(export_dir, model_dir=model_dir)  # not after
  with staged_writes.staged(export_dir, program="thattn-export", log=log,
                      suffix=".converted") as temp:
    keras_dir = backend_lib.get(backend).model_dir_for_export(model_dir, temp,
                                                              log)
    return export_lib.export(model_dir=keras_dir, export_dir=export_dir,
                             log=log)
