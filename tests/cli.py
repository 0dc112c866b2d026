"""Running thattn's binaries from tests, as a user runs them.

One helper for every test that runs a binary: `command` spells the
command line (`python -m thattn.bin.<binary> ...`), `run` runs it through
the fork server (tests/forkserver.py: a forked, already-imported Python,
which behaves as a fresh one) and returns the finished process, and
`run_ok` fails the test with the ends of the output unless it exited 0.
"""

import sys

from tests import forkserver


def command(binary, *flags):
  """The command line of `thattn.bin.<binary>` with `flags`."""
  return [sys.executable, "-m", f"thattn.bin.{binary}", *flags]


def run(args, env=None, timeout=600, cwd=None):
  """`args` (a command line) run to the end; its CompletedProcess, with
  text stdout and stderr."""
  return forkserver.run(list(args), env=env, capture_output=True, text=True,
                        timeout=timeout, check=False, cwd=cwd)


def run_ok(args, env=None, timeout=600):
  """`args` run to the end; its stdout. Fails the test with the ends of
  its output if it exits with an error."""
  result = run(args, env=env, timeout=timeout)
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
  return result.stdout
