"""Hooks and fixtures every test folder shares.

- ``async def`` tests run in a fresh event loop (no plugin needed);
- ``front``: every implementation of the queue, one after another, for the one
  behaviour suite in conformance/ (the fronts are in ``tests.support.fronts``
  and ``tests.support.redis_fronts``);
- ``valkey_url``: the session's valkey-server, started on first use.

Nothing here needs redis-py: without it the Redis fronts' tests are skipped and
the in-memory tests (core/, fronts/, conformance/) run as they are.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import importlib.util
import inspect
import signal
import sys
import threading
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
