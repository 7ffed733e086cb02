"""What is specific to the threaded runner, ``keyqueue.run_workers``.

The outcome rules (``None``, ``Requeue()``, ``Requeue(after=)``,
``PermanentError``, retries with backoff, giving up, ``done`` for every key,
going on after a fault, ``RunStats``, argument checks) are pinned for both
runners in conformance/test_behaviour.py; here: worker threads under concurrent
producers, the ``stop`` ``threading.Event``, workers released by ``shutdown``,
a failure while a drain waits, ``SystemExit``/``KeyboardInterrupt`` raised in a
worker thread; and what belongs to no front: the ``Requeue`` value's checks,
``RunStats`` itself, and each runner refusing the other kind of handler.

The runner always runs in a thread and is stopped by ``shutdown`` or a ``stop``
event from the test, joined with a timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from keyqueue import (
    AsyncWorkQueue,
    EventKind,
    ItemExponentialFailureRateLimiter,
    PermanentError,
    Requeue,
    RunStats,
    ShutDown,
    WorkQueue,
    arun_workers,
    run_workers,
)
from keyqueue._errors import LeaseLost
from keyqueue._flow import Flow
from keyqueue._outcome import done_flow, outcome_flow
from keyqueue._runner import adrive, drive
from keyqueue.testing import FakeClock

JOIN = 10.0  # generous wall-clock bound for a thread to finish its part
SRC = Path(__file__).resolve().parents[2] / "src"


class Runner(threading.Thread):
    """``run_workers`` in a thread; keeps what it raised."""

    def __init__(self, q: WorkQueue[Any], handler: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self._args = (q, handler)
        self._kwargs = kwargs
        self.error: BaseException | None = None
        self.stats: RunStats | None = None

    def run(self) -> None:
        try:
            self.stats = run_workers(*self._args, **self._kwargs)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> RunStats:
        self.join(JOIN)
        assert not self.is_alive(), "run_workers did not return"
        assert self.error is None, self.error
        assert self.stats is not None
        return self.stats


def start_runner(q: WorkQueue[Any], handler: Callable[[Any], Any], **kwargs: Any) -> Runner:
    runner = Runner(q, handler, **kwargs)
    runner.start()
    return runner


def drain_and_finish(q: WorkQueue[Any], runner: Runner, handled: Callable[[], int]) -> None:
    """Drain, wait for the runner; ``handled()`` counts the handler's calls."""
    assert q.shutdown(drain=True, timeout=JOIN) is True
    runner.finish()
    stats = q.stats()
    # One get per handler call, and done was called for every one of them.
    assert (stats.gets, stats.dones, stats.processing) == (handled(), handled(), 0)


@pytest.fixture
def q() -> WorkQueue[Any]:
    return WorkQueue(
        "runner", clock=FakeClock(), rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0)
    )


def test_handler_never_runs_twice_at_once_for_one_key() -> None:
    q: WorkQueue[str] = WorkQueue("exclusive")
    kinds: list[EventKind] = []  # subscribers run under the queue's lock: in order
    q.subscribe(lambda event: kinds.append(event.kind))
    keys = ["a", "b", "c"]
    lock = threading.Lock()
    active: set[str] = set()
    violations = 0
    calls = 0

    def handler(key: str) -> None:
        nonlocal violations, calls
        with lock:
            if key in active:
                violations += 1
            active.add(key)
            calls += 1
        time.sleep(0.0005)  # hold the key a little, so adds land meanwhile
        with lock:
            active.discard(key)

    runner = start_runner(q, handler, workers=4)

    def produce() -> None:
        for i in range(400):
            q.add(keys[i % len(keys)])
            if i % 2 == 0:
                time.sleep(0)

    producers = [threading.Thread(target=produce, daemon=True) for _ in range(4)]
    for t in producers:
        t.start()
    for t in producers:
        t.join(JOIN)
        assert not t.is_alive()
    drain_and_finish(q, runner, lambda: calls)
    assert violations == 0
    # Every push onto the FIFO (a first add or a redelivery) was handled once.
    assert calls == kinds.count(EventKind.ENQUEUE) + kinds.count(EventKind.REDELIVER)
    assert q.stats().adds == 1600


