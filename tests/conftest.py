"""Shared fixtures: the ``front`` harness that runs one behaviour suite on every front.

Conformance tests are ``async def`` functions taking ``front``; they build
queues with ``front.make(...)`` and use only what every front has (the plain
methods, plus ``await front.get(q)``, ``await front.shutdown(q)`` and
``await front.run_workers(...)``). A later backend adds one ``Front`` subclass.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio

import keyqueue
from keyqueue import AsyncWorkQueue, Requeue, WorkQueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from valkey_server import valkey_url  # noqa: F401 (the session's server, started on first use)

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


Handler = Callable[[Any], "Requeue | None"]


class Front:
    """How a conformance test drives one implementation."""

    name: str
    queue_type: type
    skips: ClassVar[dict[str, str]] = {}
    """Conformance tests that cannot apply to this front: test name -> why."""
    per_client_shutdown: ClassVar[bool] = False
    """Shutdown stops this client only, and the queue outlives it (Redis): a
    drain waits for the client's own holds, and what it leaves stays on the
    server for the other clients or the next start."""

    def begin(self, request: pytest.FixtureRequest) -> None:
        """Set up for one test (the Redis fronts get a server and an empty db)."""

    def end(self) -> None:
        """Tear down after one test."""

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        """A new queue; call it inside the test coroutine (the asyncio front binds there)."""
        return self.queue_type(name, **kwargs)

    async def get(self, q: Any, timeout: float = 5.0) -> Any:
        """A blocking get bounded by ``timeout`` wall seconds (raises keyqueue.Empty)."""
        raise NotImplementedError

    async def shutdown(self, q: Any, drain: bool = False, timeout: float | None = None) -> bool:
        raise NotImplementedError

    async def drain(self, q: Any, timeout: float | None = None) -> bool:
        """``shutdown(drain=True, timeout=timeout)`` without blocking the test's
        loop (a task can run it while the test acts on the queue)."""
        raise NotImplementedError

    async def join(self, q: Any, timeout: float | None = None) -> bool:
        """``q.join(timeout)`` without blocking the test's loop."""
        raise NotImplementedError

    async def run_workers(
        self,
        q: Any,
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        """Run the front's runner with a plain ``handler`` until ``until()`` holds
        (default: the queue is idle: nothing waiting, processing or delayed),
        then shut down with drain, wait for the runner and return its RunStats."""
        raise NotImplementedError


def _idle(q: Any) -> bool:
    s = q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


class ThreadingFront(Front):
    name = "threading"
    queue_type = WorkQueue

    async def get(self, q: WorkQueue[Any], timeout: float = 5.0) -> Any:
        return q.get(timeout=timeout)

    async def shutdown(
        self, q: WorkQueue[Any], drain: bool = False, timeout: float | None = None
    ) -> bool:
        return q.shutdown(drain=drain, timeout=timeout)

    async def drain(self, q: WorkQueue[Any], timeout: float | None = None) -> bool:
        return await asyncio.to_thread(q.shutdown, drain=True, timeout=timeout)

    async def join(self, q: WorkQueue[Any], timeout: float | None = None) -> bool:
        return await asyncio.to_thread(q.join, timeout)

    async def run_workers(
        self,
        q: WorkQueue[Any],
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        errors: list[BaseException] = []
        returned: list[keyqueue.RunStats] = []

        def run() -> None:
            try:
                returned.append(
                    keyqueue.run_workers(q, handler, workers=workers, on_give_up=on_give_up)
                )
            except BaseException as exc:  # surfaced in the test thread below
                errors.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        check = until or (lambda: _idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                await asyncio.sleep(0.001)
            assert q.shutdown(drain=True, timeout=timeout)
        finally:
            q.shutdown()  # a failed check must not leave the runner thread behind
        runner.join(timeout)
        assert not runner.is_alive()
        if errors:
            raise errors[0]
        return returned[0]


class AsyncioFront(Front):
    name = "asyncio"
    queue_type = AsyncWorkQueue

    async def get(self, q: AsyncWorkQueue[Any], timeout: float = 5.0) -> Any:
        return await q.get(timeout=timeout)

    async def shutdown(
        self, q: AsyncWorkQueue[Any], drain: bool = False, timeout: float | None = None
    ) -> bool:
        return await q.shutdown(drain=drain, timeout=timeout)

    async def drain(self, q: AsyncWorkQueue[Any], timeout: float | None = None) -> bool:
        return await q.shutdown(drain=True, timeout=timeout)

    async def join(self, q: AsyncWorkQueue[Any], timeout: float | None = None) -> bool:
        return await q.join(timeout)

    async def run_workers(
        self,
        q: AsyncWorkQueue[Any],
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        async def ahandler(key: Any) -> Requeue | None:
            await asyncio.sleep(0)
            return handler(key)

        # A non-callable handler is passed through as is, so that arun_workers's
        # own argument check sees it (as run_workers does on the threading front).
        runner = asyncio.create_task(
            keyqueue.arun_workers(
                q,
                ahandler if callable(handler) else handler,
                workers=workers,
                on_give_up=on_give_up,
            )
        )
        check = until or (lambda: _idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                assert not runner.done() or runner.exception() is None
                await asyncio.sleep(0.001)
            assert await q.shutdown(drain=True, timeout=timeout)
            return await asyncio.wait_for(runner, timeout)
        finally:
            runner.cancel()


# -- the Redis fronts ----------------------------------------------------------------

_STR_KEYS = "a Redis queue's keys are str (any other key is a TypeError naming it)"
_PER_CLIENT_SHUTDOWN = (
    "shutdown is per client on Redis: the shared queue keeps its waiting and delayed "
    "keys and takes adds for the other clients (DESIGN.md; the distributed version "
    "is in test_redis.py, named ..._per_client_...)"
)
REDIS_SKIPS = {
    "test_a_callback_that_calls_its_queue_gets_runtime_error_not_a_deadlock": (
        "a Redis client's callbacks run after the server applied the call, under no "
        "lock: calling the queue from one works"
    ),
    "test_any_hashable_can_be_a_key": _STR_KEYS,
    "test_key_is_not_kept_alive_after_add_get_done_forget": _STR_KEYS,
    "test_key_is_not_kept_alive_after_retry_and_forget_once_the_delay_fired": _STR_KEYS,
    "test_runner_calls_done_for_every_key_whatever_the_outcome": _STR_KEYS,
    "test_delayed_keys_are_dropped_at_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_add_after_shutdown_is_a_silent_no_op": _PER_CLIENT_SHUTDOWN,
    "test_retries_and_rate_limited_are_counted_on_a_live_queue_only": _PER_CLIENT_SHUTDOWN,
    "test_waiting_keys_are_handed_out_after_shutdown_then_get_raises_shutdown": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_get_raises_shutdown_while_keys_are_held_if_no_redelivery_is_owed": (_PER_CLIENT_SHUTDOWN),
    "test_key_marked_while_held_is_redelivered_after_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_drain_waits_for_waiting_and_redelivered_keys": _PER_CLIENT_SHUTDOWN,
    "test_repeated_shutdown_emits_one_shutdown_event_and_keeps_waiting_keys": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_stats_counters_after_a_mixed_sequence_match_the_calls_and_the_events": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_while_shutting_down_is_given_up_with_a_warning": _PER_CLIENT_SHUTDOWN,
    "test_retry_while_shutting_down_returns_false_and_adds_nothing": _PER_CLIENT_SHUTDOWN,
    "test_retry_whose_re_add_meets_a_shutdown_gives_the_key_up_instead_of_losing_it": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_retry_of_a_key_re_added_while_held_during_shutdown_is_true_and_redelivers_it": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_of_a_key_re_added_while_held_at_shutdown_is_retried_not_given_up": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_whose_retry_meets_a_shutdown_is_given_up_with_a_warning": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_prometheus_retries_not_counted_after_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_metrics_adds_after_shutdown_are_not_counted": _PER_CLIENT_SHUTDOWN,
    "test_metrics_delayed_keys_gauge_follows_the_delay_heap": _PER_CLIENT_SHUTDOWN,
    "test_metrics_retries_total_counts_add_after_and_add_rate_limited_on_a_live_queue": (
        _PER_CLIENT_SHUTDOWN
    ),
}


class _RedisQueues:
    """Each Redis test starts on an empty db and closes the queues it made."""

    url = ""
    per_client_shutdown = True

    def begin(self, request: pytest.FixtureRequest) -> None:
        self.url = request.getfixturevalue("valkey_url")
        client = redis.Redis.from_url(self.url)
        client.flushdb()
        client.close()
        self.made: weakref.WeakSet[Any] = weakref.WeakSet()


class RedisFront(_RedisQueues, ThreadingFront):
    """RedisWorkQueue: the threading front's harness, on a real server."""

    name = "redis"
    queue_type = RedisWorkQueue
    skips = REDIS_SKIPS

    def begin(self, request: pytest.FixtureRequest) -> None:
        super().begin(request)
        self.client = redis.Redis.from_url(self.url)

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        q = RedisWorkQueue(name, client=self.client, **kwargs)
        self.made.add(q)
        return q

    def end(self) -> None:
        for q in list(self.made):
            q.close()
        self.client.close()


class _Loop:
    """An event loop in a daemon thread: where the async Redis queues live."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="redis-front-loop", daemon=True).start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SyncOverAsync:
    """An AsyncRedisWorkQueue behind the plain methods the conformance tests call.

    Each coroutine method runs on the queue's own loop (in another thread) and
    is waited for, so ``q.add(k)`` reads as on the other fronts; ``len(q)`` is
    ``stats().depth``. Everything else is the queue's own attribute.
    """

    _COROUTINES = frozenset(
        {"add", "add_many", "add_after", "add_rate_limited", "forget", "num_requeues", "retry"}
        | {"get_nowait", "done", "stats", "snapshot", "exists", "delete"}
    )

    def __init__(self, aq: AsyncRedisWorkQueue, loop: _Loop) -> None:
        self.aq = aq
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.aq, name)
        if name not in self._COROUTINES:
            return attr
        return lambda *args, **kwargs: self._loop.run(attr(*args, **kwargs))

    def __len__(self) -> int:
        return int(self.stats().depth)


class _AsyncOverWrapper:
    """A test's wrapper around a SyncOverAsync, as arun_workers sees a queue: its
    plain methods become coroutines (run in a worker thread, so the wrapper's
    own behaviour, such as a method that raises, still applies)."""

    def __init__(self, wrapper: Any, aq: AsyncRedisWorkQueue) -> None:
        self._wrapper, self._aq = wrapper, aq

    def __getattr__(self, name: str) -> Any:
        if name not in SyncOverAsync._COROUTINES:
            return getattr(self._aq, name)
        method = getattr(self._wrapper, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            call = functools.partial(method, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(None, call)

        return call


class AsyncRedisFront(_RedisQueues, Front):
    """AsyncRedisWorkQueue on its own loop, its coroutines hidden by SyncOverAsync."""

    name = "redis-asyncio"
    queue_type = AsyncRedisWorkQueue
    skips = REDIS_SKIPS
    _loop: _Loop | None = None

    def begin(self, request: pytest.FixtureRequest) -> None:
        super().begin(request)
        if AsyncRedisFront._loop is None:
            AsyncRedisFront._loop = _Loop()
        self.loop = AsyncRedisFront._loop
        self.client = redis.asyncio.Redis.from_url(self.url)

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        aq = AsyncRedisWorkQueue(name, client=self.client, **kwargs)
        self.made.add(aq)
        return SyncOverAsync(aq, self.loop)

    def end(self) -> None:
        for aq in list(self.made):
            self.loop.run(aq.aclose())
        self.loop.run(self.client.aclose())

    async def _await(self, q: SyncOverAsync, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, q._loop.loop))

    async def get(self, q: SyncOverAsync, timeout: float = 5.0) -> Any:
        return await self._await(q, q.aq.get(timeout=timeout))

    async def shutdown(
        self, q: SyncOverAsync, drain: bool = False, timeout: float | None = None
    ) -> bool:
        return bool(await self._await(q, q.aq.shutdown(drain=drain, timeout=timeout)))

    async def drain(self, q: SyncOverAsync, timeout: float | None = None) -> bool:
        return bool(await self._await(q, q.aq.shutdown(drain=True, timeout=timeout)))

    async def join(self, q: SyncOverAsync, timeout: float | None = None) -> bool:
        return bool(await self._await(q, q.aq.join(timeout)))

    async def run_workers(
        self,
        q: SyncOverAsync,
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        async def ahandler(key: Any) -> Requeue | None:
            await asyncio.sleep(0)
            return handler(key)

        queue = q.aq if isinstance(q, SyncOverAsync) else _AsyncOverWrapper(q, q.aq)
        runner = asyncio.run_coroutine_threadsafe(
            keyqueue.arun_workers(
                queue,
                ahandler if callable(handler) else handler,
                workers=workers,
                on_give_up=on_give_up,
            ),
            q._loop.loop,
        )
        check = until or (lambda: _idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                assert not runner.done() or runner.exception() is None
                await asyncio.sleep(0.001)
            assert await self.shutdown(q, drain=True, timeout=timeout)
            return await asyncio.wait_for(asyncio.wrap_future(runner), timeout)
        finally:
            runner.cancel()


FRONTS = [ThreadingFront(), AsyncioFront(), RedisFront(), AsyncRedisFront()]


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
