"""Training tasks, one module each, looked up by name.

    from thattn import tasks
    tasks.names()                 # ('mlm', 'span_corruption', ...)
    task_class = tasks.get("mlm")

See `thattn.tasks.base` for the interface and `docs/training.md` ("Adding a
task") for how to add one. Importing this package registers the built-in
tasks below.
"""

from thattn.core import requirements  # pylint: disable=g-bad-import-order

# Before the first TensorFlow import: names the pip extra if it is missing.
requirements.require("thattn.tasks", requirements.TENSORFLOW)

# In the order `names()` and `thattn-train --help` list them: pretraining,
# fine-tuning, then the synthetic task.
from thattn.tasks import mlm  # pylint: disable=g-bad-import-order
from thattn.tasks import span_corruption  # pylint: disable=g-bad-import-order
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
