"""Which build runs: the hot modules compiled by mypyc, or their pure sources.

Theory of operation
-------------------
``setup.py`` compiles ``COMPILED_MODULES`` with mypyc into C extensions that sit
next to their sources (in the wheel, or in ``src/keyqueue`` for an editable
install), plus ``_native__mypyc``, the library they share, and writes
``COMPILED_MANIFEST``: the SHA-256 of each source it compiled. Python prefers an
extension over a source of the same name, so an extension whose source was
edited since would silently run the old code; and the compiled modules call
one another through that shared library, so mixing compiled and pure modules
is not an option either. Hence one decision for all of them, taken here,
before any of them is imported (``keyqueue/__init__.py`` imports this first):

- compiled, when every extension is there and every source still hashes as
  it did when it was compiled;
- pure otherwise, or whenever ``KEYQUEUE_PURE`` is set to anything but ``""``
  or ``0``: a finder placed first on ``sys.meta_path`` then loads each of
  ``COMPILED_MODULES`` from its ``.py`` file, whatever lies beside it.

``COMPILED`` says which one runs. A stale build is not an error (the pure
sources are the same library): ``make`` compiles again when a source changes.
Hashing the sources costs well under a millisecond at import.

``mypyc_attr`` is mypy_extensions' class decorator when that package is there
(mypyc reads it at compile time), and otherwise a no-op, so neither build needs
anything beyond the standard library at run time.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TypeVar

__all__ = ["COMPILED", "COMPILED_MANIFEST", "COMPILED_MODULES", "mypyc_attr"]

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # run time without mypy_extensions: the decorator does nothing

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        return lambda cls: cls


COMPILED_MODULES = ("_checks", "_heap", "_waiting", "_core", "_front", "_threading", "_asyncio")
"""The modules mypyc compiles (setup.py reads this tuple), in import order."""

COMPILED_MANIFEST = "_compiled.sha256"
"""Written by the build next to the extensions: ``<sha256>  <source>`` per line."""

_HERE = Path(__file__).resolve().parent
_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def source_digest(path: Path) -> str:
    """What the manifest records for a source (setup.py writes it with this)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compiled_build_is_current(here: Path) -> bool:
    """Every extension is there and was compiled from the sources as they are now."""
    try:
        manifest = (here / COMPILED_MANIFEST).read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return False
    recorded = dict(zip(manifest[1::2], manifest[0::2], strict=False))
    for name in COMPILED_MODULES:
        if not any((here / (name + suffix)).is_file() for suffix in _EXTENSION_SUFFIXES):
            return False
        source = here / f"{name}.py"
        try:
            if recorded.get(source.name) != source_digest(source):
                return False
        except OSError:
            return False
    return True


class _PureSources(importlib.abc.MetaPathFinder):
    """Finds ``keyqueue.<name>`` for the compiled modules in their ``.py`` files."""

    def __init__(self, package: str, here: Path) -> None:
        self._sources = {f"{package}.{name}": here / f"{name}.py" for name in COMPILED_MODULES}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        source = self._sources.get(fullname)
        if source is None:
            return None
        return importlib.util.spec_from_file_location(fullname, source)


def _choose(package: str, here: Path) -> bool:
    """Decide once for this process; without the compiled build, install the finder."""
    pure = os.environ.get("KEYQUEUE_PURE", "") not in ("", "0")
    if not pure and _compiled_build_is_current(here):
        return True
    sys.meta_path.insert(0, _PureSources(package, here))
    return False


COMPILED: bool = _choose(__name__.rpartition(".")[0], _HERE)
"""True when the hot modules run compiled by mypyc, False when they run as
Python source (no compiler at build time, ``KEYQUEUE_PURE=1``, or a source
edited since it was compiled)."""
