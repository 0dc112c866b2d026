"""`thattn.training.trainer.train`: the library entry point of training.

Kept under this name for its callers (the ablation study, tests, users):
`train` is the run driver's (`thattn.training.run.train`), which trains
with either backend, and `default_model` / `resolve_model` are
`thattn.training.run_setup`'s. See `thattn.training.run` for what a run
does, and `thattn.training.backend` for the backends' protocol.
"""

from thattn.training.run import train  # pylint: disable=unused-import
from thattn.training.run_setup import default_model  # pylint: disable=unused-import
from thattn.training.run_setup import resolve_model  # pylint: disable=unused-import
