"""Test processes that start with TensorFlow already imported.

Many tests run thattn's binaries and scripts in processes of their own: a
run killed with SIGKILL, a run lock held by another process, workers of a
cluster, a full disk, Keras 3 on a framework of its own. A fresh Python
spends about 7 s on 2 cores importing TensorFlow, tf-keras,
tensorflow-text and thattn before its first line of work, and the suite
starts ~250 such processes. `run` and `Popen` here, with
`subprocess.run`'s and `subprocess.Popen`'s arguments, start each command
instead as a fork of a server process that has done those imports once
(one server per pytest worker, per set of imports, `preload`, and per
import-time environment, see `_server_key`).

The child is a real process: its own pid, exit status, signals, open files,
locks and memory; `python -m module`, `python script.py`, `python -c code`
and thattn's console scripts run in it as Python would run them
(`runpy`, `sys.argv`, `sys.path[0]` and the command's PYTHONPATH,
`__main__`, exit status, uncaught
tracebacks on stderr, atexit), and nothing of TensorFlow has started in it
(no eager context, devices, threads or traced functions): what the tests'
docstrings call "a fresh Python" (logical devices, a mesh, TF_CONFIG,
AutoGraph's caches) holds for it. What differs from a fresh interpreter: the
preloaded modules were imported before the command's environment was set
(so the server is keyed by every variable they read at import), their
import-time log lines went to the server's stderr, Python's hash seed is
the server's, and the child skips the interpreter's module teardown at
exit (`forkserver_main.exit_now` says why). Commands this cannot run as
Python would (another program, interpreter options other than
-X faulthandler) fall back to `subprocess`; tests of what a fresh process
prints at start-up or imports (tests/bin/newcomer_test.py, the import
checks in export_test, docs_test and layers/serialization_test) call
`subprocess` themselves; tests/keras3's import checks run where only Keras
3 is preloaded (preload="keras3"). THATTN_TEST_FORKSERVER=0 makes
every call here a plain subprocess, to compare.

The server is `tests/forkserver_main.py`; its PRELOADS list what it
imports: "thattn" (the default) what thattn's binaries import, "keras3"
Keras 3 on one framework, without TensorFlow unless that is the framework
(tests/keras3/processes.py).
"""

import atexit
import functools
import importlib.metadata
import io
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from tests import forkserver_main

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT
TimeoutExpired = subprocess.TimeoutExpired
CompletedProcess = subprocess.CompletedProcess

# Environment variables read when the preloaded modules are imported:
# Keras 3's framework, TensorFlow's C++ log level (cached at its first log
# line), oneDNN (chosen at import) and OpenBLAS's threads (started when
# NumPy loads it).
_IMPORT_TIME_VARIABLES = ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL",
                          "TF_ENABLE_ONEDNN_OPTS", "OMP_NUM_THREADS",
                          "OPENBLAS_NUM_THREADS")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STATUS_SIZE = forkserver_main.STATUS.size


@functools.lru_cache(maxsize=None)
def _console_scripts():
  """{script name: (module, function)} of thattn's console scripts."""
  scripts = {}
  for entry in importlib.metadata.entry_points(group="console_scripts"):
    if entry.module.startswith("thattn."):
      scripts[entry.name] = (entry.module, entry.attr)
  return scripts


def _program(args):
  """What args asks Python to run: ("module"|"path"|"code"|"entry", what,
  argv, faulthandler), or None when a fork cannot run it as Python would."""
  args = [os.fspath(arg) for arg in args]
  if not args:
    return None
  executable = args[0]
  name = os.path.basename(executable)
  script_dir = os.path.dirname(os.path.abspath(sys.executable))
  if name in _console_scripts() and os.path.dirname(executable) == script_dir:
    module, function = _console_scripts()[name]
    return ("entry", (module, function), args, False)
  if os.path.realpath(executable) != os.path.realpath(sys.executable):
    return None
  rest, faulthandler = args[1:], False
  while rest and rest[0] == "-X" and len(rest) > 1 and (
      rest[1] == "faulthandler"):
    faulthandler, rest = True, rest[2:]
  if not rest:
    return None
  if rest[0] == "-m" and len(rest) > 1:
    return ("module", rest[1], [rest[1]] + rest[2:], faulthandler)
  if rest[0] == "-c" and len(rest) > 1:
    return ("code", rest[1], ["-c"] + rest[2:], faulthandler)
  if rest[0].startswith("-"):
    return None
  return ("path", rest[0], rest, faulthandler)


