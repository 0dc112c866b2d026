"""Staging folders: outputs written beside their target, renamed into place.

`thattn-export` and `thattn-convert` write their output into a hidden
folder beside the target, `.<name>.incomplete-<pid>` (and a replaced
export's old copy into `.<name>.incomplete-<pid>.old`), and rename it into
place when it is complete. Each such folder holds a marker file,
`.thattn-staging.json` (the process id, host and program), removed just
before the rename, so a completed output never carries it.

A process killed mid-write (SIGKILL, a power cut) leaves its staging folder
behind. The next `staged` write into the same target removes every one
that is thattn's own, recognized by both its name and its marker, written on
this host by a process that is gone. A folder of a live process, of another
host, or without the marker (not thattn's) is left alone.
"""

import contextlib
import json
import os
import re
import shutil
import socket

from thattn.io import write_failures

MARKER = ".thattn-staging.json"
_INCOMPLETE = "incomplete"


def staging_path(target, suffix=""):
  """`.<name>.incomplete-<pid><suffix>` beside target (an absolute path)."""
  parent, name = os.path.split(os.path.abspath(target))
  return os.path.join(parent, f".{name}.{_INCOMPLETE}-{os.getpid()}{suffix}")


def mark(folder, *, program, target):
  """Writes the marker that makes `folder` recognizably thattn's staging."""
  with open(os.path.join(folder, MARKER), "w") as f:
    json.dump({"pid": os.getpid(), "host": socket.gethostname(),
               "program": program, "target": os.path.abspath(target)}, f)


def unmark(folder):
  """Removes the marker: the folder is about to become a complete output."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(folder, MARKER))


def leftovers(target):
  """The staging folders of `target` that killed thattn processes left."""
  parent, name = os.path.split(os.path.abspath(target))
  pattern = re.compile(
      rf"\.{re.escape(name)}\.{_INCOMPLETE}-(\d+)(\.[A-Za-z0-9_-]+)?")
  if not os.path.isdir(parent):
    return []
  found = []
  for entry in sorted(os.listdir(parent)):
    match = pattern.fullmatch(entry)
    folder = os.path.join(parent, entry)
    if (match and os.path.isdir(folder) and not os.path.islink(folder) and
        _left_by_a_gone_process(folder, int(match.group(1)))):
      found.append(folder)
  return found


def remove_leftovers(target, log=print):
  """Removes `leftovers(target)`, one log line each."""
  for folder in leftovers(target):
    shutil.rmtree(folder, ignore_errors=True)
    log(f"Removed {folder}, left by a killed thattn process.")


@contextlib.contextmanager
def staged(target, *, program, log=print, suffix=""):
  """Yields a new, marked staging folder beside target; removes it on error.

  Before it is made, what killed writes into the same target left is
  removed (`remove_leftovers`). The caller unmarks the folder (`unmark`)
  and renames it into place inside the block.
  """
  remove_leftovers(target, log)
  staging = staging_path(target, suffix)
  if os.path.isdir(staging):
    shutil.rmtree(staging)  # our own leftover: same name, same process id
  try:
    os.makedirs(staging)
    mark(staging, program=program, target=target)
    yield staging
  except Exception as error:  # pylint: disable=broad-except
    reason = write_failures.cause(error)
    if reason is None:
      raise
    # A full or read-only disk: one line, not the writer's traceback.
    failure = write_failures.WriteFailed(
        f"{program} could not write {target}: {reason}. {target} is as it "
        f"was and the unfinished copy ({staging}) is removed; make room and "
        "run it again.")
    failure.errno = write_failures.errno_of(reason)
    raise failure from None
  finally:
    shutil.rmtree(staging, ignore_errors=True)  # gone if it was renamed


def _left_by_a_gone_process(folder, pid):
  try:
    with open(os.path.join(folder, MARKER)) as f:
      marker = json.load(f)
  except (OSError, ValueError):
    return False  # no marker: not a folder thattn made
  if not isinstance(marker, dict) or marker.get("pid") != pid:
    return False
  if marker.get("host") != socket.gethostname():
    return False  # its process may live on the other host
  return not alive(pid)


def alive(pid):
  """Whether process `pid` exists on this host."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process
  except OverflowError:
    return False  # no such process id
  return True
