"""Compiles a kernel's C++ source against the installed TensorFlow, once.

The shared library goes to `<cache>/kernels/<name>-<key>.so` (cache as in
`thattn.io.paths.cache_dir`), where the key hashes everything the binary depends
on: the source, the TensorFlow version and its compile and link flags, the
compiler, and this CPU's instruction-set flags (the build uses
`-march=native`, so a library from another CPU is never loaded); the
compiling and caching are `thattn.kernels.compiler`'s. A first use compiles
for about 15 seconds on 2 cores; every later process loads it.

Set `THATTN_FUSED_KERNELS=0` to never build or load a kernel (the layers then
use TensorFlow ops), and `CXX` to choose the compiler (default `g++`).
"""

from absl import logging
import tensorflow as tf

from thattn.kernels import compiler


# name -> loaded op module, or the KernelUnavailable saying why not. A failed
# build is remembered so that each process tries it at most once.
_loaded = {}


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
    except (compiler.KernelUnavailable, tf.errors.NotFoundError,
            OSError) as error:
      reason = error if isinstance(error, compiler.KernelUnavailable) else (
          compiler.KernelUnavailable(
              f"loading the {name} kernel failed: {error}"))
      if compiler.enabled():  # else the user asked for this; no need to warn
        logging.warning("thattn's %s kernel is unavailable, so TensorFlow "
                        "ops run instead (slower, same results): %s", name,
                        reason)
      _loaded[name] = reason
  result = _loaded[name]
  if isinstance(result, compiler.KernelUnavailable):
    raise result
  return result


@tf.autograph.experimental.do_not_convert
def library_path(name):
  """Path of kernel `name`'s compiled library, compiling it if not cached.

  Raises `KernelUnavailable` as `load` does (without remembering it).
  """
  return compiler.compiled_library(
      name, tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags(),
      tf.__version__)