def _server_key(program, env, preload):
  """The server's imports and the import-time variables the command's
  process would import with.

  thattn's binaries choose Keras 3's framework for --backend=keras3 and
  raise TensorFlow's log level before importing it (`thattn.bin.cli`);
  the key holds what they would choose.
  """
  env = dict(env)
  kind, what, argv, _ = program
  module = what[0] if kind == "entry" else what if kind == "module" else ""
  if module.startswith("thattn.bin."):
    from thattn.bin import cli  # pylint: disable=g-import-not-at-top
    cli.choose_keras3_framework(argv, environ=env)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  return (preload,) + tuple((name, env.get(name))
                            for name in _IMPORT_TIME_VARIABLES)


class _Server:
  """One fork server (`tests/forkserver_main.py`) for one key: a process
  with the key's PRELOADS imported under its variables, on a Unix socket."""

  def __init__(self, key):
    preload, variables = key[0], key[1:]
    self.folder = tempfile.mkdtemp(prefix="thattn_forkserver_")
    self.address = os.path.join(self.folder, "socket")
    env = {name: value for name, value in os.environ.items()
           if name not in _IMPORT_TIME_VARIABLES}
    env.update({name: value for name, value in variables
                if value is not None})
    env["PYTHONPATH"] = os.pathsep.join(
        [_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                   if p])
    log = os.path.join(self.folder, "stderr")
    # stdin stays a pipe from this process: the server exits when it closes.
    with open(log, "wb") as stderr:
      self.process = subprocess.Popen(
          [sys.executable, "-m", "tests.forkserver_main", self.address,
           preload],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
          cwd=_ROOT, env=env)
    ready = self.process.stdout.readline()
    if ready.strip() != b"ready":
      self.process.wait()  # its stderr is complete once it has exited
      with open(log, errors="replace") as f:
        reason = f.read()[-3000:]
      self.close()  # removes the folder, the log with it
      raise RuntimeError(f"the fork server for {key} did not start:"
                         f"\n{reason}")

  def spawn(self, request, fds):
    """Sends a command and its stdin, stdout and stderr; returns the
    child's pid and the connection its wait status will come on."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(self.address)
    payload = pickle.dumps(request)
    socket.send_fds(connection, [forkserver_main.LENGTH.pack(len(payload))],
                    fds)
    connection.sendall(payload)
    pid = forkserver_main.STATUS.unpack(
        forkserver_main.receive(connection, _STATUS_SIZE))[0]
    if pid < 0:
      raise RuntimeError("the fork server refused to fork: a thread started "
                         "in it after its imports")
    return pid, connection

  def close(self):
    if self.process.poll() is None:
      self.process.stdin.close()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    shutil.rmtree(self.folder, ignore_errors=True)


_servers = {}
_servers_lock = threading.Lock()


def _server(key):
  with _servers_lock:
    if key not in _servers or _servers[key].process.poll() is not None:
      if key in _servers:
        _servers[key].close()
      _servers[key] = _Server(key)
    return _servers[key]


@atexit.register
def close_servers():
  """Ends every server and removes its folder. tests/conftest.py calls it
  when a session ends: a pytest-xdist worker can be ended before its atexit
  handlers run, which left a folder per server in the temporary folder."""
  with _servers_lock:
    servers = list(_servers.values())
    _servers.clear()
  for server in servers:
    server.close()


def enabled():
  return os.environ.get("THATTN_TEST_FORKSERVER", "1") != "0"


_FORKABLE_OPTIONS = {"stdin", "stdout", "stderr", "env", "cwd", "text",
                     "universal_newlines", "encoding", "errors", "preload"}


def _forkable(args, options):
  """Whether `args` with these Popen options can run as a fork."""
  return (enabled() and set(options) <= _FORKABLE_OPTIONS and
          not isinstance(args, (str, bytes)) and _program(args) is not None)


class Popen:
  """A forked child with `subprocess.Popen`'s interface (the part tests use).

  Falls back to `subprocess.Popen` for commands a fork cannot run (see the
  module): `Popen(...)` then returns a real `subprocess.Popen`.
  """

  def __new__(cls, args, **kwargs):
    if not _forkable(args, kwargs):
      kwargs.pop("preload", None)
      return subprocess.Popen(args, **kwargs)
    return super().__new__(cls)

  def __init__(self, args, *, stdin=None, stdout=None, stderr=None,
               env=None, cwd=None, text=False, universal_newlines=False,
               encoding=None, errors=None, preload="thattn"):
    """subprocess.Popen's arguments; `preload` names the server's imports
    (`forkserver_main.PRELOADS`)."""
    self.args = args
    self.returncode = None
    program = _program(args)
    env = dict(os.environ if env is None else env)
    text = text or universal_newlines or encoding is not None
    opened, child_fds = [], []
    self.stdin = self.stdout = self.stderr = None
    for index, want in enumerate((stdin, stdout, stderr)):
      if want is None:
        fd = os.open(os.devnull, os.O_RDONLY) if index == 0 else index
        if index == 0:
          opened.append(fd)
      elif want == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
      elif want == PIPE:
        read, write = os.pipe()
        ours, fd = (write, read) if index == 0 else (read, write)
        opened.append(fd)
        stream = os.fdopen(ours, "wb" if index == 0 else "rb")
        if text:
          stream = io.TextIOWrapper(stream, encoding=encoding,
                                    errors=errors, write_through=True)
        setattr(self, ("stdin", "stdout", "stderr")[index], stream)
      elif want == STDOUT and index == 2:
        fd = None  # the child's stdout, set below
      elif isinstance(want, int):
        fd = want
      else:
        fd = want.fileno()
      child_fds.append(fd)
    if child_fds[2] is None:
      child_fds[2] = child_fds[1]
    request = {"program": program, "env": env,
               "cwd": os.fspath(cwd) if cwd is not None else os.getcwd()}
    try:
      server = _server(_server_key(program, env, preload))
      self.pid, self._connection = server.spawn(request, child_fds)
    finally:
      for fd in opened:
        os.close(fd)

  def poll(self):
    if self.returncode is None:
      self._connection.setblocking(False)
      try:
        data = self._connection.recv(_STATUS_SIZE, socket.MSG_PEEK)
      except BlockingIOError:
        data = b""
      finally:
        self._connection.setblocking(True)
      if len(data) == _STATUS_SIZE:
        self.wait()
    return self.returncode

  def wait(self, timeout=None):
    """The child's exit status, as subprocess gives it (-N: signal N)."""
    if self.returncode is None:
      self._connection.settimeout(timeout)
      try:
        status = forkserver_main.STATUS.unpack(
            forkserver_main.receive(self._connection, _STATUS_SIZE))[0]
      except socket.timeout:
        raise TimeoutExpired(self.args, timeout) from None
      finally:
        self._connection.settimeout(None)
      self.returncode = os.waitstatus_to_exitcode(status)
      self._connection.close()
    return self.returncode

  def send_signal(self, sig):
    if self.returncode is None:
      try:
        os.kill(self.pid, sig)
      except ProcessLookupError:
        pass

  def kill(self):
    self.send_signal(signal.SIGKILL)

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def communicate(self, input=None, timeout=None):  # pylint: disable=redefined-builtin
    """Reads stdout and stderr to their ends (in threads, so neither pipe
    fills and blocks the child), then waits."""
    if self.stdin is not None and not self.stdin.closed:
      if input:
        self.stdin.write(input)
      self.stdin.close()
    results = {}
    readers = []
    for name in ("stdout", "stderr"):
      stream = getattr(self, name)
      if stream is not None and not stream.closed:  # read by an earlier call
        reader = threading.Thread(target=lambda n=name, s=stream: (
            results.__setitem__(n, s.read())), daemon=True)
        reader.start()
        readers.append(reader)
    deadline = None if timeout is None else time.monotonic() + timeout
    for reader in readers:
      reader.join(None if deadline is None else
                  max(deadline - time.monotonic(), 0))
      if reader.is_alive():
        raise TimeoutExpired(self.args, timeout)
    self.wait(None if deadline is None else
              max(deadline - time.monotonic(), 0.1))
    for name in ("stdout", "stderr"):
      if getattr(self, name) is not None:
        getattr(self, name).close()
    return results.get("stdout"), results.get("stderr")

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    for stream in (self.stdout, self.stderr, self.stdin):
      if stream is not None:
        stream.close()
    self.wait()


def run(args, *, capture_output=False, timeout=None, check=False,
        input=None, **kwargs):  # pylint: disable=redefined-builtin
  """`subprocess.run`, the command forked from a server where it can be."""
  if not _forkable(args, kwargs):
    kwargs.pop("preload", None)
    return subprocess.run(args, capture_output=capture_output,
                          timeout=timeout, check=check, input=input, **kwargs)
  if capture_output:
    kwargs["stdout"] = kwargs["stderr"] = PIPE
  if input is not None:
    kwargs["stdin"] = PIPE
  process = Popen(args, **kwargs)
  try:
    stdout, stderr = process.communicate(input, timeout=timeout)
  except TimeoutExpired:
    process.kill()
    process.wait()
    raise
  result = CompletedProcess(args, process.returncode, stdout, stderr)
  if check:
    result.check_returncode()
  return result