def test_stop_event_makes_workers_finish_the_key_in_flight_and_return(q: WorkQueue[Any]) -> None:
    started = threading.Event()
    release = threading.Event()
    handled: list[Any] = []

    def handler(key: Any) -> None:
        started.set()
        assert release.wait(JOIN)
        handled.append(key)

    stop = threading.Event()
    q.add("a")
    q.add("b")
    runner = start_runner(q, handler, workers=1, stop=stop)
    assert started.wait(JOIN)
    stop.set()
    runner.join(0.05)
    assert runner.is_alive()  # still finishing "a"
    release.set()
    runner.finish()

    assert handled == ["a"]
    assert not q.shutting_down  # stop is not shutdown
    stats = q.stats()
    assert stats.processing == 0
    assert stats.depth == 1  # "b" was never taken
    assert q.get_nowait() == "b"


def test_stop_event_returns_idle_workers(q: WorkQueue[Any]) -> None:
    stop = threading.Event()
    runner = start_runner(q, lambda key: None, workers=3, stop=stop)
    deadline = time.monotonic() + JOIN
    while q._getters < 3:  # every worker idle in get, not yet returned
        assert time.monotonic() < deadline, "workers did not start waiting in get"
        time.sleep(0.001)
    stop.set()
    runner.finish()
    assert q.stats().gets == 0


class _SlowToStart(threading.Thread):
    """A worker thread, other than the first, that starts late (a loaded machine)."""

    def start(self) -> None:
        if self.name.startswith("keyqueue-worker-") and not self.name.endswith("-0"):
            time.sleep(0.2)
        super().start()


def test_a_stop_set_while_the_workers_still_start_ends_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watcher starts before the workers (a Ctrl-C meanwhile finds it
    running). A stop set while some were not started yet sent it to join
    one of those, and join raised in its thread. Now it waits only for the
    workers that run; one started later sees the stop before its first get."""
    monkeypatch.setattr(threading, "Thread", _SlowToStart)
    q: WorkQueue[str] = WorkQueue("stopped-early")
    q.add_many(["a", "b"])
    stop = threading.Event()

    def handler(key: str) -> None:  # the first worker's key; the others not started yet
        stop.set()
        time.sleep(0.05)

    stats = run_workers(q, handler, workers=3, stop=stop)
    assert stats.processed == 1
    assert q.stats().gets == 1
    assert q.get_nowait() == "b"


CTRL_C_IN_A_WORKER = """
import signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's job has it
import keyqueue

q = keyqueue.WorkQueue("q")
q.add_many(["a", "b"])
started, said, lock = [], [], threading.Lock()
interrupt = q.interrupt

def stopping():  # the run's watcher wakes the workers: the first Ctrl-C was taken
    if not said:
        said.append(True)
        print("stopping", flush=True)
    interrupt()

q.interrupt = stopping

def handler(key):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # Ctrl-C lands here
    with lock:
        started.append(key)
        if len(started) == 2:
            print("handling", flush=True)
    threading.Event().wait(120)  # a handler that does not end soon

# The main thread (and each thread it starts) blocks SIGINT: the kernel hands it
# to a worker's thread, and the main thread's wait is not interrupted, as when
# Ctrl-C lands just as that wait begins.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
keyqueue.run_workers(q, handler, workers=2)
"""


def _line(proc: subprocess.Popen[str]) -> str:
    """The child's next line of output, or "" if none came within JOIN."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], JOIN)
    return proc.stdout.readline() if ready else ""


