"""The wheels ``make dist`` leaves in dist/ install and run.

``make dist`` builds the sdist, a manylinux wheel per CPython it was given
(``DIST_PYTHONS``: 3.11, 3.12, 3.13) and the pure ``py3-none-any`` wheel. Each
test here installs one wheel into a fresh venv of one Python, outside this
tree, and runs a few calls there: the compiled wheel on the CPython its tag
names (``keyqueue.COMPILED`` is true), the pure one on every Python (false).

Building takes minutes, so ``make test`` does not: these tests run when dist/
holds wheels and skip when it does not (a fresh clone). ``make dist-test``
builds when needed and runs them with ``KEYQUEUE_REQUIRE_DIST=1``, which makes
a missing wheel or Python fail instead. They run once, in ``make test``'s
compiled pass: a wheel does not depend on which build the suite is testing.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
PYTHONS = ("3.11", "3.12", "3.13")  # the Makefile's DIST_PYTHONS
REQUIRED = os.environ.get("KEYQUEUE_REQUIRE_DIST") == "1"
COMPILED_WHEEL = re.compile(r"keyqueue-[^-]+-cp3(\d+)-cp3\1-(manylinux[^-]*_x86_64)\.whl")

SCRIPT = """
import asyncio, sys
import keyqueue

q = keyqueue.WorkQueue[str]()
q.add("a")
q.add("a")
q.add("b", priority=1)
assert [q.get(), q.get()] == ["b", "a"], "priority order"
q.done("a")
q.done("b")
assert len(q) == 0 and q.shutdown(drain=True, timeout=1)

async def main():
    aq = keyqueue.AsyncWorkQueue[int]()
    aq.add(1)
    key = await aq.get()
    aq.done(key)
    return key

assert asyncio.run(main()) == 1
import inspect  # help reads the same in both builds (the sources ship beside the extensions)
assert inspect.getdoc(keyqueue.WorkQueue.add).startswith("Mark ``key`` for processing.")
assert str(inspect.signature(keyqueue.AsyncWorkQueue.get)).endswith("-> 'K'")
import re
from importlib.resources import files  # every Redis script's includes ship (redis-py not needed)
lua = files("keyqueue") / "redis" / "lua"  # not keyqueue.redis: that imports redis-py
scripts = [p for p in lua.iterdir() if p.name.endswith(".lua")]
assert len(scripts) >= 10, scripts
for script in [*scripts, *(lua / "lib").iterdir()]:
    for lib in re.findall(r'^--- @include "([a-z_]+)"$', script.read_text(), re.MULTILINE):
        assert (lua / "lib" / f"{lib}.lua").is_file(), f"{script.name} includes {lib}"
print(keyqueue.COMPILED, keyqueue.__file__.startswith(sys.prefix))
"""


def wheels() -> list[Path]:
    return sorted(DIST.glob("*.whl"))


pytestmark = [
    pytest.mark.skipif(
        not wheels() and not REQUIRED, reason="no wheels in dist/ (make dist, or make dist-test)"
    ),
    pytest.mark.skipif(
        os.environ.get("KEYQUEUE_PURE", "") not in ("", "0") and not REQUIRED,
        reason="the wheels are tested in make test's compiled pass",
    ),
]


def find_python(version: str) -> str | None:
    """``python<version>`` from PATH, else pyenv's (as the Makefile's dist finds it)."""
    candidates = [f"python{version}"]
    if pyenv := shutil.which("pyenv"):
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        pattern = f"{root.stdout.strip()}/versions/{version}.*/bin/python{version}"
        candidates += sorted(glob.glob(pattern))
    for candidate in candidates:
        try:
            subprocess.run([candidate, "-c", ""], capture_output=True, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        return candidate
    return None


def python_for(version: str) -> str:
    python = find_python(version)
    if python is None:
        if REQUIRED:
            pytest.fail(f"python{version} is not on this machine")
        pytest.skip(f"python{version} is not on this machine")
    return python


def run_in_fresh_venv(python: str, wheel: Path, tmp_path: Path) -> str:
    """Install ``wheel`` alone into a new venv of ``python``; run SCRIPT there."""
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    target = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(target), "install", "--quiet",
         "--no-deps", "--no-index", "--no-cache-dir", str(wheel)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYQUEUE_", "PYTHON"))}
    done = subprocess.run(
        [str(target), "-c", SCRIPT],
        cwd=tmp_path,  # not this tree: the installed package is what imports
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_dist_holds_the_sdist_a_manylinux_wheel_per_cpython_and_the_pure_wheel() -> None:
    names = sorted(path.name for path in DIST.iterdir())
    compiled = {m.group(1): m.group(2) for name in names if (m := COMPILED_WHEEL.fullmatch(name))}
    assert sorted(compiled) == sorted(version.split(".")[1] for version in PYTHONS), names
    assert all("manylinux" in tag for tag in compiled.values())
    assert [name for name in names if name.endswith("-py3-none-any.whl")], names
    assert [name for name in names if name.endswith(".tar.gz")], names
    assert not [name for name in names if name.endswith("-linux_x86_64.whl")], names
    assert len(names) == len(PYTHONS) + 2, names


@pytest.mark.parametrize("version", PYTHONS)
def test_the_compiled_wheel_installs_and_runs_compiled_on_its_python(
    version: str, tmp_path: Path
) -> None:
    tag = f"cp{version.replace('.', '')}"
    matching = [w for w in wheels() if f"-{tag}-{tag}-manylinux" in w.name]
    assert len(matching) == 1, f"no {tag} manylinux wheel in dist/: {[w.name for w in wheels()]}"
    assert run_in_fresh_venv(python_for(version), matching[0], tmp_path) == "True True"


@pytest.mark.parametrize("version", PYTHONS)
def test_the_pure_wheel_installs_and_runs_as_python_on_every_python(
    version: str, tmp_path: Path
) -> None:
    pure = [w for w in wheels() if w.name.endswith("-py3-none-any.whl")]
    assert len(pure) == 1, f"no pure wheel in dist/: {[w.name for w in wheels()]}"
    assert run_in_fresh_venv(python_for(version), pure[0], tmp_path) == "False True"
