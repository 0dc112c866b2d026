"""Running pytest and Python on one Keras 3 backend, in a process of its own.

Keras 3 fixes its backend at import, so the tests in this folder start a
process per backend (KERAS_BACKEND set) and check what it prints.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

from tests import forkserver

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = pathlib.Path(__file__).resolve().parent
BACKENDS = ("tensorflow", "jax", "torch")
# XLA compiles each test's small functions once (eager JAX compiles each
# op for each new shape), and on CPU that compiling is most of the JAX
# checks' time. Level 0 skips LLVM's optimizations (backend_checks.py:
# 100 s -> 55 s on 2 cores); XLA's older elemental emitters in place of
# its fusion emitters compile the same programs faster again (360 tiny
# programs: 20.9 s -> 12.8 s; gpu_paths_checks.py 25 s -> 16 s). Neither
# changes a result the checks compare (each is against NumPy or keras.ops
# at its own tolerance). The tests' thattn-train and thattn-ablate runs
# compile so too (`train_environment`; a fresh tiny keras3 BERT
# run: 22.7 s -> 16.0 s on 2 cores, its held-out ln_ppl equal); what users
# run, at XLA's defaults, is what the README's and the docs' commands run
# (tests/readme_test.py, tests/docs_test.py, tests/install_test.py).
# Eigen's thread pool off as well: the tests' tiny programs gain nothing
# from a second thread, and the other pytest worker holds the second core
# (two tiny keras3 BERT runs side by side: 11.8 s -> 10.3 s, the same
# losses; backend_checks.py twice side by side: 27.5 s -> 26.6 s).
UNOPTIMIZED_XLA_FLAGS = "--xla_backend_optimization_level=0"
TEST_XLA_FLAGS = (UNOPTIMIZED_XLA_FLAGS +
                  " --xla_cpu_use_fusion_emitters=false"
                  " --xla_cpu_multi_thread_eigen=false")


def train_environment(*unset):
  """os.environ for a thattn-train run that picks its Keras 3 framework
  itself (no KERAS_BACKEND), less the variables named in `unset`, with
  TensorFlow's info lines off and XLA compiling with TEST_XLA_FLAGS."""
  environment = {key: value for key, value in os.environ.items()
                 if key not in ("KERAS_BACKEND", "XLA_FLAGS", *unset)}
  environment.update(XLA_FLAGS=TEST_XLA_FLAGS, TF_CPP_MIN_LOG_LEVEL="2")
  return environment


def require(backend):
  if importlib.util.find_spec(backend) is None:
    pytest.skip(f"{backend} is not installed (pip install -e '.[{backend}]')")


def run(backend, args, timeout=600, **env):
  environment = {**os.environ, "KERAS_BACKEND": backend,
                 "TF_CPP_MIN_LOG_LEVEL": "3", **env}
  environment["XLA_FLAGS"] = " ".join(
      [TEST_XLA_FLAGS] + environment.get("XLA_FLAGS", "").split())
  # Forked from a server that imported Keras 3 on this framework (and
  # nothing of thattn's, nor TensorFlow unless it is the framework).
  result = forkserver.run([sys.executable, *args], cwd=ROOT,
                          env=environment, capture_output=True, text=True,
                          timeout=timeout, check=False, preload="keras3")
  assert result.returncode == 0, (
      f"{backend}: {' '.join(args)} failed:\n{result.stdout[-6000:]}\n"
      f"{result.stderr[-3000:]}")
  return result.stdout


def run_pytest(backend, checks, **env):
  """pytest on one or more *_checks.py files (a name or a list), in one
  process: the backend's import is paid once."""
  checks = [checks] if isinstance(checks, str) else list(checks)
  # --noconftest: tests/conftest.py imports TensorFlow and tensorflow-text
  # for the other tests, which the JAX and PyTorch processes must not need.
  return run(backend, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--noconftest", *(str(HERE / name) for name in checks)],
             **env)


