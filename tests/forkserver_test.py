"""tests/forkserver.py runs commands as `python` would, in real processes.

Each case compares what a forked child does with what a fresh Python does
for the same command (`subprocess`), or with what Python documents.
"""

import os
import signal
import subprocess
import sys

import pytest

from tests import forkserver

_SHOW = ("import json, os, sys, tempfile\n"
         "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], "
         "'cwd': os.getcwd(), 'name': __name__, "
         "'variable': os.environ.get('THATTN_FORKSERVER_TEST'), "
         "'tmp': tempfile.gettempdir()}))\n")


def _both(args, **kwargs):
  """(forked, fresh) results of one command."""
  kwargs = dict(capture_output=True, text=True, timeout=120, check=False,
                **kwargs)
  return forkserver.run(args, **kwargs), subprocess.run(args, **kwargs)


@pytest.mark.parametrize("form", ["-c", "-m", "script"])
def test_a_command_sees_what_a_fresh_python_sees(tmp_path, form):
  script = tmp_path / "show.py"
  script.write_text(_SHOW)
  args = {"-c": [sys.executable, "-c", _SHOW, "an argument"],
          "-m": [sys.executable, "-m", "show", "an argument"],
          "script": [sys.executable, str(script), "an argument"]}[form]
  (tmp_path / "tmp").mkdir()
  env = dict(os.environ, THATTN_FORKSERVER_TEST="set",
             TMPDIR=str(tmp_path / "tmp"))
  forked, fresh = _both(args, cwd=tmp_path, env=env)
  assert forked.returncode == fresh.returncode == 0, (forked.stderr,
                                                      fresh.stderr)
  assert forked.stdout == fresh.stdout
  assert str(tmp_path / "tmp") in forked.stdout  # TMPDIR, not the server's


def test_exit_statuses_and_tracebacks_are_pythons():
  cases = {"import sys; sys.exit(3)": 3,
           "import sys; sys.exit('a message')": 1,
           "raise ValueError('a value')": 1,
           "import os, signal; os.kill(os.getpid(), signal.SIGKILL)":
               -signal.SIGKILL}
  for code, status in cases.items():
    forked, fresh = _both([sys.executable, "-c", code])
    assert forked.returncode == fresh.returncode == status, code
    assert forked.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]
    if "ValueError" in code:
      assert "Traceback" in forked.stderr
      assert forked.stderr.splitlines()[-1] == "ValueError: a value"


def test_a_child_is_a_process_of_its_own_that_signals_reach(tmp_path):
  child = forkserver.Popen(
      [sys.executable, "-c",
       "import os, time; print(os.getpid(), flush=True); time.sleep(60)"],
      stdout=forkserver.PIPE, text=True)
  assert int(child.stdout.readline()) == child.pid != os.getpid()
  assert child.poll() is None
  child.send_signal(signal.SIGKILL)
  assert child.wait(timeout=30) == -signal.SIGKILL
  assert child.communicate() == ("", None)
  # Again, as a fixture's teardown may after the test's own call.
  assert child.communicate() == (None, None)
  # Atexit functions run and output is flushed at a normal exit.
  result = forkserver.run(
      [sys.executable, "-c",
       "import atexit; atexit.register(print, 'at exit'); print('first')"],
      capture_output=True, text=True, timeout=60)
  assert result.stdout.splitlines() == ["first", "at exit"]


def test_a_timeout_kills_the_child():
  with pytest.raises(forkserver.TimeoutExpired):
    forkserver.run([sys.executable, "-c", "import time; time.sleep(60)"],
                   timeout=1)


def test_other_programs_run_as_subprocesses():
  result = forkserver.run(["echo", "plain"], capture_output=True, text=True)
  assert result.stdout == "plain\n"
  assert isinstance(forkserver.Popen(["true"]), subprocess.Popen)
