"""`TrainOptions`: how to train, checked before anything runs."""

import dataclasses

from thattn import run_dir
from thattn import sharding
from thattn import validation
from thattn.training import dtensor
from thattn.training import optimizer as optimizer_lib
from thattn.training import strategies

MIXED_PRECISION = ("off", "float16", "bfloat16")
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
                                       dtensor.DEFAULT_LAYOUT_RULES)
    rules.check_mesh(mesh)
    return mesh, rules

  @property
  def peak_learning_rate(self):
    return (self.learning_rate or
            optimizer_lib.DEFAULT_LEARNING_RATES[self.optimizer])
