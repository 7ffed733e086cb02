"""The documentation's promises: every public name has a docstring, and every
example in the README and docs/controller.md type-checks under ``mypy --strict``.

The reference itself (``make docs``: mkdocs in strict mode over docs/ and these
docstrings) is built by ``make test``, not here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "keyqueue"

# The public modules; tests/test_reference.py checks each of their names is on a
# reference page (docs/reference/).
PUBLIC_MODULES = (
    "keyqueue",
    "keyqueue.redis",
    "keyqueue.informer",
    "keyqueue.prometheus",
    "keyqueue.testing",
)

# Run in a pure interpreter (KEYQUEUE_PURE=1): the contract is on the source;
# that the compiled build carries the same docstrings is tests/test_build.py's.
# Prints the public names (and public methods of public classes) with no
# docstring, and the names in __all__ that are data (checked below, statically).
_UNDOCUMENTED = r"""
import importlib, inspect, json, sys

missing, data = [], []
for module_name in sys.argv[1:]:
    module = importlib.import_module(module_name)
    if not inspect.getdoc(module):
        missing.append(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        where = f"{module_name}.{name}"
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            data.append([module_name, name])
            continue
        if not inspect.getdoc(obj):
            missing.append(where)
        if not inspect.isclass(obj):
            continue
        for klass in obj.__mro__:
            if not klass.__module__.startswith("keyqueue"):
                continue
            for attr, member in vars(klass).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not (inspect.isroutine(member) or isinstance(member, property)):
                    continue
                if not inspect.getdoc(getattr(obj, attr)):
                    missing.append(f"{where}.{attr}")
print(json.dumps({"missing": sorted(set(missing)), "data": data}))
"""


def _inspect_public_names() -> dict[str, list[str]]:
    env = {**os.environ, "KEYQUEUE_PURE": "1"}
    env.pop("KEYQUEUE_REQUIRE_COMPILED", None)
    out = subprocess.run(
        [sys.executable, "-c", _UNDOCUMENTED, *PUBLIC_MODULES],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, list[str]] = json.loads(out)
    return result


def _module_file(module_name: str) -> Path:
    path = SRC.parent.joinpath(*module_name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _has_attribute_docstring(module_name: str, name: str) -> bool:
    """A string literal right after ``name = ...`` where the name is defined
    (following ``from .x import name``): what mkdocstrings shows for data."""
    path = _module_file(module_name)
    body = ast.parse(path.read_text()).body
    for stmt, following in zip(body, [*body[1:], None], strict=True):
        if (
            isinstance(stmt, ast.ImportFrom)
            and stmt.level == 1
            and stmt.module
            and any((alias.asname or alias.name) == name for alias in stmt.names)
        ):
            package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
            return _has_attribute_docstring(f"{package}.{stmt.module}", name)
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            )
    return False


def test_every_public_name_and_public_method_has_a_docstring() -> None:
    result = _inspect_public_names()
    assert result["missing"] == []
    undocumented_data = [
        f"{module}.{name}"
        for module, name in result["data"]
        if not _has_attribute_docstring(module, name)
    ]
    assert undocumented_data == []


# -- the examples ------------------------------------------------------------------

# A block whose first line starts so is deliberately partial (a synopsis of
# calls, not a program) and is not type-checked.
PARTIAL = "# A synopsis, not a program"
# The README and the guide are programs to copy; DESIGN.md and fairness.md
# quote fragments of code in their argument.
EXAMPLE_SOURCES = (ROOT / "README.md", ROOT / "docs" / "controller.md")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _examples() -> list[tuple[str, str]]:
    examples = []
    for source in EXAMPLE_SOURCES:
        for number, block in enumerate(_BLOCK.findall(source.read_text()), 1):
            if not block.startswith(PARTIAL):
                examples.append((f"{source.stem.lower()}_{number:02d}", block))
    return examples


def test_the_readme_has_examples_to_check() -> None:
    names = [name for name, _ in _examples()]
    assert sum(name.startswith("readme_") for name in names) >= 5
    assert any(name.startswith("controller_") for name in names)


@pytest.mark.timeout(300)
def test_every_example_type_checks_under_mypy_strict(tmp_path: Path) -> None:
    files = []
    for name, block in _examples():
        path = tmp_path / f"example_{name}.py"
        path.write_text(block)
        files.append(str(path))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(ROOT / ".mypy_cache" / "examples"),
            *files,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
