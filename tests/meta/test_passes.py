"""``make test``'s pure pass runs every test that runs code of the compiled modules.

It runs the tests of tests/conftest.py's ``COMPILED_MODULE_TESTS`` (marked
``compiled_modules``) and those marked ``once`` (which run no compiled module
either). Each entry of the list names a folder, a file or a test that is there
(always checked). Whether the list is complete is measured (``make
test-passes``, with ``KEYQUEUE_MEASURE_PASSES=1``; it takes as long as the suite
or longer, so ``make test`` skips it): each test file runs alone on the pure
build under coverage.py, with the processes it starts (``patch =
subprocess``), and the lines it ran of each compiled module's functions, less
what importing keyqueue runs, say whether the pure pass needs it:

- a file that ran a line of the in-memory queue's modules (``_heap``,
  ``_waiting``, ``_core``, ``_front``, ``_threading``, ``_asyncio``) has an
  entry (the file, its folder, or the tests of it that do: a thread or a
  process a test starts is not told apart from the file's other tests, so
  which tests is the entry's word);
- a file left out ran no line of ``_checks`` that the listed files do not
  (each Redis call checks its arguments there; tests/core/test_checks.py pins
  each check on both builds);
- and each entry's file or folder ran a line of the queue's modules.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import keyqueue
from keyqueue._build import COMPILED_MODULES
from tests.conftest import COMPILED_MODULE_TESTS

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(keyqueue.__file__).resolve().parent
QUEUE_MODULES = frozenset(COMPILED_MODULES) - {"_checks"}
MEASURED = os.environ.get("KEYQUEUE_MEASURE_PASSES") == "1"
FILE_TIMEOUT = 1800
"""Seconds for one test file under coverage (and its tests' own timeout)."""
MEASURING = pytest.mark.timeout(4 * 3600)  # the whole suite, a file at a time, under coverage


def test_each_entry_names_a_folder_a_file_or_a_test_that_is_there() -> None:
    for entry in COMPILED_MODULE_TESTS:
        path, _, test = entry.partition("::")
        if path.endswith("/"):
            assert (ROOT / path).is_dir(), entry
            continue
        assert (ROOT / path).is_file(), entry
        if test:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            names = [
                node.name
                for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            assert any(name.startswith(test) for name in names), entry


def _listed(file: str) -> bool:
    return any(file.startswith(entry.partition("::")[0]) for entry in COMPILED_MODULE_TESTS)


def _function_lines(path: Path) -> set[int]:
    """The lines of the statements inside ``path``'s functions."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in node.body:
                lines.update(n.lineno for n in ast.walk(statement) if hasattr(n, "lineno"))
    return lines


_IMPORT_ALL = """
import importlib, pkgutil, keyqueue
for module in pkgutil.walk_packages(keyqueue.__path__, "keyqueue."):
    try:
        importlib.import_module(module.name)
    except ImportError:
        pass
"""


def _queue_modules(modules: dict[str, set[int]]) -> list[str]:
    return sorted(name for name, lines in modules.items() if lines and name in QUEUE_MODULES)


Ran = dict[str, dict[str, set[int]]]
"""Per test file (relative to the root), per compiled module: the lines of its
functions the file ran that importing keyqueue does not."""


def _run_measured(rc: Path, data: Path, args: list[str]) -> None:
    """``coverage run`` ``args`` on the pure build (the whole suite: no pass's
    selection), its data in ``data``; a run that could not test is an error."""
    drop = {"KEYQUEUE_MEASURE_PASSES", "KEYQUEUE_REQUIRE_COMPILED", "PYTEST_ADDOPTS"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"KEYQUEUE_PURE": "1", "COVERAGE_FILE": str(data / ".coverage")}
    done = subprocess.run(
        [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=FILE_TIMEOUT,
        check=False,
    )
    # pytest's 1 is a failed test (the code it ran still counts), 5 no test collected
    assert done.returncode in {0, 1, 5}, (args, done.stdout[-3000:], done.stderr[-3000:])


def _lines_ran(coverage: Any, data: Path) -> dict[str, set[int]]:
    """Per compiled module, the lines the measured processes ran (``coverage``: the
    module). A process killed while it wrote its data file (the tests kill
    workers) counts for nothing, as one killed before it wrote any."""
    ran: dict[str, set[int]] = {}
    for part in data.glob(".coverage*"):
        measured = coverage.CoverageData(basename=str(part))
        try:
            measured.read()
        except coverage.exceptions.DataError:
            continue
        for source in measured.measured_files():
            ran.setdefault(Path(source).stem, set()).update(measured.lines(source) or ())
    return ran


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    if not MEASURED:
        pytest.skip("measured by make test-passes (KEYQUEUE_MEASURE_PASSES=1)")
    coverage = pytest.importorskip("coverage", "7.10", reason="make test-passes installs it")
    here = tmp_path_factory.mktemp("passes")
    rc = here / "coveragerc"
    sources = "".join(f"\n    {PACKAGE / name}.py" for name in COMPILED_MODULES)
    rc.write_text(f"[run]\nparallel = true\npatch = subprocess\ninclude ={sources}\n")
    functions = {name: _function_lines(PACKAGE / f"{name}.py") for name in COMPILED_MODULES}

    (here / "import.py").write_text(_IMPORT_ALL)
    _run_measured(rc, here / "import", [str(here / "import.py")])
    at_import = _lines_ran(coverage, here / "import")

    ran: Ran = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        file = path.relative_to(ROOT).as_posix()
        if path == Path(__file__).resolve():
            continue
        data = here / file.replace("/", "_")
        pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
        _run_measured(rc, data, [*pytest_args, "-o", f"timeout={FILE_TIMEOUT}", file])
        ran[file] = {
            name: (lines & functions[name]) - at_import.get(name, set())
            for name, lines in _lines_ran(coverage, data).items()
        }
    return ran


@MEASURING
def test_every_file_that_runs_the_queue_modules_is_in_the_pure_pass(ran: Ran) -> None:
    left_out = {
        file: _queue_modules(modules)
        for file, modules in ran.items()
        if _queue_modules(modules) and not _listed(file)
    }
    assert left_out == {}


@MEASURING
def test_the_files_left_out_run_no_line_of_checks_the_pure_pass_does_not(ran: Ran) -> None:
    pure = set().union(*(m.get("_checks", set()) for f, m in ran.items() if _listed(f)))
    beyond = {
        file: sorted(modules.get("_checks", set()) - pure)
        for file, modules in ran.items()
        if not _listed(file)
    }
    assert {file: lines for file, lines in beyond.items() if lines} == {}


@MEASURING
def test_each_entry_runs_the_queue_modules(ran: Ran) -> None:
    """An entry's file or folder ran them (a test of a file: which ones is its word)."""
    runs = {file for file, modules in ran.items() if _queue_modules(modules)}
    idle = [
        entry
        for entry in COMPILED_MODULE_TESTS
        if not any(file.startswith(entry.partition("::")[0]) for file in runs)
    ]
    assert idle == []
