"""Where thattn keeps what it builds once per machine: corpora, kernels."""

import os


def cache_dir():
  """`$THATTN_CACHE_DIR`, or `~/.cache/thattn` when it is unset or empty."""
  return os.environ.get("THATTN_CACHE_DIR") or os.path.join(
      os.path.expanduser("~"), ".cache", "thattn")
