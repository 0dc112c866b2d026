"""Building a kernel: once per cache, atomically, with clear failures."""

import os

import pytest

from thattn.kernels import build
from thattn.kernels import talking_heads_softmax


def test_compiled_once_into_the_cache_then_reused(tmp_path, monkeypatch):
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  library = build.library_path(talking_heads_softmax.KERNEL)
  assert os.path.dirname(library) == str(tmp_path / "kernels")
  assert os.path.basename(library).startswith("talking_heads_softmax-")
  built = os.stat(library).st_mtime_ns
  assert build.library_path(talking_heads_softmax.KERNEL) == library
  assert os.stat(library).st_mtime_ns == built  # not compiled again
  leftovers = [name for name in os.listdir(tmp_path / "kernels")
               if ".tmp" in name]
  assert not leftovers


def test_missing_compiler_is_named(tmp_path, monkeypatch):
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "/nonexistent/g++")
  with pytest.raises(build.KernelUnavailable,
                     match=r"no C\+\+ compiler: '/nonexistent/g\+\+'"):
    build.library_path(talking_heads_softmax.KERNEL)


def test_failed_compile_leaves_no_library(tmp_path, monkeypatch):
  monkeypatch.setenv("THATTN_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CXX", "false")  # a "compiler" that always fails
  with pytest.raises(build.KernelUnavailable,
                     match=r"compiling the talking_heads_softmax kernel "
                     r"failed \(exit 1\)"):
    build.library_path(talking_heads_softmax.KERNEL)
  assert not [name for name in os.listdir(tmp_path / "kernels")
              if not name.endswith(".lock")]


def test_switched_off(monkeypatch):
  monkeypatch.setenv("THATTN_FUSED_KERNELS", "0")
  assert not build.enabled()
  with pytest.raises(build.KernelUnavailable, match="THATTN_FUSED_KERNELS=0"):
    build.library_path(talking_heads_softmax.KERNEL)
