"""The README's commands work as written, in order, in a fresh shell.

Read from README.md's `sh` blocks:

- the two set-up commands are the ones `.ci/run` runs (the install and the
  test command; the install of the first is part of the second);
- every command names its programs by path (`.venv/bin/...`), so none needs
  an activated venv, and each program is a console script of setup.py;
- the commands after the first run in order, in a folder laid out like the
  repository (its `docs/` linked in), each to a zero exit: the default job,
  then the other tasks (whose --init_checkpoint is the default job's run),
  the export and the tools. For time, each training command gets
  `--train_steps=2 --eval_steps=1` (and the ablation a 1-run grid) appended,
  which override the README's values and change nothing else: flags,
  files, folders and the order are the README's. The default job keeps
  its export, which the README's serving snippet loads;
- then each `python` block runs in a fresh Python in that folder.
"""

import os
import pathlib
import re
import shlex
import sys

import pytest

from tests import forkserver

ROOT = pathlib.Path(__file__).resolve().parents[1]
VENV_BIN = ".venv/bin/"
# benchmarks/requirements-triton.txt: Triton in a venv of its own.
TRITON_PIP = ".venv-triton/bin/pip"
BIN_DIR = os.path.dirname(sys.executable)
# Appended to each command of the program (absl: the last value wins).
_QUICK = {
    "thattn-train": ["--train_steps=2", "--eval_steps=1", "--eval_every=0",
                     "--log_every=1", "--noexport"],
    "thattn-ablate": ["--variants=talking_heads", "--heads=2", "--seeds=0",
                      "--train_steps=2", "--eval_steps=1"],
}


def _sh_blocks():
  return _blocks("sh")


def _blocks(language):
  text = (ROOT / "README.md").read_text()
  return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _commands(block):
  """The block's commands: continuation lines joined, comments dropped."""
  joined = block.replace("\\\n", " ")
  return [shlex.split(line, comments=True) for line in joined.splitlines()
          if shlex.split(line, comments=True)]


def _console_scripts():
  setup = (ROOT / "setup.py").read_text()
  return set(re.findall(r'"([\w-]+)=thattn\.', setup))


def _steps(command):
  """A command's `&&`-separated steps, each a list of words."""
  steps, current = [], []
  for word in command:
    if word == "&&":
      steps.append(current)
      current = []
    else:
      current.append(word)
  return steps + [current]


def test_the_set_up_commands_are_what_ci_runs():
  install, tests = [_commands(block)[0] for block in _sh_blocks()[:2]]
  assert _steps(install)[-1] == [".venv/bin/thattn-train"]
  ci = [[word for word in shlex.split(line, comments=True)
         if word != "--quiet"]
        for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  for step in _steps(tests):
    assert step in ci, f"{' '.join(step)!r} is not a line of .ci/run"


def test_every_command_names_its_programs_by_path():
  scripts = _console_scripts() | {"pip", "python"}
  for block in _sh_blocks():
    for command in _commands(block):
      for step in _steps(command):
        program = step[0]
        if step[:3] == ["python3", "-m", "venv"]:
          continue
        if program == TRITON_PIP:  # Triton's venv of its own (.ci/run)
          continue
        assert program.startswith(VENV_BIN), (
            f"{' '.join(step)!r} needs an activated venv; write "
            f"{VENV_BIN}{program}")
        assert program[len(VENV_BIN):] in scripts, program


def _run_in_order(commands, folder, keep_export=()):
  env = dict(os.environ)
  env.pop("TF_CPP_MIN_LOG_LEVEL", None)
  for index, command in enumerate(commands):
    program = command[0][len(VENV_BIN):]
    argv = ([os.path.join(BIN_DIR, program)] + command[1:] +
            [flag for flag in _QUICK.get(program, [])
             if not (index in keep_export and flag == "--noexport")])
    if command[1:] == ["--help"]:
      argv = argv[:2]
    elif program == "python":
      argv = [sys.executable] + command[1:]
    result = forkserver.run(argv, cwd=folder, env=env, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, (
        f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n"
        f"{result.stderr[-3000:]}")


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN_DIR, "thattn-train")),
                    reason="thattn's console scripts are not installed "
                    f"beside {sys.executable}")
def test_the_commands_run_in_order_in_a_fresh_folder(tmp_path):
  main_job = _steps(_commands(_sh_blocks()[0])[0])[-1]
  others = [command for block in _sh_blocks()[2:]
            for command in _commands(block)]
  assert len(others) >= 8, others
  (tmp_path / "docs").symlink_to(ROOT / "docs")
  _run_in_order([main_job] + others, tmp_path, keep_export=(0,))
  runs = sorted(os.listdir(tmp_path / "thattn_runs"))
  assert "mlm_bert_tiny_talking_heads" in runs
  assert any(run.startswith("classification_from-mlm_bert_tiny_talking_heads")
             for run in runs), runs
  assert (tmp_path / "thattn_runs" / "served" / "saved_model.pb").exists()
  assert (tmp_path / "thattn_runs" / "ablation" / "table.md").exists()
  snippets = _blocks("python")
  assert len(snippets) >= 2, snippets
  _run_in_order([[VENV_BIN + "python", "-c", code] for code in snippets],
                tmp_path)

