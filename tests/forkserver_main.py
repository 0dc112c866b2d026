"""The fork server of `tests/forkserver.py`: `python -m tests.forkserver_main
SOCKET PRELOAD`.

It imports PRELOADS[PRELOAD] once, says "ready" on stdout, and then forks a
child for
each request on the Unix socket SOCKET. A request is the command's stdin,
stdout and stderr (file descriptors, passed over the socket) and a pickled
{"program", "env", "cwd"}; the server answers the child's pid, and its wait
status when it ends. The child runs the program as `python` would and exits
(see `_exit`). The server ends when its stdin closes (the pytest worker that
started it has finished), killing children still running.
"""

import atexit
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading

PRELOADS = {
    # What a thattn binary imports before its first line of work (besides
    # the binary module itself, which must run as __main__ and defines its
    # absl flags then: it is never preloaded).
    "thattn": ("numpy", "absl.app", "absl.flags", "tensorflow", "tf_keras",
               "tensorflow_text", "thattn.bin.cli", "thattn.launch",
               "thattn.tasks", "thattn.io.write_failures", "thattn.layers",
               "thattn.models", "thattn.training.dtensor",
               "thattn.training.optimizer", "thattn.training.options",
               "thattn.training.progress", "thattn.training.strategies",
               "thattn.training.run_setup", "thattn.io.run_dir"),
    # Keras 3 on KERAS_BACKEND's framework (TensorFlow only where that is
    # the framework: tests/keras3's processes must not need it) and pytest.
    "keras3": ("numpy", "keras", "pytest"),
}
# The wire format: a request's pickle is preceded by its length; the
# server answers the child's pid (-1: refused), then its wait status.
STATUS = struct.Struct("!i")
LENGTH = struct.Struct("!I")


def receive(connection, size):
  """Exactly `size` bytes from a stream socket."""
  data = b""
  while len(data) < size:
    chunk = connection.recv(size - len(data))
    if not chunk:
      raise EOFError("the fork server closed the connection")
    data += chunk
  return data


def _threads():
  return len(os.listdir("/proc/self/task"))


def _kill(pids):
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def _reap(children):
  """Sends each ended child's wait status to whoever started it."""
  while children:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    connection = children.pop(pid, None)
    if connection is not None:
      try:
        connection.sendall(STATUS.pack(status))
      except OSError:
        pass  # the test stopped waiting
      connection.close()


def _in_child(selector, listener, children, connection, fds):
  """The forked child's side of the fork: the server's sockets closed,
  the request's file descriptors made its stdin, stdout and stderr."""
  selector.close()
  listener.close()
  for other in children.values():
    other.close()
  connection.close()
  for target, fd in enumerate(fds):
    os.dup2(fd, target)
  for fd in set(fds):
    if fd > 2:
      os.close(fd)


def serve(address, preload):
  """Forks a child per request; returns the request, in the child only."""
  for module in PRELOADS[preload]:
    __import__(module)
  # Forking copies only the calling thread: the server must have no thread
  # that could hold a lock then. The imports start only OpenBLAS's idle
  # thread servers, which handle fork themselves; any thread beyond those
  # refuses the fork (the test fails loudly, it does not hang).
  threads_after_imports = _threads()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(address)
  listener.listen(64)
  children = {}  # pid -> the connection of the test that started it
  selector = selectors.DefaultSelector()
  selector.register(listener, selectors.EVENT_READ, "request")
  selector.register(sys.stdin, selectors.EVENT_READ, "parent")
  sys.stdout.write("ready\n")
  sys.stdout.flush()
  while True:
    for key, _ in selector.select(timeout=0.05):
      if key.data == "parent":
        _kill(children)
        os.unlink(address)
        sys.exit(0)
      connection, _ = listener.accept()
      header, fds, _, _ = socket.recv_fds(connection, LENGTH.size, 3)
      request = pickle.loads(receive(connection, LENGTH.unpack(header)[0]))
      if _threads() > threads_after_imports:
        connection.sendall(STATUS.pack(-1))
        connection.close()
        continue
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        _in_child(selector, listener, children, connection, fds)
        return request
      for fd in fds:
        os.close(fd)
      connection.sendall(STATUS.pack(pid))
      children[pid] = connection
    _reap(children)


def run_program(request):
  """Runs the request's program as `python` would, in this process."""
  import faulthandler  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  kind, what, argv, use_faulthandler = request["program"]
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  # tempfile caches its folder on first use; the command's TMPDIR decides.
  tempfile.tempdir = None
  signal.signal(signal.SIGINT, signal.default_int_handler)
  if use_faulthandler:
    faulthandler.enable()
  # sys.stdin reads the new fd 0 (it was the server's pipe).
  sys.stdin = open(0, "r", closefd=False)  # pylint: disable=consider-using-with
  sys.argv = list(argv)
  # The command's PYTHONPATH, where a fresh interpreter puts it: after
  # sys.path[0] (the server started with its own).
  entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and p not in sys.path]
  sys.path[1:1] = entries
  if kind == "module":  # python -m: the working folder first on the path
    sys.path[0] = os.getcwd()
    runpy.run_module(what, run_name="__main__", alter_sys=True)
  elif kind == "path":  # python script.py: the script's folder
    sys.path[0] = os.path.dirname(os.path.realpath(what))
    runpy.run_path(what, run_name="__main__")
  elif kind == "code":  # python -c: an empty first entry
    sys.path[0] = ""
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    exec(compile(what, "<string>", "exec"), main.__dict__)  # pylint: disable=exec-used
  else:  # a console script: its entry point, as the generated wrapper does
    module, function = what
    sys.path[0] = os.path.dirname(argv[0]) or os.getcwd()
    sys.exit(getattr(__import__(module, fromlist=[function]), function)())


def exit_status(run):
  """Calls run() and returns the exit status Python would give it.

  As the interpreter does: SystemExit's code (None: 0; not an int: printed
  to stderr, 1); any other uncaught exception printed by sys.excepthook, 1.
  """
  try:
    run()
  except SystemExit as exit_request:
    code = exit_request.code
    if code is None:
      return 0
    if isinstance(code, int):
      return code
    print(code, file=sys.stderr)
    return 1
  except BaseException:  # pylint: disable=broad-except
    sys.excepthook(*sys.exc_info())
    return 1
  return 0


def exit_now(status):
  """Ends the child as the interpreter's exit would, without tearing down
  the modules: non-daemon threads joined, atexit functions run, stdio
  flushed, then the process ends with `status`.

  Module teardown is what the child skips: with TensorFlow loaded it takes
  ~1.5 s on 2 cores, every process, and writes nothing (files the binaries
  write are closed by them; the tests check what they wrote).
  """
  threading._shutdown()  # pylint: disable=protected-access
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(status)  # pylint: disable=protected-access


if __name__ == "__main__":
  _request = serve(*sys.argv[1:])
  exit_now(exit_status(lambda: run_program(_request)))
