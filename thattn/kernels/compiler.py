"""Compiles a C++ kernel once per machine and caches the shared library.

Framework-free (no TensorFlow, no JAX import), so both kernel front ends
use it: `build` (TensorFlow ops) and `thattn.kernels.jax_kernel` (XLA FFI
custom calls). The library goes to `<cache>/kernels/<name>-<key>.so`
(cache as in `thattn.io.paths.cache_dir`), where the key hashes everything the
binary depends on: the source, the framework version and flags the caller
passes, the compiler, and this CPU's instruction-set flags (the build uses
`-march=native`, so a library from another CPU is never loaded).

Set `THATTN_FUSED_KERNELS=0` to never build or load a kernel, and `CXX` to
choose the compiler (default `g++`).

A damaged library (truncated by a full disk, emptied, replaced) would crash
the process that loads it (a `Bus error` when a page past its end is
touched), and every later run with it. So each library has a
`<library>.sha256` beside it, written after the library is complete; a
library whose digest is missing or differs is compiled again (the damaged
file is thattn's own cache entry, and is replaced, with a warning naming
it), never loaded.
"""

import fcntl
import hashlib
import logging as python_logging
import os
import shutil
import subprocess

from thattn.io import paths
from thattn.io import write_failures

_SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
_OPTIMIZATION_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-w")
_COMPILE_TIMEOUT_SECONDS = 600
# Room claimed on the cache's disk before compiling (the libraries are about
# 0.5 MB), so that a full disk refuses at once, not after the compile.
_LIBRARY_ROOM_BYTES = 1 << 20
# Information lines for the user (the one-time compile); the binaries show
# them (`thattn.bin.cli`), a library user may turn them on with Python's
# logging.
ANNOUNCE = python_logging.getLogger("thattn")


class KernelUnavailable(RuntimeError):
  """A kernel cannot be built or loaded here; the message says why."""


def enabled():
  """False when `THATTN_FUSED_KERNELS=0` turns the kernels off."""
  return os.environ.get("THATTN_FUSED_KERNELS", "1") != "0"


def _compiler():
  """The C++ compiler's path; KernelUnavailable when there is none."""
  if not enabled():
    raise KernelUnavailable("THATTN_FUSED_KERNELS=0 turns the kernels off")
  found = shutil.which(os.environ.get("CXX", "g++"))
  if found is None:
    raise KernelUnavailable(
        f"no C++ compiler: {os.environ.get('CXX', 'g++')!r} is not on PATH "
        f"(install g++ or set CXX)")
  return found


