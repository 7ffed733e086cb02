"""The two builds (``keyqueue._build``): which one runs, and what it takes to run.

``make test`` runs the suite twice: against the compiled build (with
``KEYQUEUE_REQUIRE_COMPILED=1``, so a missing or stale build fails here instead
of quietly testing the pure one) and with ``KEYQUEUE_PURE=1``. The selection
rules themselves are pinned on a package directory made in ``tmp_path``, so
they are tested whatever build this run has.
"""

from __future__ import annotations

import gc
import importlib.machinery
import inspect
import json
import os
import pydoc
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

import keyqueue
from keyqueue import _build, testing
from keyqueue._build import COMPILED_MANIFEST, COMPILED_MODULES, source_digest
from keyqueue._threading import ThreadingFront

PACKAGE = Path(keyqueue.__file__).parent
EXTENSION = importlib.machinery.EXTENSION_SUFFIXES[0]


def hot_module_files() -> dict[str, str]:
    return {name: sys.modules[f"keyqueue.{name}"].__file__ or "" for name in COMPILED_MODULES}


def run_python(code: str, *, pure: bool | None = None, path: Path | None = None) -> str:
    """Run ``code`` in a fresh interpreter; ``pure=None`` keeps this run's KEYQUEUE_PURE."""
    env = dict(os.environ)
    if pure is not None:
        env["KEYQUEUE_PURE"] = "1" if pure else ""
    if path is not None:
        env["PYTHONPATH"] = str(path)
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def fake_build(tmp_path: Path) -> Path:
    """A directory with the hot sources, an (empty) extension for each, and their manifest."""
    here = tmp_path / "pkg"
    here.mkdir()
    lines = []
    for name in COMPILED_MODULES:
        source = here / f"{name}.py"
        source.write_text(f"# {name}\n")
        (here / f"{name}{EXTENSION}").write_bytes(b"")
        lines.append(f"{source_digest(source)}  {name}.py\n")
    (here / COMPILED_MANIFEST).write_text("".join(lines))
    return here


# -- which build runs --------------------------------------------------------------


def test_the_compiled_build_runs_when_make_test_requires_it() -> None:
    if os.environ.get("KEYQUEUE_REQUIRE_COMPILED") != "1":
        pytest.skip("KEYQUEUE_REQUIRE_COMPILED=1 is set by make test's compiled run")
    assert keyqueue.COMPILED, (
        "the compiled build is missing or stale: `make` compiles it (it needs a C compiler); "
        "KEYQUEUE_PURE=1 runs the suite on the pure build only"
    )
    assert all(path.endswith(EXTENSION) for path in hot_module_files().values())


def test_compiled_says_which_build_the_hot_modules_came_from() -> None:
    suffix = EXTENSION if keyqueue.COMPILED else ".py"
    assert all(path.endswith(suffix) for path in hot_module_files().values())


def test_keyqueue_pure_loads_every_hot_module_from_its_source() -> None:
    out = run_python(
        "import keyqueue, sys\n"
        "print(keyqueue.COMPILED, *(sys.modules['keyqueue.' + m].__file__\n"
        "      for m in keyqueue._build.COMPILED_MODULES))",
        pure=True,
    )
    compiled, *files = out.split()
    assert compiled == "False"
    assert [Path(f).name for f in files] == [f"{name}.py" for name in COMPILED_MODULES]


@pytest.mark.parametrize("value", ["0", ""])
def test_keyqueue_pure_0_or_empty_does_not_ask_for_the_pure_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("KEYQUEUE_PURE", value)
    finders = len(sys.meta_path)
    assert _build._choose("pkg", fake_build(tmp_path)) is True
    assert len(sys.meta_path) == finders  # no finder installed


# -- a stale or partial build is never run -------------------------------------------


def test_a_build_whose_sources_are_unchanged_is_current(tmp_path: Path) -> None:
    assert _build._compiled_build_is_current(fake_build(tmp_path))


