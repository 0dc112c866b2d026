"""Writes the machine refused: a full disk, a read-only one, a size limit.

TensorFlow reports them as `ResourceExhaustedError` ("No space left on
device"), `OutOfRangeError` ("File too large") or another op error, with
the path and the cause buried in a long message; Python as `OSError` with
an errno. `cause(error)` recognizes them, so a writer can stop with one
line that names the path and says what the user can do, instead of a
traceback (and a reader can tell them from a bug, which keeps its
traceback).

Plain Python: no TensorFlow import, so every rank of thattn can use it.
"""

import contextlib
import errno
import os
import shutil

# errno, the words operating systems put in the message, what to say.
_CAUSES = (
    (errno.ENOSPC, "No space left on device",
     "the disk is full (no space left on device)"),
    (errno.EDQUOT, "Disk quota exceeded",
     "the disk quota is exceeded"),
    (errno.EROFS, "Read-only file system",
     "the file system is read-only"),
    (errno.EFBIG, "File too large",
     "a file would exceed the size limit of this process or file system"),
)


class WriteFailed(OSError):
  """A write the machine refused; the message names the path and the cause.

  An OSError (what it is), with `errno` set to the cause's.
  """


def cause(error):
  """'the disk is full (...)' and the like for a refused write, else None."""
  code = getattr(error, "errno", None)
  text = str(error)
  for number, words, phrase in _CAUSES:
    if code == number or words in text:
      return phrase
  return None


def errno_of(phrase):
  """The errno of a phrase `cause` returned."""
  for number, _, known in _CAUSES:
    if known == phrase:
      return number
  return errno.EIO


@contextlib.contextmanager
def refused_writes(where, then, folder=None):
  """Within the block, a write the machine refuses (`cause`) becomes one
  WriteFailed: 'could not write <where> (<the file>): <cause>. <then>',
  the file named where the error says it (an OSError's filename, or a path
  under `folder` in a TensorFlow error's message). A WriteFailed raised
  inside (a more precise one) and every other error pass as they are."""
  try:
    yield
  except WriteFailed:
    raise
  except Exception as error:  # pylint: disable=broad-except
    reason = cause(error)
    if reason is None:
      raise
    written = _file_of(error, folder)
    failure = WriteFailed(f"could not write {where}"
                          + (f" ({written})" if written else "")
                          + f": {reason}. {then}")
    failure.errno = errno_of(reason)
    raise failure from None


def cache_writes(directory):
  """`refused_writes` for thattn's cache (`$THATTN_CACHE_DIR`): a full or
  read-only disk there names the cache and how to move it."""
  return refused_writes(
      f"thattn's cache {directory}",
      then="Make room there, or set THATTN_CACHE_DIR to a folder with space "
           "that this user can write, and rerun.", folder=directory)


def _file_of(error, folder):
  """The file a refused write was writing, where the error says it."""
  filename = getattr(error, "filename", None)
  if filename:
    return str(filename)
  if folder:
    for word in str(error).replace(";", " ").replace(",", " ").split():
      word = word.strip("'\"()[]:")
      if word.startswith(str(folder)):
        return word
  return None


def checkpoint_not_written(error, *, directory, step, latest, rerun):
  """The WriteFailed to raise when saving checkpoint `step` into
  `directory` failed with `error`, or None when `error` is not a refused
  write. Removes what the failed save left (`*-<step>_temp` in
  `directory`: TensorFlow's staging folder of that very save).

  `latest` is the newest complete checkpoint (kept), or None; `rerun` says
  how to resume once the cause is fixed.
  """
  reason = cause(error)
  if reason is None:
    return None
  removed = remove_partial_checkpoint(directory, step)
  kept = (f"The last complete checkpoint, {latest}, is kept: {rerun}" if
          latest else f"No checkpoint was written yet; {rerun}")
  failure = WriteFailed(
      f"could not write the checkpoint of step {step} into {directory}: "
      f"{reason}. Training stopped rather than go on unsaved"
      + (f"; the unfinished {', '.join(removed)} was removed" if removed
         else "") + f". {kept}")
  failure.errno = errno_of(reason)  # set apart: str() stays the message
  return failure


def remove_partial_checkpoint(directory, step):
  """Removes `<prefix>-<step>_temp*` entries of `directory`; their names."""
  removed = []
  try:
    names = sorted(os.listdir(directory))
  except OSError:
    return removed
  for name in names:
    if f"-{step}_temp" not in name:
      continue
    path = os.path.join(directory, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      try:
        os.remove(path)
      except OSError:
        continue
    removed.append(name)
  return removed
