"""Lists thattn's long modules and functions: alarms, not limits.

A module over 500 lines or a function over 60 asks one question: is this
still one idea? Often the answer is yes (a layer's class keeps its
constructor, build and call together; a paper's table is long), and then
nothing is to be done. Never split a class, add a mixin or move a name to
get under a number; split by idea.

    python tools/sizes.py [--module_lines=500] [--function_lines=60]
"""

import argparse
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "thattn"


def long_code(module_lines, function_lines):
  """(path, line, what, lines) for each long module and function."""
  for path in sorted(PACKAGE.rglob("*.py")):
    source = path.read_text()
    name = path.relative_to(PACKAGE.parent)
    lines = len(source.splitlines())
    if lines > module_lines:
      yield name, 1, "module", lines
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        if length > function_lines:
          yield name, node.lineno, f"function {node.name}", length


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--module_lines", type=int, default=500)
  parser.add_argument("--function_lines", type=int, default=60)
  args = parser.parse_args()
  for name, line, what, lines in long_code(args.module_lines,
                                           args.function_lines):
    print(f"{name}:{line}: {what}, {lines} lines")


if __name__ == "__main__":
  main()
