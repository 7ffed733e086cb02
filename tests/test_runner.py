"""What is specific to the threaded runner, ``keyqueue.run_workers``.

The outcome rules (``None``, ``Requeue(after=)``, ``PermanentError``, retries
with backoff, giving up, ``done`` for every key, argument checks) are pinned for
both runners in test_conformance.py; here: worker threads under concurrent
producers, the ``stop`` ``threading.Event``, workers released by ``shutdown``,
a ``SystemExit`` raised in a worker thread; and the ``Requeue`` value's own
checks, which belong to no front.

The runner always runs in a thread and is stopped by ``shutdown`` or a ``stop``
event from the test, joined with a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from keyqueue import ItemExponentialFailureRateLimiter, Requeue, ShutDown, WorkQueue, run_workers
from keyqueue.testing import FakeClock

JOIN = 10.0  # generous wall-clock bound for a thread to finish its part


class Runner(threading.Thread):
    """``run_workers`` in a thread; keeps what it raised."""

    def __init__(self, q: WorkQueue[Any], handler: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self._args = (q, handler)
        self._kwargs = kwargs
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            run_workers(*self._args, **self._kwargs)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(JOIN)
        assert not self.is_alive(), "run_workers did not return"
        assert self.error is None, self.error


def start_runner(q: WorkQueue[Any], handler: Callable[[Any], Any], **kwargs: Any) -> Runner:
    runner = Runner(q, handler, **kwargs)
    runner.start()
    return runner


def drain_and_finish(q: WorkQueue[Any], runner: Runner) -> None:
    assert q.shutdown(drain=True, timeout=JOIN) is True
    runner.finish()
    stats = q.stats()
    assert stats.processing == 0  # done was called for every key handed out
    assert stats.dones == stats.gets


@pytest.fixture
def q() -> WorkQueue[Any]:
    return WorkQueue(
        "runner", clock=FakeClock(), rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0)
    )


def test_handler_never_runs_twice_at_once_for_one_key() -> None:
    q: WorkQueue[str] = WorkQueue("exclusive")
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
    drain_and_finish(q, runner)
    assert violations == 0
    assert calls >= len(keys)
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
    stop.set()
    runner.finish()
    assert q.stats().gets == 0


def test_workers_return_when_the_queue_is_shut_down() -> None:
    q: WorkQueue[str] = WorkQueue("shut")
    runner = start_runner(q, lambda key: None, workers=3)
    q.shutdown()
    runner.finish()
    with pytest.raises(ShutDown):
        q.get_nowait()


def test_handler_raising_system_exit_stops_the_workers_and_propagates() -> None:
    q: WorkQueue[str] = WorkQueue("crash")
    q.add("a")

    def handler(key: str) -> None:
        raise SystemExit(3)

    runner = start_runner(q, handler, workers=2)
    runner.join(JOIN)
    assert not runner.is_alive()
    assert isinstance(runner.error, SystemExit)
    assert q.stats().processing == 0
    q.shutdown()


@pytest.mark.parametrize("after", [float("nan"), "5", None])
def test_requeue_rejects_an_after_that_is_not_seconds(after: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        Requeue(after=after)
