"""pytest_test: a py_test that runs its test file under pytest.

The test files here are pytest modules (plain test functions, fixtures,
parametrize), not unittest programs, so the py_test's main is a shared entry
point that hands the file to pytest.main.
"""

_MAIN = "//tools/bazel:pytest_main.py"

def pytest_test(name, srcs, deps = [], args = [], **kwargs):
    """Declares a py_test that runs the `*_test.py` files of `srcs` under pytest.

    Args:
      name: the target name, by convention the test file's name without `.py`.
      srcs: the test file, plus any helper modules only it uses.
      deps: py_library targets the test imports. pytest itself, and other
        third-party packages, come from the Python on PATH.
      args: extra pytest arguments, after the test files.
      **kwargs: passed to py_test (size, data, tags, ...).
    """
    test_files = [src for src in srcs if src.endswith("_test.py")]
    if not test_files:
        fail("pytest_test %s: no *_test.py file in srcs %s" % (name, srcs))
    native.py_test(
        name = name,
        srcs = srcs + [_MAIN],
        main = _MAIN,
        args = ["$(location %s)" % src for src in test_files] + args,
        deps = deps,
        # Bazel would otherwise put an __init__.py in every runfiles directory
        # that holds Python files. The runfiles then hold exactly the
        # __init__.py files listed in srcs: thattn's packages, but not
        # tests/layers, so pytest imports a test as a top-level module and its
        # sibling helpers (numpy_reference) by their plain names.
        legacy_create_init = False,
        **kwargs
    )
