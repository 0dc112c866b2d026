"""Compiles a kernel's C++ source against the installed TensorFlow, once.

The shared library goes to `<cache>/kernels/<name>-<key>.so` (cache as in
`thattn.paths.cache_dir`), where the key hashes everything the binary depends
on: the source, the TensorFlow version and its compile and link flags, the
compiler, and this CPU's instruction-set flags (the build uses
`-march=native`, so a library from another CPU is never loaded). A first use
compiles for about 15 seconds on 2 cores; every later process loads it.

Set `THATTN_FUSED_KERNELS=0` to never build or load a kernel (the layers then
use TensorFlow ops), and `CXX` to choose the compiler (default `g++`).
"""

import fcntl
import hashlib
import logging as python_logging
import os
import shutil
import subprocess

from absl import logging
import tensorflow as tf

from thattn import paths

_SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
_OPTIMIZATION_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-w")
_COMPILE_TIMEOUT_SECONDS = 600
# Information lines for the user (the one-time compile); the binaries show
# them (`thattn.bin.cli`), a library user may turn them on with Python's
# logging.
ANNOUNCE = python_logging.getLogger("thattn")

# name -> loaded op module, or the KernelUnavailable saying why not. A failed
# build is remembered so that each process tries it at most once.
_loaded = {}


class KernelUnavailable(RuntimeError):
  """A kernel cannot be built or loaded here; the message says why."""


def enabled():
  """False when `THATTN_FUSED_KERNELS=0` turns the kernels off."""
  return os.environ.get("THATTN_FUSED_KERNELS", "1") != "0"


# The first load often happens while a layer is traced inside a tf.function;
# AutoGraph must not try to convert the file and process handling below.
@tf.autograph.experimental.do_not_convert
def load(name):
  """The op module of kernel `name` (`<name>.cc` in this folder).

  Compiles it on first use. Raises `KernelUnavailable` when kernels are
  turned off, no compiler is found, or compiling or loading fails; the
  failure is remembered for the rest of the process.
  """
  if name not in _loaded:
    try:
      _loaded[name] = tf.load_op_library(library_path(name))
    except (KernelUnavailable, tf.errors.NotFoundError, OSError) as error:
      reason = error if isinstance(error, KernelUnavailable) else (
          KernelUnavailable(f"loading the {name} kernel failed: {error}"))
      if enabled():  # else the user asked for this; no need to warn
        logging.warning("thattn's %s kernel is unavailable, so TensorFlow "
                        "ops run instead (slower, same results): %s", name,
                        reason)
      _loaded[name] = reason
  result = _loaded[name]
  if isinstance(result, KernelUnavailable):
    raise result
  return result


@tf.autograph.experimental.do_not_convert
def library_path(name):
  """Path of kernel `name`'s compiled library, compiling it if not cached.

  Raises `KernelUnavailable` as `load` does (without remembering it).
  """
  if not enabled():
    raise KernelUnavailable("THATTN_FUSED_KERNELS=0 turns the kernels off")
  compiler = shutil.which(os.environ.get("CXX", "g++"))
  if compiler is None:
    raise KernelUnavailable(
        f"no C++ compiler: {os.environ.get('CXX', 'g++')!r} is not on PATH "
        f"(install g++ or set CXX)")
  source = os.path.join(_SOURCE_DIR, f"{name}.cc")
  command = _command(compiler, source)
  directory = os.path.join(paths.cache_dir(), "kernels")
  os.makedirs(directory, exist_ok=True)
  library = os.path.join(directory, f"{name}-{_key(source, command)}.so")
  # One process compiles while the others (e.g. pytest-xdist workers) wait
  # for its result instead of compiling the same thing again.
  with open(f"{library}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(library):
      _compile(command, library, name)
  return library


def _command(compiler, source):
  return ([compiler, *_OPTIMIZATION_FLAGS, *_workaround_flags(), source]
          + tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())


def _workaround_flags():
  """Flags that keep TensorFlow's headers compiling on this CPU.

  On a CPU with AVX512-FP16 (Intel Sapphire Rapids and later),
  `-march=native` makes Eigen (TensorFlow 2.21's copy) include its FP16
  packet code, which g++ 12 rejects ("expected initializer before '<'" in
  PacketMathFP16.h). The kernel computes in float32 and needs none of it.
  """
  return ("-mno-avx512fp16",) if "avx512_fp16" in _cpu_flags() else ()


def _key(source, command):
  digest = hashlib.sha256()
  with open(source, "rb") as f:
    digest.update(f.read())
  # The source's contents count, not where it sits, so two checkouts on
  # one TensorFlow installation share the library.
  flags = " ".join(part for part in command[1:] if part != source)
  for part in (tf.__version__, flags, _compiler_version(command[0]),
               _cpu_flags()):
    digest.update(part.encode())
  return digest.hexdigest()[:16]


def _compiler_version(compiler):
  result = subprocess.run([compiler, "--version"], capture_output=True,
                          text=True, check=False)
  return result.stdout


def _cpu_flags():
  """The instruction-set flags `-march=native` compiles for."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("flags"):
          return line
  except OSError:
    pass
  return ""


def _compile(command, library, name):
  """Runs the compiler into a temporary file, then renames it into place."""
  temporary = f"{library}.tmp{os.getpid()}"
  # Information, not a warning: nothing is wrong. It explains a pause of
  # ~15 s; the binaries print the "thattn" logger's information lines.
  ANNOUNCE.info("Compiling thattn's %s kernel (once per machine, about 15 s) "
                "into %s", name, library)
  try:
    result = subprocess.run([*command, "-o", temporary], capture_output=True,
                            text=True, check=False,
                            timeout=_COMPILE_TIMEOUT_SECONDS)
  except subprocess.TimeoutExpired as error:
    raise KernelUnavailable(f"compiling the {name} kernel took over "
                            f"{_COMPILE_TIMEOUT_SECONDS} s") from error
  if result.returncode != 0:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise KernelUnavailable(
        f"compiling the {name} kernel failed (exit {result.returncode}): "
        f"{' '.join(command)}\n{result.stderr[-2000:]}")
  os.replace(temporary, library)