def test_a_ctrl_c_that_does_not_interrupt_the_runs_wait_is_still_taken() -> None:
    """run_workers waited for its workers (and, after a Ctrl-C, for their
    handlers) in joins without a timeout: a Ctrl-C that landed just as a
    join began, or in another thread, was taken only once that thread ended
    (a handler's 120 s; a second Ctrl-C in a loaded test run waited that
    long). Now each wait returns often enough for it to be taken."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_IN_A_WORKER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    try:
        assert _line(proc) == "handling\n"
        proc.send_signal(signal.SIGINT)
        assert _line(proc) == "stopping\n"  # taken: the run waits for its handlers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=JOIN)
        assert proc.returncode != 0
        assert err.rstrip().endswith("KeyboardInterrupt"), err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_workers_return_when_the_queue_is_shut_down() -> None:
    q: WorkQueue[str] = WorkQueue("shut")
    runner = start_runner(q, lambda key: None, workers=3)
    q.shutdown()
    runner.finish()
    with pytest.raises(ShutDown):
        q.get_nowait()


@pytest.mark.parametrize("crash", [SystemExit, KeyboardInterrupt])
def test_handler_raising_system_exit_stops_the_workers_and_propagates(
    crash: type[BaseException],
) -> None:
    q: WorkQueue[str] = WorkQueue("crash")
    q.add("a")

    def handler(key: str) -> None:
        raise crash()

    runner = start_runner(q, handler, workers=2)
    runner.join(JOIN)
    assert not runner.is_alive()
    assert isinstance(runner.error, crash)
    assert q.stats().processing == 0
    q.shutdown()


@pytest.mark.parametrize(
    ("after", "error"),
    [(float("nan"), ValueError), ("5", TypeError), (True, TypeError), (Decimal(1), TypeError)],
)
def test_requeue_rejects_an_after_that_is_not_seconds(after: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="Requeue"):
        Requeue(after=after)


@pytest.mark.parametrize("after", [None, 0, -1.5, 2, 0.25])
def test_requeue_accepts_none_and_any_number_of_seconds(after: float | None) -> None:
    assert Requeue(after=after).after == after  # negative means now, as add_after


def test_requeue_without_after_means_a_rate_limited_requeue() -> None:
    assert Requeue().after is None


def test_run_stats_is_a_frozen_snapshot_that_starts_at_zero() -> None:
    stats = RunStats()
    assert dataclasses.astuple(stats) == (0,) * 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.processed = 1  # type: ignore[misc]


# -- a failure while a drain waits ----------------------------------------------------


def test_handler_failing_while_a_drain_waits_comes_back_after_its_backoff_not_given_up(
    q: WorkQueue[Any], caplog: pytest.LogCaptureFixture
) -> None:
    # Not given up ("cannot retry, giving up"): the key backs off as on a live
    # queue, and the drain waits for it.
    started, release = threading.Event(), threading.Event()
    calls: list[Any] = []
    given_up: list[tuple[Any, str]] = []

    def handler(key: Any) -> None:
        calls.append(key)
        if len(calls) == 1:
            started.set()
            assert release.wait(JOIN)
            raise RuntimeError("failed mid-drain")

    q.add("a")
    runner = start_runner(q, handler, on_give_up=lambda k, e: given_up.append((k, str(e))))
    assert started.wait(JOIN)
    drained: list[bool] = []
    drainer = threading.Thread(
        target=lambda: drained.append(q.shutdown(drain=True, timeout=JOIN)), daemon=True
    )
    drainer.start()
    deadline = time.monotonic() + JOIN
    while not q.shutting_down:  # a real thread must get into shutdown first
        assert time.monotonic() < deadline, "shutdown did not start"
        time.sleep(0.001)
    with caplog.at_level(logging.INFO, logger="keyqueue"):
        release.set()
        deadline = time.monotonic() + JOIN
        while q.stats().delayed != 1:  # the failed key backs off (a worker thread's retry)
            assert time.monotonic() < deadline, "the failed key did not back off"
            time.sleep(0.001)
    assert drainer.is_alive()  # the drain waits for the key backing off
    q.clock.step(1.0)  # type: ignore[attr-defined]  # its backoff (1 s) passes
    drainer.join(JOIN)
    assert not drainer.is_alive()
    stats = runner.finish()

    assert drained == [True]
    assert calls == ["a", "a"]
    assert given_up == []
    assert "'a' failed during shutdown; not given up" in caplog.text
    assert "giving up" not in caplog.text
    s = q.stats()
    assert (s.gets, s.dones, s.retries, s.delayed) == (2, 2, 1, 0)
    assert stats == RunStats(processed=2, retried=1, succeeded=1)


def test_handler_failing_during_a_drain_for_a_key_re_added_while_held_is_redelivered(
    q: WorkQueue[Any], caplog: pytest.LogCaptureFixture
) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[Any] = []
    given_up: list[Any] = []

    def handler(key: Any) -> None:
        calls.append(key)
        if len(calls) == 1:
            started.set()
            assert release.wait(JOIN)
            raise RuntimeError("failed with a change pending")

    q.add("a")
    runner = start_runner(q, handler, on_give_up=lambda k, e: given_up.append(k))
    assert started.wait(JOIN)
    q.add("a")  # changed while held: owed one redelivery
    drained: list[bool] = []
    drainer = threading.Thread(
        target=lambda: drained.append(q.shutdown(drain=True, timeout=JOIN)), daemon=True
    )
    drainer.start()
    deadline = time.monotonic() + JOIN
    while not q.shutting_down:  # a real thread must get into shutdown first
        assert time.monotonic() < deadline, "shutdown did not start"
        time.sleep(0.001)
    release.set()
    drainer.join(JOIN)
    assert not drainer.is_alive()
    stats = runner.finish()

    assert drained == [True]
    assert calls == ["a", "a"]  # the change that arrived while it was held was handled
    assert given_up == []
    assert "giving up" not in caplog.text
    s = q.stats()
    assert (s.gets, s.dones, s.redeliveries, s.retries, s.delayed) == (2, 2, 1, 0, 0)
    assert stats == RunStats(processed=2, retried=1, succeeded=1)


def test_async_on_give_up_given_to_run_workers_runs_until_it_waits_then_is_closed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q: WorkQueue[Any] = WorkQueue("async-give-up", clock=FakeClock(), max_retries=1)
    reached: list[str] = []

    async def on_give_up(key: Any, exc: BaseException) -> None:
        reached.append(key)
        await asyncio.sleep(0)  # a thread of run_workers has no loop to wait on
        reached.append("after the wait")

    def handler(key: Any) -> None:
        raise RuntimeError("fails once, for good")

    q.add("a")
    runner = start_runner(q, handler, on_give_up=on_give_up)
    drain_and_finish(q, runner, lambda: 1)

    assert reached == ["a"]  # called, then closed where it would wait: never left pending
    assert "use arun_workers" in caplog.text
    assert runner.finish() == RunStats(processed=1, gave_up=1)


# -- each runner refuses the other kind of handler ---------------------------------


async def _async_handler(key: Any) -> None:
    return None


def _sync_handler(key: Any) -> None:
    return None


def _returns_a_coroutine(key: Any) -> Any:
    return _async_handler(key)


class _AsyncCallable:
    async def __call__(self, key: Any) -> None:
        return None


class _SyncCallable:
    def __call__(self, key: Any) -> None:
        return None


@pytest.mark.parametrize(
    "handler",
    [_async_handler, functools.partial(_async_handler), _AsyncCallable()],
    ids=["async-def", "partial", "async-call"],
)
def test_run_workers_refuses_an_async_handler_before_taking_a_key(handler: Any) -> None:
    q: WorkQueue[str] = WorkQueue("kind")
    q.add("a")
    q.shutdown()  # were the handler accepted, the runner would take "a" and return

    with pytest.raises(TypeError, match="arun_workers"):
        run_workers(q, handler)
    s = q.stats()
    assert (s.gets, s.depth) == (0, 1)


@pytest.mark.parametrize(
    "handler",
    [_sync_handler, lambda key: None, _SyncCallable(), _returns_a_coroutine],
    ids=["def", "lambda", "call", "def-returning-a-coroutine"],
)
async def test_arun_workers_refuses_a_sync_handler_before_taking_a_key(handler: Any) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("kind")
    q.add("a")
    await q.shutdown()  # were the handler accepted, the runner would take "a" and return

    with pytest.raises(TypeError, match="async def"):
        await asyncio.wait_for(arun_workers(q, handler), JOIN)
    s = q.stats()
    assert (s.gets, s.depth) == (0, 1)


class _LooksAsync:
    """Passes the kind check (its ``__call__`` attribute is async) but calling it
    runs the class's plain ``__call__``, which returns something not awaitable."""

    def __init__(self) -> None:
        self.__call__ = _async_handler
        self.calls: list[Any] = []

    def __call__(self, key: Any) -> str:
        self.calls.append(key)
        return "not awaitable"