def test_a_source_edited_since_the_build_makes_it_stale(tmp_path: Path) -> None:
    here = fake_build(tmp_path)
    with (here / "_front.py").open("a") as source:
        source.write("# edited\n")
    assert not _build._compiled_build_is_current(here)


@pytest.mark.parametrize("missing", [COMPILED_MANIFEST, f"_threading{EXTENSION}", "_core.py"])
def test_a_missing_manifest_extension_or_source_means_pure(tmp_path: Path, missing: str) -> None:
    here = fake_build(tmp_path)
    (here / missing).unlink()
    assert not _build._compiled_build_is_current(here)


def test_a_manifest_from_another_set_of_modules_means_pure(tmp_path: Path) -> None:
    here = fake_build(tmp_path)
    manifest = here / COMPILED_MANIFEST
    manifest.write_text("".join(manifest.read_text().splitlines(True)[1:]))  # _core missing
    assert not _build._compiled_build_is_current(here)


def test_an_edited_source_beside_a_real_build_runs_as_python(tmp_path: Path) -> None:
    if not keyqueue.COMPILED:
        pytest.skip("no compiled build here to go stale")
    copy = tmp_path / "keyqueue"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "_threading.py").open("a") as source:
        source.write("\nEDITED = True\n")
    out = run_python(
        "import keyqueue, keyqueue._threading as t\n"
        "print(keyqueue.COMPILED, t.EDITED, keyqueue._core.__file__.endswith('.py'))",
        pure=False,
        path=tmp_path,
    )
    assert out == "False True True"


def test_import_keyqueue_needs_no_mypy_extensions() -> None:
    out = run_python(
        "import sys\n"
        "sys.modules['mypy_extensions'] = None  # as if it were not installed\n"
        "import keyqueue\n"
        "q = keyqueue.WorkQueue()\n"
        "q.add('k')\n"
        "print(keyqueue.COMPILED, q.get())"
    )
    assert out == f"{keyqueue.COMPILED} k"


# -- what the compiled fronts must still allow --------------------------------------------


def test_a_subclass_override_is_used_by_the_queues_own_calls() -> None:
    calls: list[Any] = []

    class Recording(keyqueue.WorkQueue[str]):
        def _backoff(self, key: Any) -> float:
            calls.append(key)
            return super()._backoff(key)

    q = Recording(clock=testing.FakeClock())
    q.add("k")
    key = q.get()
    assert q.retry(key)  # retry asks the queue itself for the limiter's delay
    assert calls == ["k"]
    assert q.stats().rate_limited == 1


def test_a_dropped_queue_is_collected_and_weak_callbacks_fire() -> None:
    fired: list[str] = []
    clock = testing.FakeClock()  # holds the queue's _on_clock_step weakly
    queues: list[Any] = [keyqueue.WorkQueue(clock=clock), keyqueue.AsyncWorkQueue(clock=clock)]
    refs = [weakref.ref(q, lambda _: fired.append("gone")) for q in queues]
    del queues
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    assert fired == ["gone", "gone"]
    clock.step(1)  # the clock's dead references are skipped, not called


# -- help() reads the same in both builds ------------------------------------------------

HELP_DUMP = """
import inspect, json, sys
import keyqueue
out = {}
for cls in (keyqueue.WorkQueue, keyqueue.AsyncWorkQueue):
    names = [n for n in dir(cls) if not n.startswith("_")] + ["__init__", "__len__", "__repr__"]
    seen = {"": [inspect.getdoc(cls), str(inspect.signature(cls))]}
    for name in names:
        value = getattr(cls, name)
        if not (inspect.isroutine(value) or isinstance(value, property)):
            continue  # an instance attribute's slot (name), which only mypyc's class shows
        try:
            signature = str(inspect.signature(value))
        except (TypeError, ValueError):  # a property
            signature = None
        seen[name] = [inspect.getdoc(value), signature, inspect.iscoroutinefunction(value)]
    out[cls.__name__] = seen
print(keyqueue.COMPILED, json.dumps(out))
"""


