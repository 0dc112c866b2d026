"""What thattn's binaries share: a quiet start, their own help, plain output.

Every binary module starts with

    from thattn.bin import cli
    cli.quiet_tensorflow()          # before anything imports TensorFlow

and ends with `cli.run(main, __name__, __doc__)`.

- A quiet start. TensorFlow's C++ start-up lines (oneDNN notes, "Could not
  find cuda drivers", "failed call to cuInit ... (303)" on a machine without
  a GPU) are noise to a CPU user and read like errors. Unless the user set
  `TF_CPP_MIN_LOG_LEVEL`, the binaries raise it to 3 and silence the
  process's stderr while TensorFlow is imported (some of those lines are
  written before TensorFlow's log level applies). A failing import still
  raises, and its traceback is printed after stderr is back.
- Help that shows the binary's flags. absl's `--help` and `--helpshort`
  list the "key flags" of the main module, which for a console script is
  the generated `thattn-train` wrapper, with no flags and no docstring; `run`
  declares the binary's flags as key flags of that script and gives it the
  binary's docstring, so `--help` shows them with their defaults.
- Help is not an error: asked for, it exits with 0 (absl exits with 1).
- Plain output. Progress lines go to stdout, flushed at once (`print_now`),
  and the "thattn" logger's information lines (the one-time kernel compile)
  are printed the same way.
"""

import contextlib
import importlib.util
import logging as python_logging
import os
import sys

from thattn.core import requirements

_QUIET_LEVEL = "3"
# --backend=keras3's framework when KERAS_BACKEND is not set: the first of
# these installed (Keras 3 reads KERAS_BACKEND once, when TensorFlow's
# import first loads it).
KERAS3_FRAMEWORKS = ("jax", "tensorflow")


def choose_keras3_framework(argv, environ=None):
  """Sets KERAS_BACKEND for a `--backend=keras3` command line: JAX where
  it is installed, else TensorFlow; a KERAS_BACKEND the user set wins.

  Called before TensorFlow is imported: importing TensorFlow loads Keras
  3's backend module, which fixes the framework for the process.
  `environ`: the environment to read and set (default: os.environ; the
  tests' fork server asks what a command's process would choose).
  Returns the framework chosen, or None (another backend, or the user's).
  """
  environ = os.environ if environ is None else environ
  args = list(argv[1:])
  keras3 = "--backend=keras3" in args or any(
      first == "--backend" and second == "keras3"
      for first, second in zip(args, args[1:]))
  if not keras3 or "KERAS_BACKEND" in environ:
    return None
  framework = next(name for name in KERAS3_FRAMEWORKS
                   if name == "tensorflow" or importlib.util.find_spec(name))
  environ["KERAS_BACKEND"] = framework
  return framework


def quiet_tensorflow():
  """Imports TensorFlow with its C++ start-up lines silenced; see the module.

  Where the `[tensorflow]` extra is not installed (a Keras 3 install on JAX
  or PyTorch), exits naming the pip command.
  """
  program = os.path.basename(sys.argv[0]) if sys.argv[0] else "thattn"
  try:
    requirements.require(program)
  except ImportError as error:
    sys.exit(f"{program}: error: {error}")
  quiet = "TF_CPP_MIN_LOG_LEVEL" not in os.environ  # else the user's choice
  if quiet:
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = _QUIET_LEVEL
  with _stderr_silenced() if quiet else contextlib.nullcontext():
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import


@contextlib.contextmanager
def _stderr_silenced():
  """Points file descriptor 2 (C++ code writes there too) at /dev/null."""
  sys.stderr.flush()
  saved = os.dup(2)
  null = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(null, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(null)


def print_now(line):
  # Flushed at once, so progress shows when stdout is a pipe or a log file.
  print(line, flush=True)


class _PrintNow(python_logging.Handler):

  def emit(self, record):
    print_now(self.format(record))


def show_information_lines():
  """Prints the "thattn" logger's INFO lines, as plain lines on stdout."""
  logger = python_logging.getLogger("thattn")
  if not any(isinstance(h, _PrintNow) for h in logger.handlers):
    logger.addHandler(_PrintNow())
  logger.setLevel(python_logging.INFO)
  logger.propagate = False  # not again through absl's handler on the root


def run(main, module_name, doc):
  """absl's `app.run(main)`, with the binary's flags in `--help`."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  script = sys.argv[0]
  for flag in flags.FLAGS.get_key_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(script, flag)
  main_module = sys.modules.get("__main__")
  if main_module is not None and not main_module.__doc__:
    main_module.__doc__ = doc  # the console-script wrapper has none
  show_information_lines()
  try:
    app.run(main)
  except SystemExit as e:
    # absl exits with 1 after printing the help it was asked for; help is
    # not a failure (a README's `thattn-train --help` should succeed).
    if e.code == 1 and _HELP_FLAGS & set(sys.argv[1:]):
      raise SystemExit(0) from None
    raise


_HELP_FLAGS = {"--help", "--helpshort", "--helpfull", "--helpxml", "-?"}
# What pip installs for the Mesh TensorFlow backend (setup.py's extra).
MTF_EXTRA = requirements.install_command("mtf")


def import_mtf(module, program):
  """`thattn.mtf.<module>`, or exit naming the extra that is missing.

  mesh_tensorflow.transformer imports gin and tensorflow_datasets, which
  only the [mtf] extra installs.
  """
  import importlib  # pylint: disable=g-import-not-at-top
  try:
    return importlib.import_module(f"thattn.mtf.{module}")
  except ImportError as error:
    sys.exit(f"{program}: error: Mesh TensorFlow needs the [mtf] extra "
             f"({error}); {MTF_EXTRA}.")


def export_run(*, model_dir, export_dir, program, log, checkpoint=None,
               overwrite=False):
  """Exports a thattn-train run of either backend (`thattn.launch.export_run`:
  a --backend=mtf run is converted to Keras first, from its newest
  checkpoint)."""
  del program  # the library names the missing [mtf] extra itself
  from thattn import launch  # pylint: disable=g-import-not-at-top
  return launch.export_run(model_dir=model_dir, export_dir=export_dir,
                           checkpoint=checkpoint, overwrite=overwrite,
                           log=log)