async def test_arun_workers_fails_a_key_whose_handler_returns_no_awaitable() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("no-awaitable", max_retries=3)
    handler = _LooksAsync()
    given_up: list[tuple[str, BaseException]] = []
    q.add("a")
    q.add("b")
    await q.shutdown()  # each failure is then given up at once, and the runner returns

    stats = await asyncio.wait_for(
        arun_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e))), JOIN
    )

    assert handler.calls == ["a", "b"]  # a failure of each key, not a crash of the pool
    assert [k for k, _ in given_up] == ["a", "b"]
    for _, exc in given_up:
        assert isinstance(exc, TypeError)
        assert "'not awaitable'" in str(exc)
        assert "not an awaitable" in str(exc)
    assert stats == RunStats(processed=2, gave_up=2)


# -- a queue that loses its connection (keyqueue.redis): the workers go on ---------------


class _Flaky:
    """A queue whose ``get``/``done`` raise ``ConnectionError`` on the calls whose
    numbers (0, 1, ...) are in ``fail_get``/``fail_done``; everything else is ``q``'s.
    With ``awaits``, ``get`` and ``done`` are coroutines (as on AsyncRedisWorkQueue)."""

    def __init__(
        self, q: Any, fail_get: set[int] = frozenset(), fail_done: set[int] = frozenset()
    ) -> None:
        self._q, self._fail_get, self._fail_done = q, fail_get, fail_done
        self.gets = self.dones = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        n = self.gets if method == "get" else self.dones
        if method == "get":
            self.gets += 1
        else:
            self.dones += 1
        if n in (self._fail_get if method == "get" else self._fail_done):
            raise ConnectionError(f"{method} #{n}: connection reset")
        return getattr(self._q, method)(*args, **kwargs)

    def get(self, timeout: float | None = None) -> Any:
        return self._call("get", timeout=timeout)

    def done(self, key: Any) -> None:
        self._call("done", key)


