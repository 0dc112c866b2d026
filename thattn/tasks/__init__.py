"""Training tasks, one module each, looked up by name.

    from thattn import tasks
    tasks.names()                 # ('mlm', 'span_corruption', ...)
    task_class = tasks.get("mlm")

See `thattn.tasks.base` for the interface and `docs/training.md` ("Adding a
task") for how to add one. Importing this package registers the built-in
tasks below.
"""

# Importing the tasks imports no framework: each task module loads
# TensorFlow and tf_keras where it uses them (`thattn.tasks.base`,
# "Imports"), so the Keras 3 step reads a task on JAX or PyTorch alone.
# In the order `names()` and `thattn-train --help` list them: pretraining,
# fine-tuning, then the synthetic task.
from thattn.tasks import mlm  # pylint: disable=g-bad-import-order
from thattn.tasks import span_corruption  # pylint: disable=g-bad-import-order
from thattn.tasks import causal_lm  # pylint: disable=g-bad-import-order
from thattn.tasks import prefix_lm  # pylint: disable=g-bad-import-order
from thattn.tasks import classification  # pylint: disable=g-bad-import-order
from thattn.tasks import squad  # pylint: disable=g-bad-import-order
from thattn.tasks import recall  # pylint: disable=g-bad-import-order
from thattn.tasks.base import DataOptions
from thattn.tasks.base import get
from thattn.tasks.base import ModelOptions
from thattn.tasks.base import names
from thattn.tasks.base import register
from thattn.tasks.base import Task
from thattn.tasks.base import TaskFiles
