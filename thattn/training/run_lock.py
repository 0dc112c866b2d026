"""One run owns a model_dir at a time, and a failed start leaves it as it was.

`hold(model_dir)` takes an exclusive OS file lock (`fcntl.flock`) on
`model_dir/.thattn.lock` for the life of the run. The operating system
releases it whenever the process ends, however it ends (even SIGKILL), so a
lock left by a dead process is never in the way: there is no PID file to
guess from. A second run into a locked model_dir stops at once, before it
writes anything, with the holder's PID, host and command line (which the
holder writes into the lock file as information only).

`StartGuard` remembers what a model_dir held before a run started; if the
start fails (bad flags, bad data, a model that cannot be built), `rollback`
removes what the run wrote since: the whole folder if it did not exist, or
the entries that are new in it. Nothing that was there before is touched.

The lock needs a local (or flock-capable network) filesystem; on other
filesystems (e.g. gs://) runs are not locked, and the log says so.
"""

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time

from thattn.io import write_failures

LOCK_FILE = ".thattn.lock"


class ModelDirInUse(ValueError):
  """Another live process holds the model_dir's lock."""


def _is_local(path):
  return "://" not in str(path)


@contextlib.contextmanager
def hold(directory, *, log=print):
  """Holds `directory`'s lock for the `with` block; see the module.

  Raises:
    ModelDirInUse: another process holds it; names that process.
  """
  if not _is_local(directory):
    log(f"{directory} is not on a local filesystem: it is not locked "
        "against a second run.")
    yield
    return
  path = os.path.join(directory, LOCK_FILE)
  try:
    os.makedirs(directory, exist_ok=True)
    descriptor = _lock(path, directory)
  except (PermissionError, OSError) as error:
    reason = write_failures.cause(error) or (
        "permission denied" if isinstance(error, PermissionError) else None)
    if reason is None:
      raise
    raise write_failures.WriteFailed(
        f"cannot write into the model_dir {directory} ({path}): {reason}. "
        "Choose a --model_dir this user can write, or free space.") from None
  try:
    _write_holder(descriptor)
    yield
  finally:
    os.close(descriptor)  # releases the lock


def _lock(path, directory):
  """A descriptor holding the lock on the file `path` names now.

  A failed start removes the lock file it made (`StartGuard.rollback`)
  while holding it, so a lock taken on a file that has since left `path`
  holds nothing: it is dropped and taken again on the new file.
  """
  while True:
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(descriptor)
      raise ModelDirInUse(
          f"{directory} is in use by another run ({_holder(path)}); wait for "
          "it to finish, or choose another --model_dir.") from None
    try:
      if os.stat(path).st_ino == os.fstat(descriptor).st_ino:
        return descriptor
    except FileNotFoundError:
      pass
    os.close(descriptor)


def _write_holder(descriptor):
  holder = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)}
  os.ftruncate(descriptor, 0)
  os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)


def _holder(path, attempts=40):
  """The lock holder, as it described itself, for an error message.

  The holder writes its description just after taking the lock, so a run
  that lost a race by milliseconds waits a moment (at most 2 s) for it.
  """
  for _ in range(attempts):
    try:
      with open(path, encoding="utf-8") as f:
        holder = json.load(f)
      return (f"process {holder['pid']} on {holder['host']}, started "
              f"{holder['started']}: {holder['command']}")
    except (OSError, ValueError, KeyError):
      time.sleep(0.05)
  return "a process that has not said which"


class StartGuard:
  """Undoes what a failed start wrote into a model_dir; see the module."""

  def __init__(self, directory):
    self.directory = directory
    self.local = _is_local(directory)
    self.existed = self.local and os.path.isdir(directory)
    self.before = set(os.listdir(directory)) if self.existed else set()

  def rollback(self):
    """Removes the folder if this run made it, else only its new entries
    (the lock file too, if this run made it: `_lock` allows for that)."""
    if not self.local:
      return
    if not self.existed:
      shutil.rmtree(self.directory, ignore_errors=True)
      return
    for name in set(os.listdir(self.directory)) - self.before:
      path = os.path.join(self.directory, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        os.remove(path)