class _AsyncFlaky(_Flaky):
    async def get(self, timeout: float | None = None) -> Any:  # type: ignore[override]
        n = self.gets
        self.gets += 1
        if n in self._fail_get:
            raise ConnectionError(f"get #{n}: connection reset")
        return await self._q.get()

    async def done(self, key: Any) -> None:  # type: ignore[override]
        self._call("done", key)


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backoff 1 ms doubling to 4 ms (instead of 50 ms to 2 s)."""
    monkeypatch.setattr("keyqueue._outcome._BACKOFF_FIRST", 0.001)
    monkeypatch.setattr("keyqueue._outcome._BACKOFF_MAX", 0.004)


def _jittered(pauses: list[float], backoffs: list[float]) -> bool:
    """Each pause is drawn between half and all of its backoff (3 digits, as
    logged), and the draws are not all the backoffs themselves."""
    assert len(pauses) == len(backoffs), (pauses, backoffs)
    for pause, ceiling in zip(pauses, backoffs, strict=True):
        assert ceiling / 2 * 0.999 <= pause <= ceiling * 1.001, (pauses, backoffs)
    return pauses != backoffs


def _first_pause(calls: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``calls`` with the pause, drawn between 25 and 50 ms (the first
    backoff, jittered), as the 50 ms backoff it was drawn from."""
    pauses = [i for i, (name, _) in enumerate(calls) if name == "_pause"]
    assert len(pauses) == 1, calls
    i = pauses[0]
    assert 0.025 <= calls[i][1] <= 0.05, calls
    return [*calls[:i], ("_pause", 0.05), *calls[i + 1 :]]


def _pauses(caplog: pytest.LogCaptureFixture, what: str) -> list[float]:
    """The pauses the runner logged before trying ``what`` ('get' or 'done') again."""
    return [
        float(r.getMessage().rsplit(" in ", 1)[1].split()[0])
        for r in caplog.records
        if f"{what} raised ConnectionError" in r.getMessage()
    ]


