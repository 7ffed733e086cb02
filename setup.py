"""Build keyqueue: the hot modules compiled with mypyc when it can, pure Python when not.

Everything else about the package is in pyproject.toml. This file only adds the
extensions: ``keyqueue._build.COMPILED_MODULES`` compiled together by mypyc (one
shared library, ``keyqueue/_native__mypyc``, so they call one another in C),
and the manifest of the sources they were compiled from, which
``keyqueue._build`` checks at import so an edited source never runs as its
stale extension.

Compiled when mypyc is importable (it is a build requirement) and a C compiler
builds against this Python's headers; pure Python (the same package, a
``py3-none-any`` wheel) when ``KEYQUEUE_PURE`` is set to anything but ``""``
or ``0``, or when either is missing. A pure in-place build (``pip install -e .``
with ``KEYQUEUE_PURE=1``) removes the extensions an earlier build left in
``src/keyqueue``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT / "src" / "keyqueue"
SHARED_LIBRARY = "keyqueue._native"  # mypyc names it keyqueue._native__mypyc


def _build_constant(name: str) -> Any:
    """A literal from keyqueue/_build.py, read without importing the package."""
    tree = ast.parse((PACKAGE / "_build.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} not found in keyqueue/_build.py")


MODULES: tuple[str, ...] = _build_constant("COMPILED_MODULES")
MANIFEST: str = _build_constant("COMPILED_MANIFEST")


def _say(message: str) -> None:
    print(f"keyqueue build: {message}", file=sys.stderr)


def _compiler_works() -> bool:
    """A C compiler that builds against this Python's headers is here."""
    from setuptools._distutils.ccompiler import new_compiler  # noqa: PLC0415
    from setuptools._distutils.sysconfig import customize_compiler  # noqa: PLC0415

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp, "probe.c")
        probe.write_text("#include <Python.h>\nint keyqueue_probe(void) { return 0; }\n")
        try:
            compiler.compile(
                [str(probe)], output_dir=tmp, include_dirs=[sysconfig.get_paths()["include"]]
            )
        except Exception as exc:
            _say(f"the C compiler failed ({exc})")
            return False
    return True


# setup.py runs once per build step; only these build what mypyc compiles (the
# metadata and sdist steps, egg_info, dist_info and sdist, need no C).
_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}


def _pure(reason: str) -> list[Any]:
    """No extensions; building in place, remove those an earlier build left
    (with no extension to build, setuptools runs no build_ext to replace them)."""
    _say(f"{reason}: pure Python")
    if {"editable_wheel", "develop"} & set(sys.argv) or {"--inplace", "-i"} & set(sys.argv):
        for old in [PACKAGE / MANIFEST, *_in_place_extensions()]:
            _say(f"removing {old.relative_to(ROOT)}")
            old.unlink(missing_ok=True)
    return []


def _extensions() -> list[Any]:
    if not _BUILDS.intersection(sys.argv[1:]):
        return []
    if os.environ.get("KEYQUEUE_PURE", "") not in ("", "0"):
        return _pure("KEYQUEUE_PURE is set")
    try:
        from mypyc.build import mypycify  # noqa: PLC0415
    except ImportError:
        return _pure("mypyc is not installed")
    if not _compiler_works():
        return _pure("no C compiler")
    _say(f"compiling {', '.join(MODULES)} with mypyc (set KEYQUEUE_PURE=1 to skip)")
    os.chdir(ROOT)  # mypyc takes paths relative to the project and writes C to build/
    return mypycify(
        [f"src/keyqueue/{name}.py" for name in MODULES],
        group_name=SHARED_LIBRARY,
        opt_level="3",
        debug_level="0",
    )


class BuildExt(build_ext):
    """build_ext that writes the manifest beside the extensions.

    In place, it first removes what an earlier build left in src/keyqueue, so
    it writes new files rather than over the old ones, which a running process
    may have mapped.
    """

    def run(self) -> None:
        if self.inplace:
            for old in [PACKAGE / MANIFEST, *_in_place_extensions()]:
                old.unlink(missing_ok=True)
        super().run()
        if self.extensions:
            target = Path(self.get_ext_fullpath(f"keyqueue.{MODULES[0]}")).parent
            lines = [f"{_digest(PACKAGE / f'{name}.py')}  {name}.py\n" for name in MODULES]
            (target / MANIFEST).write_text("".join(lines), encoding="ascii")


def _digest(path: Path) -> str:
    """As keyqueue._build.source_digest."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _in_place_extensions() -> list[Path]:
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    names = [*MODULES, SHARED_LIBRARY.rpartition(".")[2] + "__mypyc"]
    return [PACKAGE / f"{name}{suffix}" for name in names if (PACKAGE / f"{name}{suffix}").exists()]


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildExt},
    # A pure wheel built straight from a work tree must not pick up extensions
    # an editable build left beside the sources.
    exclude_package_data={"keyqueue": ["*.so", "*.pyd", MANIFEST]},
)
