"""Both builds of keyqueue in one process, for interleaved timings.

``keyqueue`` is the installed package: compiled when ``make`` built it
(``keyqueue.COMPILED``). ``load_pure()`` copies the same ``src/keyqueue``
sources (``.py`` files only) into a temporary package, ``keyqueue_pure``, and
imports it: with no extensions beside it, its ``_build`` loads every module
from source. Same code, both builds, one process, so the machine's noise hits
both alike. Subprocess runs use ``KEYQUEUE_PURE=1`` instead (``run.py``).
"""

from __future__ import annotations

import atexit
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import keyqueue

SOURCE = Path(__file__).resolve().parent.parent / "src" / "keyqueue"


def require_compiled() -> None:
    """Exit with a clear message unless the installed keyqueue runs compiled."""
    if not keyqueue.COMPILED:
        sys.exit(
            "keyqueue is not running compiled (no C compiler, KEYQUEUE_PURE set, or a "
            "source edited since the build): run `make native` first"
        )


def load_pure() -> ModuleType:
    """``keyqueue`` as pure Python, imported as the package ``keyqueue_pure``."""
    if "keyqueue_pure" in sys.modules:
        return sys.modules["keyqueue_pure"]
    tmp = Path(tempfile.mkdtemp(prefix="keyqueue-pure-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    shutil.copytree(
        SOURCE,
        tmp / "keyqueue_pure",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "_compiled.sha256", "__pycache__"),
    )
    sys.path.insert(0, str(tmp))
    pure = importlib.import_module("keyqueue_pure")
    assert not pure.COMPILED
    return pure