def help_as_seen(*, pure: bool) -> tuple[bool, dict[str, Any]]:
    """Each public queue's docstring and signature, and those of its members, by name."""
    compiled, _, dump = run_python(HELP_DUMP, pure=pure).partition(" ")
    return compiled == "True", json.loads(dump)


def test_both_builds_show_the_same_docstrings_and_typed_signatures() -> None:
    compiled, seen = help_as_seen(pure=False)
    if os.environ.get("KEYQUEUE_REQUIRE_COMPILED") == "1":
        assert compiled
    elif not compiled:
        pytest.skip("no compiled build here to compare with the pure one")
    assert seen == help_as_seen(pure=True)[1]


@pytest.mark.parametrize("cls", [keyqueue.WorkQueue, keyqueue.AsyncWorkQueue])
def test_every_public_method_has_its_docstring_and_key_typed_signature(cls: type) -> None:
    public = {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}
    members = [n for n, v in public.items() if inspect.isroutine(v) or isinstance(v, property)]
    assert {"add", "get", "done", "shutdown", "clock", "stats"} <= set(members)
    for name in members:
        assert inspect.getdoc(public[name]), f"{cls.__name__}.{name} has no docstring"
    assert str(inspect.signature(cls.add)) == "(self, key: 'K', priority: 'int' = 0) -> 'None'"
    assert str(inspect.signature(cls.get)) == "(self, timeout: 'float | None' = None) -> 'K'"
    assert inspect.getdoc(cls.add).startswith("Mark ``key`` for processing.")  # type: ignore[union-attr]
    assert "rate_limiter: 'RateLimiter | None' = None" in str(inspect.signature(cls))
    assert inspect.iscoroutinefunction(cls.get) is (cls is keyqueue.AsyncWorkQueue)


def test_help_shows_the_docstrings_and_signatures() -> None:
    text = pydoc.render_doc(keyqueue.WorkQueue, renderer=pydoc.plaintext)
    assert "add(self, key: 'K', priority: 'int' = 0) -> 'None'" in text
    assert "Mark ``key`` for processing." in text
    assert "The clock every delay and wait of this queue is measured on." in text


def test_an_instance_calls_the_front_itself_and_the_class_view_still_calls_it() -> None:
    q: keyqueue.WorkQueue[str] = keyqueue.WorkQueue()
    assert "add" not in vars(keyqueue.WorkQueue)  # q.add is the front's: no layer per call
    assert inspect.getattr_static(q, "add") is vars(ThreadingFront)["add"]
    keyqueue.WorkQueue.add(q, "k", priority=1)  # the view on the class forwards
    assert keyqueue.WorkQueue.get(q) == "k"
    assert q.clock is keyqueue.WorkQueue.clock.__get__(q)


def test_a_subclass_override_is_what_its_class_shows() -> None:
    class Mine(keyqueue.WorkQueue[str]):
        def add(self, key: str, priority: int = 0) -> None:
            """Mine."""
            super().add(key, priority)

    assert inspect.getdoc(Mine.add) == "Mine."
    assert inspect.getdoc(Mine.done) == inspect.getdoc(keyqueue.WorkQueue.done)
    q = Mine()
    q.add("k")
    assert q.get() == "k"


def test_a_subclass_with_its_own_constructor_shows_that_constructor() -> None:
    # The public queues' typed constructor comes from the metaclass's __signature__
    # (Python 3.13 reads __init__ past its __getattribute__); a subclass's own
    # __init__ is not hidden behind it, and one without keeps the typed one.
    class Own(keyqueue.WorkQueue[str]):
        def __init__(self, endpoint: str) -> None:
            super().__init__(endpoint)

    class Plain(keyqueue.AsyncWorkQueue[str]):
        pass

    assert str(inspect.signature(Own)) == "(endpoint: 'str') -> 'None'"
    assert "rate_limiter: 'RateLimiter | None' = None" in str(inspect.signature(Plain))
    assert "self" not in str(inspect.signature(keyqueue.WorkQueue))
