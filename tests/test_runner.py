"""``keyqueue.run_workers``: get → handle → forget/retry → done, for every outcome.

The runner always runs in a thread and is stopped by ``shutdown(drain=True)`` or
a ``stop`` event from the test, joined with a timeout. Delays and backoff pass
on a ``FakeClock``; the test waits for the runner to act through the queue's
event hook (``Recorder``), never by sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from keyqueue import (
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    PermanentError,
    Requeue,
    ShutDown,
    WorkQueue,
    run_workers,
)
from keyqueue.testing import FakeClock

JOIN = 10.0  # generous wall-clock bound for a thread to finish its part


class Recorder:
    """Subscribes to a queue; lets the test wait until the runner did something."""

    def __init__(self, q: WorkQueue[Any]) -> None:
        self.events: list[Event[Any]] = []
        self._cond = threading.Condition()
        q.subscribe(self)

    def __call__(self, event: Event[Any]) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def count(self, kind: EventKind) -> int:
        with self._cond:
            return sum(e.kind is kind for e in self.events)

    def wait_for(self, kind: EventKind, n: int = 1) -> None:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: sum(e.kind is kind for e in self.events) >= n, timeout=JOIN
            )
        assert ok, f"timed out waiting for {n} {kind} event(s)"


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
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def q(clock: FakeClock) -> WorkQueue[Any]:
    return WorkQueue(
        "runner", clock=clock, rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0)
    )


def seed_failures(q: WorkQueue[Any], key: Any, n: int) -> None:
    """Give ``key`` some failure history, so a ``forget`` is observable."""
    for _ in range(n):
        q.rate_limiter.when(key)
    assert q.num_requeues(key) == n


def test_handler_returning_none_forgets_the_key(q: WorkQueue[Any]) -> None:
    seed_failures(q, "a", 3)
    calls: list[Any] = []

    def handler(key: Any) -> None:
        calls.append(key)

    q.add("a")
    q.add("b")
    runner = start_runner(q, handler, workers=2)
    drain_and_finish(q, runner)
    assert sorted(calls) == ["a", "b"]
    assert q.num_requeues("a") == 0
    assert q.stats().retries == 0


def test_requeue_after_forgets_and_brings_the_key_back_only_after_the_delay(
    q: WorkQueue[Any], clock: FakeClock
) -> None:
    seed_failures(q, "a", 2)
    recorder = Recorder(q)
    calls: list[Any] = []
    second = threading.Event()

    def handler(key: Any) -> Requeue | None:
        calls.append(key)
        if len(calls) == 1:
            return Requeue(after=5)
        second.set()
        return None

    runner = start_runner(q, handler, workers=2)
    q.add("a")
    recorder.wait_for(EventKind.DELAY)
    recorder.wait_for(EventKind.DONE)
    assert q.num_requeues("a") == 0
    assert [(e.key, e.duration) for e in recorder.events if e.kind is EventKind.DELAY] == [("a", 5)]

    clock.step(4.5)
    assert q.stats().delayed == 1
    assert len(q) == 0
    assert calls == ["a"]

    clock.step(0.5)
    assert second.wait(JOIN)
    drain_and_finish(q, runner)
    assert calls == ["a", "a"]


def test_requeue_after_zero_redelivers_once_the_handler_is_done(q: WorkQueue[Any]) -> None:
    calls: list[Any] = []

    def handler(key: Any) -> Requeue | None:
        calls.append(key)
        return Requeue(after=0) if len(calls) == 1 else None

    q.add("a")
    recorder = Recorder(q)
    runner = start_runner(q, handler)
    recorder.wait_for(EventKind.DONE, 2)
    drain_and_finish(q, runner)
    assert calls == ["a", "a"]
    assert q.stats().redeliveries == 1


def test_permanent_error_forgets_the_key_without_retry_or_give_up(
    q: WorkQueue[Any], caplog: pytest.LogCaptureFixture
) -> None:
    seed_failures(q, "a", 2)
    calls: list[Any] = []
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        calls.append(key)
        raise PermanentError("bad spec")

    q.add("a")
    runner = start_runner(
        q, handler, on_give_up=lambda key, exc: given_up.append((key, exc)), workers=2
    )
    drain_and_finish(q, runner)
    assert calls == ["a"]
    assert given_up == []
    assert q.num_requeues("a") == 0
    assert q.stats().retries == 0
    assert "bad spec" in caplog.text


def test_failing_handler_is_retried_with_backoff_until_max_retries_then_given_up(
    clock: FakeClock,
) -> None:
    q: WorkQueue[str] = WorkQueue(
        "retries",
        clock=clock,
        max_retries=3,
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0),
    )
    recorder = Recorder(q)
    raised: list[Exception] = []
    given_up: list[tuple[str, BaseException]] = []
    gave_up = threading.Event()

    def handler(key: str) -> None:
        exc = ValueError(f"attempt {len(raised) + 1}")
        raised.append(exc)
        raise exc

    def on_give_up(key: str, exc: BaseException) -> None:
        given_up.append((key, exc))
        gave_up.set()

    runner = start_runner(q, handler, workers=2, on_give_up=on_give_up)
    q.add("a")

    recorder.wait_for(EventKind.RATE_LIMIT, 1)
    assert q.num_requeues("a") == 1
    clock.step(0.5)
    assert len(raised) == 1  # backoff of 1 s not over yet
    clock.step(0.5)

    recorder.wait_for(EventKind.RATE_LIMIT, 2)
    assert q.num_requeues("a") == 2
    backoffs = [e.duration for e in recorder.events if e.kind is EventKind.RATE_LIMIT]
    assert backoffs == [1.0, 2.0]
    clock.step(1.5)
    assert len(raised) == 2
    clock.step(0.5)

    assert gave_up.wait(JOIN)
    drain_and_finish(q, runner)
    assert len(raised) == 3
    assert len(given_up) == 1
    assert given_up[0][0] == "a"
    assert given_up[0][1] is raised[-1]
    assert q.num_requeues("a") == 0  # forgotten after giving up
    assert q.stats().rate_limited == 2


def test_handler_returning_something_else_counts_as_a_failure(clock: FakeClock) -> None:
    q: WorkQueue[str] = WorkQueue("odd", clock=clock, max_retries=1)
    given_up: list[tuple[str, BaseException]] = []
    q.add("a")
    runner = start_runner(
        q, lambda key: "ok", on_give_up=lambda key, exc: given_up.append((key, exc))
    )
    drain_and_finish(q, runner)
    assert len(given_up) == 1
    assert isinstance(given_up[0][1], TypeError)


def test_raising_on_give_up_does_not_stop_the_workers(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    q: WorkQueue[str] = WorkQueue("give-up-bug", clock=clock, max_retries=1)
    calls: list[str] = []

    def handler(key: str) -> None:
        calls.append(key)
        raise ValueError(key)

    def on_give_up(key: str, exc: BaseException) -> None:
        raise RuntimeError("on_give_up bug")

    for key in ("a", "b", "c"):
        q.add(key)
    runner = start_runner(q, handler, on_give_up=on_give_up)
    drain_and_finish(q, runner)
    assert calls == ["a", "b", "c"]
    assert "on_give_up bug" in caplog.text


def test_done_is_called_for_every_key_whatever_the_outcome(clock: FakeClock) -> None:
    q: WorkQueue[int] = WorkQueue("mixed", clock=clock, max_retries=1)

    def handler(key: int) -> Requeue | None:
        match key % 4:
            case 0:
                return None
            case 1:
                return Requeue(after=1)
            case 2:
                raise PermanentError(str(key))
            case _:
                raise ValueError(key)

    for key in range(40):
        q.add(key)
    runner = start_runner(q, handler, workers=4)
    drain_and_finish(q, runner)
    assert q.stats().gets == 40


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


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_invalid_worker_count_raises_value_error(q: WorkQueue[Any], workers: Any) -> None:
    with pytest.raises(ValueError, match="workers"):
        run_workers(q, lambda key: None, workers=workers)


def test_non_callable_handler_raises_type_error(q: WorkQueue[Any]) -> None:
    with pytest.raises(TypeError, match="handler"):
        run_workers(q, "nope", workers=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("after", [float("nan"), "5", None])
def test_requeue_rejects_an_after_that_is_not_seconds(after: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        Requeue(after=after)