def compiled_library(name, flags, framework_version):
  """Path of the library built from `<name>.cc` in this folder with the
  framework's `flags` (include paths, compile and link flags) after the
  common ones, compiling it if not cached.

  Raises `KernelUnavailable` when kernels are off, no compiler is found or
  compiling fails.
  """
  source = os.path.join(_SOURCE_DIR, f"{name}.cc")
  command = [_compiler(), *_OPTIMIZATION_FLAGS, *_workaround_flags(), source,
             *flags]
  directory = os.path.join(paths.cache_dir(), "kernels")
  os.makedirs(directory, exist_ok=True)
  key = _key(source, command, framework_version)
  library = os.path.join(directory, f"{name}-{key}.so")
  # One process compiles while the others (e.g. pytest-xdist workers) wait
  # for its result instead of compiling the same thing again.
  with open(f"{library}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    damage = _damage(library) if os.path.exists(library) else None
    if damage:
      ANNOUNCE.warning("thattn's compiled %s kernel %s %s; compiling it "
                       "again", name, library, damage)
      os.remove(library)
    if not os.path.exists(library):
      _compile(command, library, name)
  return library


def _digest_path(library):
  return f"{library}.sha256"


def _file_digest(path):
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def _damage(library):
  """Why `library` cannot be trusted to load, or None if it is the file its
  digest was written for."""
  digest = _digest_path(library)
  try:
    with open(digest, encoding="ascii") as f:
      expected = f.read().strip()
  except FileNotFoundError:
    return (f"has no digest {digest} (written by an older thattn, or cut "
            "short)")
  except (OSError, UnicodeDecodeError) as error:
    return f"has an unreadable digest {digest} ({error})"
  if _file_digest(library) != expected:
    return f"does not match its digest {digest} (damaged)"
  return None


def _key(source, command, framework_version):
  digest = hashlib.sha256()
  with open(source, "rb") as f:
    digest.update(f.read())
  # The source's contents count, not where it sits, so two checkouts on
  # one installation share the library.
  flags = " ".join(part for part in command[1:] if part != source)
  for part in (framework_version, flags, _compiler_version(command[0]),
               _cpu_flags()):
    digest.update(part.encode())
  return digest.hexdigest()[:16]


def _compiler_version(compiler_path):
  result = subprocess.run([compiler_path, "--version"], capture_output=True,
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


def _workaround_flags():
  """Flags that keep Eigen (TensorFlow 2.21's copy) compiling on this CPU.

  On a CPU with AVX512-FP16 (Intel Sapphire Rapids and later),
  `-march=native` makes Eigen include its FP16 packet code, which g++ 12
  rejects ("expected initializer before '<'" in PacketMathFP16.h). The
  kernels compute in float32 and need none of it.
  """
  return ("-mno-avx512fp16",) if "avx512_fp16" in _cpu_flags() else ()


def _refused(library, name, refused):
  """The error for a library the cache's disk will not take."""
  return KernelUnavailable(
      f"could not write the compiled {name} kernel into {library}: "
      f"{refused}; make room there, or set THATTN_CACHE_DIR to a folder "
      "with space")


def _remove_if_present(*paths):
  for path in paths:
    if os.path.exists(path):
      os.remove(path)


def _reserve_room(temporary, library, name):
  """Claims the library's room in the compiler's output file: a full or
  read-only cache fails here at once instead of after a compile of 15 s or
  more. A file system that cannot allocate ahead is let through."""
  try:
    with open(temporary, "wb") as f:
      os.posix_fallocate(f.fileno(), 0, _LIBRARY_ROOM_BYTES)
  except OSError as error:
    _remove_if_present(temporary)
    refused = write_failures.cause(error)
    if refused:
      raise _refused(library, name, refused) from error


def _compile(command, library, name):
  """Runs the compiler into a temporary file, then renames it into place."""
  temporary = f"{library}.tmp{os.getpid()}"
  _reserve_room(temporary, library, name)
  # Information, not a warning: nothing is wrong. It explains a pause of
  # ~15 s; the binaries print the "thattn" logger's information lines.
  ANNOUNCE.info("Compiling thattn's %s kernel (once per machine, about 15 s) "
                "into %s", name, library)
  try:
    result = subprocess.run([*command, "-o", temporary], capture_output=True,
                            text=True, check=False,
                            timeout=_COMPILE_TIMEOUT_SECONDS)
  except subprocess.TimeoutExpired as error:
    _remove_if_present(temporary)  # the room claimed, or a partial output
    raise KernelUnavailable(f"compiling the {name} kernel took over "
                            f"{_COMPILE_TIMEOUT_SECONDS} s") from error
  if result.returncode != 0:
    _remove_if_present(temporary)
    refused = write_failures.cause(OSError(result.stderr))
    if refused:  # the cache's disk, not the compiler, said no
      raise _refused(library, name, refused)
    raise KernelUnavailable(
        f"compiling the {name} kernel failed (exit {result.returncode}): "
        f"{' '.join(command)}\n{result.stderr[-2000:]}")
  # The digest first, then the library: a library in place always has the
  # digest it was written with, and one cut short by a full disk fails
  # here (OSError) or, later, its digest.
  try:
    with open(f"{temporary}.sha256", "w", encoding="ascii") as f:
      f.write(_file_digest(temporary) + "\n")
    os.replace(f"{temporary}.sha256", _digest_path(library))
    os.replace(temporary, library)
  except OSError as error:
    _remove_if_present(temporary, f"{temporary}.sha256")
    raise KernelUnavailable(
        f"writing the compiled {name} kernel into {library} failed: "
        f"{error}") from error
