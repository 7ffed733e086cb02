"""Hooks and fixtures every test folder shares.

- ``async def`` tests run in a fresh event loop (no plugin needed);
- ``front``: every implementation of the queue, one after another, for the one
  behaviour suite in conformance/ (the fronts are in ``tests.support.fronts``
  and ``tests.support.redis_fronts``);
- ``valkey_url``: the session's valkey-server, started on first use;
- the markers ``make test`` selects by: ``compiled_modules`` (the tests of
  ``COMPILED_MODULE_TESTS``) and ``once``.

Nothing here needs redis-py: without it the Redis fronts' tests are skipped and
the in-memory tests (core/, fronts/, conformance/) run as they are.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import gc
import importlib.util
import inspect
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fronts import AsyncioFront, Front, ThreadingFront, Unavailable

# The Redis fronts, and the session's valkey-server fixture (started on first
# use), need redis-py; without it the in-memory tests run alone and each Redis
# front's tests are skipped, saying why.
if importlib.util.find_spec("redis") is not None:
    from tests.support.redis_fronts import (
        AsyncRedisFront,
        AsyncShardedRedisFront,
        RedisFront,
        ShardedRedisFront,
    )
    from tests.support.valkey_server import valkey_cluster, valkey_url  # noqa: F401

    REDIS_FRONTS: list[Front] = [
        RedisFront(),
        AsyncRedisFront(),
        ShardedRedisFront(),
        AsyncShardedRedisFront(),
    ]
else:
    _NO_REDIS = "redis-py is not installed (pip install 'keyqueue[redis]')"
    REDIS_FRONTS = [
        Unavailable(name, _NO_REDIS)
        for name in ("redis", "redis-asyncio", "redis-sharded", "redis-asyncio-sharded")
    ]

# CPython 3.11 keeps the ast module's recursion depth in state that every thread
# shares (gh-106905): two threads in ``ast.parse`` at once (3.11's traceback
# module parses each line it underlines; Hypothesis parses source it describes)
# can raise "SystemError: AST constructor recursion depth mismatch". A worker
# thread logging a traceback while a Hypothesis test runs hit it about once in
# ten full runs; one lock around ``ast.parse`` in the test process removes it.
if sys.version_info < (3, 12):
    _ast_parse = ast.parse
    _ast_lock = threading.RLock()

    @functools.wraps(_ast_parse)
    def _serial_ast_parse(*args: Any, **kwargs: Any) -> Any:
        with _ast_lock:
            return _ast_parse(*args, **kwargs)

    ast.parse = _serial_ast_parse


# A suite started in the background by a non-interactive shell (`make test &`,
# nohup, some CI runners) inherits SIGINT ignored, and so would every command
# the tests start: Python keeps an inherited SIG_IGN, so the tests that press
# Ctrl-C on `keyqueue lab web` or `lab pipeline` waited in vain. A handler of
# our own here is reset to the default in each child at exec, so each command
# gets Python's KeyboardInterrupt as it would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


COMPILED_MODULE_TESTS = (
    "tests/core/",
    "tests/fronts/",
    "tests/conformance/",
    "tests/informer/test_informer.py",
    "tests/informer/test_queues.py",
    "tests/lab/test_commands.py",
    "tests/lab/test_fairness.py",
    "tests/lab/test_pipeline.py",
    "tests/lab/test_pipeline_replicas.py",
    "tests/lab/test_web.py",
    "tests/meta/test_api.py",
    "tests/meta/test_build.py",
    "tests/meta/test_docs.py::test_the_example_runs",
    "tests/meta/test_without_redis.py",
    "tests/ops/test_dashboard.py::test_the_dashboard_and_the_labs_page_send_the_same_headers",
    "tests/ops/test_sharded.py::test_tops_frame_and_plain_line_show_each_shard_and_its_primary",
    "tests/redis/test_add_many.py::test_add_many_matches_the_in_memory_queue_on_the_same_keys",
    "tests/redis/test_edges.py::test_in_memory_workers_block_in_get_and_stop_wakes_them",
    "tests/redis/test_edges.py::test_interrupt_wakes_the_waiting_gets_of_an_async_work_queue",
    "tests/redis/test_stateful.py",
)
"""The tests that run code of the compiled modules (``keyqueue._build.COMPILED_MODULES``),
as node-id prefixes: a folder, a file, or a file's test (with every parameter of it);
they are marked ``compiled_modules``.

``make test`` runs these on both builds and every other test on one (the compiled
build's run takes ``-m "not once"``, the pure build's ``-m "compiled_modules or
once"``): another test runs the same code on both builds, so a second run would
prove nothing new. A test is here when it, or a
thread or process it starts, runs the in-memory queue's modules (``_heap``,
``_waiting``, ``_core``, ``_front``, ``_threading``, ``_asyncio``) beyond their
import, or a line of ``_checks`` that no test here runs: every Redis call checks
its arguments with ``_checks``, lines that ``tests/core/test_checks.py`` pins on
both builds. Measured by ``make test-passes`` (coverage of the pure build, per
test file, tests/meta/test_passes.py), which fails on a file left out.
"""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "compiled_modules: runs code of the compiled modules (COMPILED_MODULE_TESTS)"
    )
    config.addinivalue_line(
        "markers",
        "once: runs no compiled module; make test runs it on the pure build only, and the"
        " compiled runs leave it out (-m 'not once')",
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of ``COMPILED_MODULE_TESTS`` ``compiled_modules``."""
    for item in items:
        if item.nodeid.startswith(COMPILED_MODULE_TESTS):
            item.add_marker(pytest.mark.compiled_modules)


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (no plugin needed)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        argnames = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in argnames}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


FRONTS: list[Front] = [ThreadingFront(), AsyncioFront(), *REDIS_FRONTS]


@pytest.fixture(params=FRONTS, ids=lambda f: f.name)
def front(request: pytest.FixtureRequest) -> Iterator[Front]:
    """Every implementation of the queue, one after another."""
    front: Front = request.param
    reason = front.skips.get(request.function.__name__)
    if reason is not None:
        pytest.skip(reason)
    front.begin(request)
    try:
        yield front
    finally:
        front.end()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Collect what the suite left for the garbage collector, its sockets'
    ResourceWarnings silenced. Each test's own leaks fail it as they are
    collected during the run; what only a collection after the last test
    finds (a client in a cycle the collector had not reached yet) belongs
    to no test, and pytest would fail the whole run for it at exit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for _ in range(3):
            gc.collect()