def test_get_raising_a_connection_error_is_retried_with_a_doubling_backoff_reset_on_success(
    fast_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    q: WorkQueue[str] = WorkQueue("flaky-get")
    flaky = _Flaky(q, fail_get={0, 1, 2, 3, 5})
    handled: list[str] = []
    q.add("a")
    q.add("b")
    stop = threading.Event()

    runner = start_runner(flaky, handled.append, workers=1, stop=stop)  # type: ignore[arg-type]
    deadline = time.monotonic() + JOIN
    while len(handled) < 2:
        assert time.monotonic() < deadline, "the worker did not go on after get raised"
        time.sleep(0.001)
    stop.set()
    stats = runner.finish()

    assert handled == ["a", "b"]
    assert _jittered(_pauses(caplog, "get"), [0.001, 0.002, 0.004, 0.004, 0.001])
    first = caplog.records[0].getMessage()
    assert first.startswith("keyqueue 'flaky-get': get raised ConnectionError: get #0: conn")
    assert stats == RunStats(processed=2, succeeded=2)


async def test_arun_workers_retries_a_get_that_raises_and_goes_on(
    fast_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("flaky-aget")
    flaky = _AsyncFlaky(q, fail_get={0, 1, 2, 3, 5})
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)
        if len(handled) == 2:
            await q.shutdown()

    q.add("a")
    q.add("b")
    stats = await asyncio.wait_for(arun_workers(flaky, handler), JOIN)  # type: ignore[arg-type]

    assert handled == ["a", "b"]
    assert _jittered(_pauses(caplog, "get"), [0.001, 0.002, 0.004, 0.004, 0.001])
    assert stats == RunStats(processed=2, succeeded=2)


def test_done_raising_a_connection_error_is_asked_again_until_it_answers(
    fast_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    q: WorkQueue[str] = WorkQueue("flaky-done")
    flaky = _Flaky(q, fail_done={0, 1})
    q.add("a")
    runner = start_runner(flaky, lambda key: None, workers=1)  # type: ignore[arg-type]
    drain_and_finish(q, runner, lambda: 1)
    assert _jittered(_pauses(caplog, "done"), [0.001, 0.002])
    assert runner.finish() == RunStats(processed=1, succeeded=1)


async def test_arun_workers_asks_a_failed_done_again_until_it_answers(
    fast_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("flaky-adone")
    flaky = _AsyncFlaky(q, fail_done={0, 1})

    async def handler(key: str) -> None:
        await q.shutdown()

    q.add("a")
    stats = await asyncio.wait_for(arun_workers(flaky, handler), JOIN)  # type: ignore[arg-type]

    assert _jittered(_pauses(caplog, "done"), [0.001, 0.002])
    assert stats == RunStats(processed=1, succeeded=1)
    s = q.stats()
    assert (s.dones, s.processing) == (1, 0)


def test_done_that_keeps_failing_is_given_up_when_the_workers_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q: WorkQueue[str] = WorkQueue("dead-done")
    flaky = _Flaky(q, fail_done=set(range(10_000)))
    stop = threading.Event()
    q.add("a")
    runner = start_runner(flaky, lambda key: None, workers=1, stop=stop)  # type: ignore[arg-type]
    deadline = time.monotonic() + JOIN
    while flaky.dones < 2:  # asked again at least once
        assert time.monotonic() < deadline, "done was not asked again"
        time.sleep(0.001)

    stop.set()

    assert runner.finish() == RunStats(processed=1, errors=1)
    given_up = [r.getMessage() for r in caplog.records if "not releasing" in r.getMessage()]
    assert len(given_up) == 1, given_up
    assert "'a'" in given_up[0]
    assert q.stats().processing == 1  # never released: a lease would run out


class _LosesOneCancel:
    """An async queue whose ``get`` loses the first cancellation and waits on (as a
    call through Python 3.11's ``asyncio.wait_for`` can, in redis.asyncio)."""

    def __init__(self, q: AsyncWorkQueue[Any]) -> None:
        self._q = q
        self.cancels = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)

    async def get(self) -> Any:
        while True:
            try:
                return await self._q.get()
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > 1:
                    raise


async def test_arun_workers_stop_cancels_a_waiting_get_again_if_a_cancellation_was_lost() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("lost-cancel")
    queue = _LosesOneCancel(q)
    stop = asyncio.Event()
    runner = asyncio.create_task(arun_workers(queue, _async_handler, stop=stop))  # type: ignore[arg-type]
    while not q._getters:  # the worker waits in get
        await asyncio.sleep(0.001)

    stop.set()

    assert await asyncio.wait_for(runner, JOIN) == RunStats()
    assert queue.cancels == 2


# -- the outcome rules without I/O: flows a test drives by hand ---------------------


class _ByHand:
    """A queue for a flow driven by hand: the flow names each call, the test
    answers it; the queue itself is never called."""

    name = "by-hand"
    shutting_down = False
    connection_errors = (ConnectionError,)

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            raise AssertionError(f"the flow called {method} itself")

        call.__name__ = method
        return call


def _pause(seconds: float) -> bool:
    raise AssertionError("the flow waited itself")


def _by_hand(flow: Flow[Any], *answers: object) -> tuple[list[tuple[Any, ...]], Any]:
    """Drive ``flow``: each call it yields is named (function, arguments), then
    answered with the next of ``answers`` (an exception is thrown in). Returns
    the calls named and what the flow returned."""
    named: list[tuple[Any, ...]] = []
    replies = iter(answers)
    try:
        call = next(flow)
        while True:
            assert isinstance(call, functools.partial)
            named.append((call.func.__name__, *call.args, *call.keywords.items()))
            reply = next(replies)
            call = flow.throw(reply) if isinstance(reply, BaseException) else flow.send(reply)
    except StopIteration as end:
        assert next(replies, "none left") == "none left"
        return named, end.value


def test_a_failure_flow_asks_retry_then_gives_up_the_key() -> None:
    error = RuntimeError("broke")
    calls, settled = _by_hand(outcome_flow(_ByHand(), "k", None, error), False, None)
    assert calls == [("retry", "k"), ("give_up", "k", "retries", error)]
    assert settled == ("gave_up", error)


def test_a_requeue_flow_forgets_then_adds_after_with_its_priority() -> None:
    flow = outcome_flow(_ByHand(), "k", Requeue(after=2, priority=3), None)
    calls, settled = _by_hand(flow, None, None)
    assert calls == [("forget", "k"), ("add_after", "k", 2, ("priority", 3))]
    assert settled == ("requeued", None)


def test_an_outcome_call_that_lost_its_connection_is_asked_again_after_the_drivers_pause() -> None:
    flow = outcome_flow(_ByHand(), "k", None, None, _pause)
    calls, settled = _by_hand(flow, ConnectionError("reset"), True, None)
    assert _first_pause(calls) == [("forget", "k"), ("_pause", 0.05), ("forget", "k")]
    assert settled == ("succeeded", None)


def test_an_outcome_unanswered_when_the_workers_stop_abandons_the_key_instead_of_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flow = outcome_flow(_ByHand(), "k", None, RuntimeError("broke"), _pause)
    calls, settled = _by_hand(flow, ConnectionError("reset"), False)
    assert _first_pause(calls) == [("retry", "k"), ("_pause", 0.05)]
    assert settled == ("abandoned", None)

    calls, counted = _by_hand(done_flow(_ByHand(), "k", "abandoned", _pause), None)
    assert calls == [("abandon", "k")]
    assert counted == "errors"
    assert "not releasing the key" in caplog.text


def test_a_connection_error_is_an_answer_without_a_pause_to_wait_with() -> None:
    calls, settled = _by_hand(outcome_flow(_ByHand(), "k", None, None), ConnectionError(), None)
    assert calls == [("forget", "k"), ("forget", "k")]  # the best-effort forget of a fault
    assert settled == ("errors", None)


def test_a_done_whose_outcome_is_unknown_is_asked_again_after_the_drivers_pause() -> None:
    flow = done_flow(_ByHand(), "k", "succeeded", _pause)
    calls, counted = _by_hand(flow, OSError("reset"), True, None)
    assert _first_pause(calls) == [("done", "k"), ("_pause", 0.05), ("done", "k")]
    assert counted == "succeeded"


def test_a_lost_lease_is_counted_once_with_one_warning_whichever_calls_raise_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls, settled = _by_hand(
        outcome_flow(_ByHand(), "k", None, RuntimeError("broke"), _pause), LeaseLost("retry")
    )
    assert (calls, settled) == ([("retry", "k")], ("lease_lost", None))
    calls, counted = _by_hand(done_flow(_ByHand(), "k", "lease_lost", _pause), LeaseLost("done"))
    assert (calls, counted) == ([("done", "k")], "lease_lost")
    assert caplog.text.count("lease lost") == 1


class _Awaited:
    """A ``WorkQueue`` whose calls are coroutines (as ``AsyncRedisWorkQueue``'s)."""

    def __init__(self, q: WorkQueue[Any]) -> None:
        self._q = q

    @property
    def shutting_down(self) -> bool:
        return self._q.shutting_down

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._q, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        call.__name__ = name
        return call


_FAILED = RuntimeError("broke")


@pytest.mark.parametrize(
    ("result", "error", "outcome"),
    [
        (None, None, "succeeded"),
        (Requeue(), None, "requeued"),
        (Requeue(after=5, priority=2), None, "requeued"),
        (None, PermanentError("no"), "permanent"),
        (None, _FAILED, "gave_up"),
        ("neither", None, "gave_up"),
    ],
)
async def test_drive_and_adrive_apply_one_rule_to_a_plain_and_a_coroutine_queue(
    result: object, error: BaseException | None, outcome: str
) -> None:
    plain: WorkQueue[str] = WorkQueue("plain", clock=FakeClock(), max_retries=1)
    awaited: WorkQueue[str] = WorkQueue("awaited", clock=FakeClock(), max_retries=1)
    for q in (plain, awaited):
        q.add("k")
        assert q.get_nowait() == "k"

    given_up: list[tuple[str, str]] = []
    on_give_up = lambda key, exc: given_up.append((key, type(exc).__name__))  # noqa: E731
    sync = drive(outcome_flow(plain, "k", result, error, on_give_up=on_give_up))
    sync_count = drive(done_flow(plain, "k", sync[0]))
    aflow = outcome_flow(_Awaited(awaited), "k", result, error, on_give_up=on_give_up)
    async_ = await adrive(aflow)
    async_count = await adrive(done_flow(_Awaited(awaited), "k", async_[0]))

    assert sync[0] == async_[0] == sync_count == async_count == outcome
    assert (sync[1] is None) == (async_[1] is None) == (outcome != "gave_up")
    failed = type(error or TypeError()).__name__  # returning "neither" is a TypeError
    assert given_up == ([] if outcome != "gave_up" else [("k", failed)] * 2)
    fields = ("depth", "delayed", "processing", "retries", "dones", "gets", "adds")
    a, b = plain.stats(), awaited.stats()
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]


# -- nothing polls: idle workers wait in one get each until stop wakes them ----------

IDLE = 0.3  # wall seconds idle: a 50 ms poll would have asked get about 6 times a worker


def test_idle_run_workers_asks_get_once_a_worker_and_stop_wakes_them() -> None:
    q: WorkQueue[str] = WorkQueue("idle")
    counting = _Flaky(q)
    stop = threading.Event()
    runner = start_runner(counting, lambda key: None, workers=3, stop=stop)  # type: ignore[arg-type]
    deadline = time.monotonic() + JOIN
    while q._getters < 3:
        assert time.monotonic() < deadline, "workers did not start waiting in get"
        time.sleep(0.001)
    time.sleep(IDLE)  # what is measured: nothing happens meanwhile

    stop.set()

    assert runner.finish() == RunStats()
    assert counting.gets == 3


async def test_idle_arun_workers_asks_get_once_a_worker_and_stop_wakes_them() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("aidle")
    counting = _AsyncFlaky(q)
    stop = asyncio.Event()
    runner = asyncio.create_task(arun_workers(counting, _async_handler, workers=3, stop=stop))  # type: ignore[arg-type]
    while len(q._getters) < 3:
        await asyncio.sleep(0.001)
    await asyncio.sleep(IDLE)  # what is measured: nothing happens meanwhile

    stop.set()

    assert await asyncio.wait_for(runner, JOIN) == RunStats()
    assert counting.gets == 3
