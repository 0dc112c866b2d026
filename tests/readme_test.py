"""The README's commands work as written, in order, in a fresh shell.

Read from README.md's `sh` blocks, of three kinds: the install block (only
`python3 -m venv` and `pip install` of setup.py's extras), the two set-up
commands (the main job: a venv, an install and `thattn-train`; the tests:
the one command with `pytest`), and the commands that use an install.

- the two set-up commands are the ones `.ci/run` runs (the install and the
  test command; the install of the first is part of the second);
- every pip install names an extra that setup.py defines, and `.ci/run`
  installs it (pip is not run here: no network in tests);
- every command names its programs by path (`.venv/bin/...`), so none needs
  an activated venv, and each program is a console script of setup.py;
- the main job's program and the other commands run in order, in a folder
  laid out like the repository (its `docs/` linked in), each to a zero
  exit: the default job, then the other tasks (whose --init_checkpoint is
  the default job's run), the export and the tools. For time, each
  training command gets `--train_steps=2 --eval_steps=1` (and the ablation
  a 1-run grid) appended, which override the README's values and change
  nothing else: flags, files, folders and the order are the README's. The
  default job keeps its export, which the README's serving snippet loads;
- then each `python` block runs in a fresh Python in that folder;
- the README is for users: no commit hashes, dates or processor names
  (those live in benchmarks/RESULTS.md and docs/development.md), and every
  relative link finds its file, and its heading where it names one.
"""

import ast
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


def _is_install(block):
  steps = [step for command in _commands(block) for step in _steps(command)]
  return all(_is_venv(step) or _is_pip_install(step) for step in steps)


def _is_venv(step):
  return step[:3] == ["python3", "-m", "venv"]


def _is_pip_install(step):
  return step[0].endswith("/pip") and step[1] == "install"


def _set_up_blocks():
  """(the main job's block, the tests' block, the other commands' blocks
  in order); the install block is neither."""
  blocks = [block for block in _sh_blocks() if not _is_install(block)]
  (tests,) = [block for block in blocks if "pytest" in block]
  main_job = next(block for block in blocks
                  if _steps(_commands(block)[0])[-1] == [
                      VENV_BIN + "thattn-train"])
  return main_job, tests, [block for block in blocks
                           if block not in (main_job, tests)]


def _extras():
  """setup.py's extras, by name (the keys of EXTRAS_REQUIRE)."""
  tree = ast.parse((ROOT / "setup.py").read_text())
  for node in tree.body:
    if (isinstance(node, ast.Assign) and
        node.targets[0].id == "EXTRAS_REQUIRE"):
      return {key.value for key in node.value.keys}
  raise AssertionError("setup.py has no EXTRAS_REQUIRE")


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
  install, tests = [_commands(block)[0] for block in _set_up_blocks()[:2]]
  assert _steps(install)[-1] == [".venv/bin/thattn-train"]
  ci = [[word for word in shlex.split(line, comments=True)
         if word != "--quiet"]
        for line in (ROOT / ".ci" / "run").read_text().splitlines()]
  for step in _steps(tests):
    assert step in ci, f"{' '.join(step)!r} is not a line of .ci/run"


def test_every_pip_install_names_an_extra_that_ci_installs():
  ci = (ROOT / ".ci" / "run").read_text()
  (ci_extras,) = re.findall(r"pip install --quiet -e '\.\[([\w,]+)\]'", ci)
  steps = [step for block in _sh_blocks() for command in _commands(block)
           for step in _steps(command) if _is_pip_install(step)]
  named = set()
  for step in steps:
    if step[0] == TRITON_PIP or "-r" in step:
      continue
    match = re.fullmatch(r"-e \.\[([\w,]+)\]", " ".join(step[2:]))
    assert match, f"{' '.join(step)!r}: expected pip install -e '.[extra]'"
    named |= set(match.group(1).split(","))
  assert {"jax", "torch", "tensorflow", "mtf"} <= named, named
  assert named <= _extras(), named - _extras()
  assert named <= set(ci_extras.split(",")), named - set(ci_extras.split(","))


def test_every_command_names_its_programs_by_path():
  scripts = _console_scripts() | {"pip", "python"}
  for block in _sh_blocks():
    for command in _commands(block):
      for step in _steps(command):
        program = step[0]
        if _is_venv(step):
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
  main_block, _, other_blocks = _set_up_blocks()
  main_job = _steps(_commands(main_block)[0])[-1]
  others = [command for block in other_blocks
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
  assert len(snippets) >= 3, snippets
  _run_in_order([[VENV_BIN + "python", "-c", code] for code in snippets],
                tmp_path)



# A commit hash (7 to 40 hex digits with a digit and a letter), a date, a
# processor or accelerator by name: lab-notebook facts that belong in
# benchmarks/RESULTS.md and docs/development.md, not in the README's prose.
_NOTEBOOK = re.compile(
    r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"
    r"|\b20\d\d-\d\d-\d\d\b"
    r"|\b(?:Xeon|EPYC|Intel|AMD|Ryzen|H100|H200|A100|TPU ?v\d)\b")


def test_the_readme_holds_no_hashes_dates_or_processor_names():
  text = (ROOT / "README.md").read_text()
  assert not _NOTEBOOK.findall(text), _NOTEBOOK.findall(text)


def _slug(heading):
  """A Markdown heading's anchor, as GitHub makes it."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", "docs/README.md"])
def test_every_relative_link_finds_its_file_and_heading(page):
  text = (ROOT / page).read_text()
  links = re.findall(r"\]\(([^)\s]+)\)", text)
  local = [link for link in links if "://" not in link]
  assert len(local) >= 10, local
  for link in local:
    path, _, anchor = link.partition("#")
    target = (ROOT / page).parent / path
    assert target.exists(), link
    if anchor:
      headings = re.findall(r"^#+ (.*)$", target.read_text(), flags=re.M)
      assert anchor in {_slug(heading) for heading in headings}, link


def test_the_docs_index_lists_every_page():
  index = ROOT / "docs" / "README.md"
  linked = {(index.parent / link.partition("#")[0]).resolve()
            for link in re.findall(r"\]\(([^)\s#]+)", index.read_text())}
  pages = (set(ROOT.glob("docs/*.md")) | set(ROOT.glob("docs/*/README.md"))
           | {ROOT / "docs" / "api" / "index.rst"}) - {index}
  missing = sorted(str(page.relative_to(ROOT)) for page in pages
                   if page.resolve() not in linked)
  assert not missing, f"not in docs/README.md: {missing}"


# The README's "Versions tested" rows -> the distributions they name.
_TESTED = {"Python": [], "TensorFlow, tf-keras, tensorflow-text": [
    "tensorflow", "tf-keras", "tensorflow-text"], "Keras": ["keras"],
           "JAX": ["jax"], "PyTorch": ["torch"],
           "mesh-tensorflow": ["mesh-tensorflow"],
           "orbax-checkpoint": ["orbax-checkpoint"]}


def test_the_versions_tested_are_the_ones_installed_here():
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  text = (ROOT / "README.md").read_text()
  section = text.split("## Versions tested", 1)[1].split("\n## ", 1)[0]
  rows = dict(re.findall(r"^\| ([^|]+?) \| (\d+\.\d+)", section, flags=re.M))
  assert set(_TESTED) <= set(rows), rows
  assert rows["Python"] == "%d.%d" % sys.version_info[:2]
  for row, distributions in _TESTED.items():
    for distribution in distributions:
      version = metadata.version(distribution)
      assert version.startswith(rows[row] + "."), (row, version)
