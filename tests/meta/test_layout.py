"""The package's import graph has no cycle.

Every ``import`` and ``from ... import`` of a keyqueue module counts, at module
level or inside a function (a lazy import between two of our modules is still
an edge: it only moves the cycle to the first call). Imports under
``if TYPE_CHECKING:`` never run, so the run-time graph leaves them out; a
second graph counts them too, and has no cycle either (a cycle in the type
hints is one in the design). Imports of other packages never count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "keyqueue"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, typing: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The imports of ``tree``; those under ``if TYPE_CHECKING:`` too if ``typing``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if not typing and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def edges(name: str, path: Path, typing: bool = False) -> set[str]:
    """The keyqueue modules that importing (or calling into) ``name`` imports
    (``typing``: or that its type hints name, under ``if TYPE_CHECKING:``)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path)), typing):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in MODULES)
            continue
        if node.level:
            base = name.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target not in MODULES:
            continue
        for alias in node.names:  # `from pkg import submodule` imports the submodule
            sub = f"{target}.{alias.name}"
            out.add(sub if sub in MODULES else target)
    out.discard(name)
    return out


GRAPH = {name: edges(name, path) for name, path in MODULES.items()}
TYPED_GRAPH = {name: edges(name, path, typing=True) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == GREY:
                return [*stack[stack.index(nxt) :], nxt]
            if colour[nxt] == WHITE and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        colour[node] = BLACK
        return None

    for node in sorted(graph):
        if colour[node] == WHITE and (cycle := visit(node)):
            return cycle
    return None


def test_the_walk_sees_the_package() -> None:
    assert "keyqueue._core" in GRAPH
    assert "keyqueue.redis" in GRAPH
    assert "keyqueue" in GRAPH["keyqueue.redis"] or any(
        m.startswith("keyqueue.") for m in GRAPH["keyqueue.redis"]
    )


def test_the_walk_finds_a_cycle_when_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from . import cli", {"keyqueue.lab.cli"}),
        ("from .. import _core", {"keyqueue._core"}),
        ("def f():\n    from .._core import Core", {"keyqueue._core"}),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import cli", set()),
        ("from keyqueue import Event", {"keyqueue"}),
        ("import redis", set()),
    ],
)
def test_an_import_is_an_edge_wherever_it_is_written(
    source: str, expected: set[str], tmp_path: Path
) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert edges("keyqueue.lab.mod", path) == expected


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_type_checking_import_is_an_edge_of_the_typed_graph(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import cli")
    assert edges("keyqueue.lab.mod", path, typing=True) == {"keyqueue.lab.cli"}


def test_the_package_has_no_import_cycle_counting_type_checking_imports() -> None:
    cycle = find_cycle(TYPED_GRAPH)
    assert cycle is None, "import cycle in the type hints: " + " -> ".join(cycle or [])


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing (or calling into) ``start`` may import."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


OPERATORS_TOOLS = [
    "keyqueue.cli",
    "keyqueue._console",
    "keyqueue._web",
    "keyqueue.ops",
    "keyqueue.dashboard",
]
"""What ``keyqueue[ops]`` runs: the group, the console and web parts, the operator's tools."""


@pytest.mark.parametrize("package", OPERATORS_TOOLS)
def test_the_operators_tools_import_nothing_from_the_lab(package: str) -> None:
    """``keyqueue[ops]`` runs them: the lab's libraries may be missing.
    The ``keyqueue`` group reaches the lab only through its lazy ``lab`` command."""
    graph = {**GRAPH, "keyqueue.cli": GRAPH["keyqueue.cli"] - {"keyqueue.lab.cli"}}
    assert "keyqueue.lab.cli" in GRAPH["keyqueue.cli"]  # the one lazy edge
    modules = {m for m in MODULES if m == package or m.startswith(package + ".")}
    assert modules
    closure = set(modules)
    for module in modules:
        closure |= reachable(graph, module)
    assert not sorted(m for m in closure if m.startswith("keyqueue.lab")), package
