"""`TrainOptions`: how to train, checked before anything runs."""

import dataclasses

from thattn.io import run_dir
from thattn import sharding
from thattn.core import validation
from thattn.training import dtensor
from thattn.training import optimizer as optimizer_lib
from thattn.training import strategies

MIXED_PRECISION = ("off", "float16", "bfloat16")
# JAX's cluster flags (jax.distributed.initialize's names).
PROCESS_FLAGS = ("coordinator_address", "num_processes", "process_id")
# Where a rerun resumes: the latest checkpoint (a damaged one is an error
# that names it), or the newest one that restores.
RESUME_FROM = ("latest", "latest_intact")
# What builds and trains the model: tf-keras (thattn.training.keras_backend),
# Keras 3 on KERAS_BACKEND (thattn.training.keras3_backend), or Mesh
# TensorFlow's transformer (thattn.mtf.training).
KERAS, KERAS3, MTF, BACKENDS = (run_dir.KERAS, run_dir.KERAS3, run_dir.MTF,
                                 run_dir.BACKENDS)


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  """How to train: steps, batches, optimizer, schedule, logging, devices."""
  train_steps: int = 1000
  batch_size: int = 32
  sequence_length: int = 128
  optimizer: str = "adafactor"
  learning_rate: float = None  # peak rate; None: DEFAULT_LEARNING_RATES
  warmup_steps: int = 100
  decay_fraction: float = 0.1
  eval_every: int = 0  # 0: only before and after training
  eval_steps: int = 20
  log_every: int = 100
  checkpoint_every: int = 500
  max_checkpoints: int = 3
  seed: int = 0
  deterministic: bool = False
  mixed_precision: str = "off"
  strategy: str = "default"
  tpu: str = None
  init_checkpoint: str = None
  resume_from: str = "latest"  # see RESUME_FROM
  cluster_timeout: float = 300.0  # multi_worker_mirrored: wait for the tasks
  # --strategy=dtensor only (thattn.training.dtensor): the mesh, e.g.
  # "batch:2,model:2", and the rules; None: DEFAULT_LAYOUT_RULES there.
  mesh_shape: str = None
  layout_rules: str = None
  backend: str = KERAS  # see BACKENDS
  # --backend=keras3 on JAX across processes (thattn.training.jax_processes):
  # JAX's own names; None where JAX detects the cluster (SLURM, Cloud TPU)
  # or the run is one process. cluster_timeout bounds the joining;
  # heartbeat_timeout how long the others wait for a process that stopped.
  coordinator_address: str = None
  num_processes: int = None
  process_id: int = None
  heartbeat_timeout: int = 100

  def __post_init__(self):
    for name in ("train_steps", "batch_size", "sequence_length",
                 "warmup_steps", "eval_steps", "log_every",
                 "checkpoint_every", "max_checkpoints"):
      validation.positive_int(name, getattr(self, name))
    validation.non_negative_int("eval_every", self.eval_every)
    validation.one_of("optimizer", self.optimizer, optimizer_lib.OPTIMIZERS)
    validation.one_of("mixed_precision", self.mixed_precision,
                      MIXED_PRECISION)
    validation.one_of("strategy", self.strategy, strategies.STRATEGIES)
    validation.one_of("resume_from", self.resume_from, RESUME_FROM)
    validation.positive_int("heartbeat_timeout", self.heartbeat_timeout)
    if not self.cluster_timeout > 0:
      raise ValueError(f"cluster_timeout must be positive, got "
                       f"{self.cluster_timeout}.")
    if self.learning_rate is not None and not self.learning_rate > 0:
      raise ValueError(f"learning_rate must be positive, got "
                       f"{self.learning_rate}.")
    validation.one_of("backend", self.backend, BACKENDS)
    # Flag mistakes fail here, before any device or data is touched.
    if self.backend == MTF:
      self._check_mtf()
    elif self.backend == KERAS3:
      self._check_keras3()
    else:
      dtensor.check_options(
          strategy=self.strategy, mesh_shape=self.mesh_shape,
          layout_rules=self.layout_rules, tpu=self.tpu)
    self._check_processes()

  def _check_mtf(self):
    """--backend=mtf: mtf lays out the mesh itself; what it cannot do."""
    self._refuse_for_backend([
        (f"--strategy={self.strategy}", self.strategy != "default",
         "mtf places the model on --mesh_shape itself"),
        (f"--optimizer={self.optimizer}", self.optimizer != "adafactor",
         "it trains with mtf's AdafactorOptimizer"),
        (f"--mixed_precision={self.mixed_precision}",
         self.mixed_precision != "off", "it trains in float32"),
        (f"--tpu={self.tpu}", bool(self.tpu), "it runs on local CPUs")])

  def _check_keras3(self):
    """--backend=keras3: Keras 3 places the model itself; what it lacks."""
    self._refuse_for_backend([
        (f"--strategy={self.strategy}", self.strategy != "default",
         "Keras 3 lays a run out with --mesh_shape (keras.distribution)"),
        (f"--tpu={self.tpu}", bool(self.tpu),
         "it runs on the devices of KERAS_BACKEND's framework")])

  def _check_processes(self):
    """The JAX cluster flags: --backend=keras3 only; a process id that is
    one of the processes; a coordinator with the count and id beside it."""
    given = {name: getattr(self, name) for name in PROCESS_FLAGS
             if getattr(self, name) is not None}
    if not given:
      return
    if self.backend != KERAS3:
      flags = " ".join(f"--{name}={value}" for name, value in given.items())
      raise ValueError(
          f"{flags}: JAX's cluster flags apply with --backend=keras3 "
          f"(KERAS_BACKEND=jax); --backend={self.backend} runs across "
          "processes from TF_CONFIG or DTENSOR_* (docs/training.md).")
    validation.positive_int("num_processes", self.num_processes,
                            optional=True)
    validation.non_negative_int("process_id", self.process_id or 0)
    if "coordinator_address" in given and len(given) < 3:
      missing = ", ".join(f"--{name}" for name in PROCESS_FLAGS
                          if name not in given)
      raise ValueError(
          f"--coordinator_address={self.coordinator_address} needs "
          f"{missing} too (JAX detects them itself only on SLURM and "
          "Cloud TPU, where no flag is needed).")
    if (self.num_processes is not None and self.process_id is not None and
        self.process_id >= self.num_processes):
      raise ValueError(
          f"--process_id={self.process_id} is not one of the "
          f"--num_processes={self.num_processes} processes (0-"
          f"{self.num_processes - 1}).")

  def _refuse_for_backend(self, unsupported):
    """Refuses each (flag, given, reason) given, then checks the mesh
    flags, which mtf and Keras 3 read alike."""
    for flag, given, reason in unsupported:
      if given:
        raise ValueError(f"{flag} does not apply with --backend="
                         f"{self.backend}: {reason}; drop the flag.")
    if self.mesh_shape is None and self.layout_rules is not None:
      raise ValueError(f"--layout_rules={self.layout_rules!r} needs "
                       f"--mesh_shape with --backend={self.backend}.")
    self.mtf_mesh()  # the mesh and rules parse and fit

  def mtf_mesh(self):
    """--backend=mtf or keras3: (MeshSpec, LayoutRules), or None for one
    device."""
    if self.mesh_shape is None:
      return None
    mesh = sharding.MeshSpec.parse(self.mesh_shape)
    rules = sharding.LayoutRules.parse(self.layout_rules or
                                       sharding.DEFAULT_LAYOUT_RULES)
    rules.check_mesh(mesh)
    return mesh, rules

  @property
  def peak_learning_rate(self):
    return (self.learning_rate or
            optimizer_lib.DEFAULT_LEARNING_RATES[self.optimizer])
