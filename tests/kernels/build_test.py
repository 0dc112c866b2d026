"""Building a kernel: once per cache, atomically, with clear failures."""

import os
import shutil
import sys

import pytest

from tests import forkserver
from thattn.kernels import build
from thattn.kernels import compiler
from thattn.kernels import talking_heads_softmax


def test_missing_compiler_is_named(tmp_path, monkeypatch):
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "/nonexistent/g++")
  with pytest.raises(compiler.KernelUnavailable,
                     match=r"no C\+\+ compiler: '/nonexistent/g\+\+'"):
    build.library_path(talking_heads_softmax.KERNEL)


def test_failed_compile_leaves_no_library(tmp_path, monkeypatch):
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
  with pytest.raises(compiler.KernelUnavailable,
                     match=r"compiling the talking_heads_softmax kernel "
                     r"failed \(exit 1\)"):
    build.library_path(talking_heads_softmax.KERNEL)
  assert not [name for name in os.listdir(tmp_path / "kernels")
              if not name.endswith(".lock")]


def test_switched_off(monkeypatch):
  monkeypatch.setenv("THATTN_FUSED_KERNELS", "0")
  assert not compiler.enabled()
  with pytest.raises(compiler.KernelUnavailable,
                     match="THATTN_FUSED_KERNELS=0"):
    build.library_path(talking_heads_softmax.KERNEL)


def test_a_damaged_library_is_compiled_again_once_then_reused(tmp_path,
                                                             monkeypatch):
  """A library cut short (a full disk, a copy killed half-way) would crash
  every process that loads it with a Bus error; it is rebuilt instead, into
  the cache, once: the next use loads what was built.

  (One compile checks both the rebuild and the cache's reuse; a compile
  into an empty cache takes the same path in `compiler.compiled_library`,
  and test_failed_compile_leaves_no_library covers its failure.)
  """
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("THATTN_CACHE_DIR", None)
  run_layer = [sys.executable, "-c", (
      "import numpy as np, tf_keras, thattn.layers as L\n"
      "tf_keras.utils.set_random_seed(0)\n"
      "layer = L.TalkingHeadsAttention(2, 4, fused_kernel=True)\n"
      "x = np.ones((1, 3, 8), 'float32')\n"
      "print(float(layer(x, x).numpy().sum()))\n")]
  # The machine's cache (compiled there once per machine) gives the whole
  # library and the outputs to expect; this test's cache gets a copy.
  first = forkserver.run(run_layer, env=env, capture_output=True, text=True,
                         timeout=600, check=False)
  assert first.returncode == 0, first.stderr[-2000:]
  with pytest.MonkeyPatch.context() as patch:
    patch.delenv("THATTN_CACHE_DIR", raising=False)
    whole = build.library_path(talking_heads_softmax.KERNEL)
  (tmp_path / "kernels").mkdir()
  library = tmp_path / "kernels" / os.path.basename(whole)
  for suffix in ("", ".sha256"):
    shutil.copy(whole + suffix, f"{library}{suffix}")
  with open(library, "r+b") as f:
    f.truncate(1000)
  env["THATTN_CACHE_DIR"] = str(tmp_path)
  again = forkserver.run(run_layer, env=env, capture_output=True, text=True,
                         timeout=600, check=False)
  assert again.returncode == 0, again.stderr[-2000:]  # was -7 (SIGBUS)
  assert again.stdout == first.stdout
  assert f"{library} does not match its digest" in again.stderr
  assert os.path.getsize(library) > 1000  # compiled again, whole
  # The cache now holds the rebuilt library under the kernel's name, no
  # temporary file, and the next use loads it without compiling again.
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  assert build.library_path(talking_heads_softmax.KERNEL) == str(library)
  assert library.name.startswith("talking_heads_softmax-")
  built = os.stat(library).st_mtime_ns
  assert build.library_path(talking_heads_softmax.KERNEL) == str(library)
  assert os.stat(library).st_mtime_ns == built  # not compiled again
  assert not [name for name in os.listdir(tmp_path / "kernels")
              if ".tmp" in name]
  # An empty digest, or none (a library from before digests), is named too.
  digest = tmp_path / "kernels" / f"{library.name}.sha256"
  digest.write_text("")
  assert "does not match its digest" in compiler._damage(str(library))  # pylint: disable=protected-access
  digest.unlink()
  assert "has no digest" in compiler._damage(str(library))  # pylint: disable=protected-access
