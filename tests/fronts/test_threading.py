"""What is specific to the threading front, ``keyqueue.WorkQueue``.

The shared semantics (coalescing, redelivery, delays on a FakeClock, shutdown,
events, retries, what the queue keeps alive) are pinned once for every front in
conformance/test_behaviour.py, and the core's transition tables in core/test_core.py; here:
many threads at once, blocking ``get`` and its ``timeout``, wake-ups and
shutdown and drain across threads, and the delay timer (a FakeClock stepped
while a thread waits, and the real-clock timer thread).

Threads are always joined with a timeout. Where a test needs a thread to be
parked inside ``get`` or a drain before it acts, it waits for the queue's
private waiter counters (``_getters``, ``_joiners``): that waits for a thread
to act, it never sleeps for time to pass.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keyqueue import AsyncWorkQueue, Empty, Event, EventKind, QueueGauges, ShutDown, WorkQueue
from keyqueue.testing import FakeClock

JOIN = 10.0  # generous wall-clock bound for a thread to finish its part


# -- helpers -----------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = JOIN) -> None:
    """Wait for another thread to act (not for time to pass)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.001)


def wait_getters(q: WorkQueue[Any], n: int) -> None:
    wait_until(lambda: q._getters >= n, f"{n} thread(s) blocked in get")


def wait_drainers(q: WorkQueue[Any], n: int) -> None:
    wait_until(lambda: q._joiners >= n, f"{n} thread(s) blocked in a drain or join")


class Call(threading.Thread):
    """Run ``fn()`` in a thread; keep its result or exception for the test to check."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as exc:
            self.error = exc

    def outcome(self, timeout: float = JOIN) -> Any:
        """Join; return the result, or the exception instance it raised."""
        self.join(timeout)
        assert not self.is_alive(), "thread did not finish in time"
        return self.error if self.error is not None else self.result


def started(fn: Callable[[], Any]) -> Call:
    call = Call(fn)
    call.start()
    return call


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def q(clock: FakeClock) -> Iterator[WorkQueue[Any]]:
    queue: WorkQueue[Any] = WorkQueue("test", clock=clock)
    yield queue
    queue.shutdown()


# -- many threads ----------------------------------------------------------------


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads often, so adds land while keys are held."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


@pytest.mark.usefixtures("busy_switching")
def test_hammering_producers_and_consumers_never_share_a_key_and_lose_no_add() -> None:
    producers, consumers, adds_each = 6, 4, 1500
    keys = [f"k{i}" for i in range(5)]
    q: WorkQueue[str] = WorkQueue("hammer")
    kinds: list[EventKind] = []  # subscribers run under the queue's lock: in order
    q.subscribe(lambda event: kinds.append(event.kind))

    lock = threading.Lock()
    held: set[str] = set()
    violations = 0
    generation = dict.fromkeys(keys, 0)  # bumped before every add of the key
    seen = dict.fromkeys(keys, 0)  # highest generation a get of the key observed
    gets = 0
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        for i in range(adds_each):
            key = keys[(seed + i * 7) % len(keys)]
            with lock:
                generation[key] += 1
            q.add(key)
            if i % 3 == 0:
                time.sleep(0)  # yield, so adds interleave with gets and dones

    def consume() -> None:
        nonlocal violations, gets
        try:
            while True:
                try:
                    key = q.get(timeout=JOIN)
                except ShutDown:
                    return
                with lock:
                    if key in held:
                        violations += 1
                    held.add(key)
                    seen[key] = max(seen[key], generation[key])
                    gets += 1
                time.sleep(0)  # let other threads run while the key is held
                with lock:
                    held.discard(key)
                q.done(key)
        except BaseException as exc:
            errors.append(exc)

    consumer_threads = [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
    producer_threads = [
        threading.Thread(target=produce, args=(i,), daemon=True) for i in range(producers)
    ]
    for t in consumer_threads + producer_threads:
        t.start()
    for t in producer_threads:
        t.join(60)
        assert not t.is_alive()

    assert q.shutdown(drain=True, timeout=30) is True
    for t in consumer_threads:
        t.join(JOIN)
        assert not t.is_alive()

    assert errors == []
    assert violations == 0
    # Every key's last add was followed by a get that saw it.
    assert seen == generation
    stats = q.stats()
    assert stats.adds == producers * adds_each
    assert stats.gets == stats.dones == gets  # each consumer's get was followed by its done
    assert (stats.processing, stats.depth) == (0, 0)
    # Each counter agrees with the transitions the queue reported one by one.
    counted = (EventKind.ENQUEUE, EventKind.COALESCE, EventKind.MARK_WHILE_PROCESSING)
    assert (stats.enqueued, stats.coalesced, stats.marked_while_processing) == tuple(
        map(kinds.count, counted)
    )
    assert (stats.redeliveries, stats.gets, stats.dones) == tuple(
        map(kinds.count, (EventKind.REDELIVER, EventKind.GET, EventKind.DONE))
    )
    assert kinds.count(EventKind.GET) == kinds.count(EventKind.ENQUEUE) + kinds.count(
        EventKind.REDELIVER
    )  # every push was handed out once


@pytest.mark.usefixtures("busy_switching")
def test_delayed_adds_under_concurrent_clock_steps_are_all_processed() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("delayed-hammer", clock=clock)
    keys = [f"k{i}" for i in range(4)]
    lock = threading.Lock()
    generation = dict.fromkeys(keys, 0)
    seen = dict.fromkeys(keys, 0)
    held: set[str] = set()
    violations = 0
    producing = threading.Event()
    producing.set()
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        for i in range(500):
            key = keys[(seed + i) % len(keys)]
            with lock:
                generation[key] += 1
            q.add_after(key, (i % 4) * 0.01)  # 0 adds now, the rest wait for steps

    def step_clock() -> None:
        while producing.is_set():
            clock.step(0.005)
            time.sleep(0)

    def consume() -> None:
        nonlocal violations
        try:
            while True:
                try:
                    key = q.get(timeout=JOIN)
                except ShutDown:
                    return
                with lock:
                    violations += key in held
                    held.add(key)
                    seen[key] = max(seen[key], generation[key])
                time.sleep(0)
                with lock:
                    held.discard(key)
                q.done(key)
        except BaseException as exc:
            errors.append(exc)

    stepper = started(step_clock)
    consumers = [started(consume) for _ in range(3)]
    producers = [started(lambda i=i: produce(i)) for i in range(4)]
    for p in producers:
        assert p.outcome(60) is None
    producing.clear()
    assert stepper.outcome() is None
    clock.step(1)  # past every ready time: nothing is left in the delay heap
    assert q.stats().delayed == 0
    assert q.shutdown(drain=True, timeout=30) is True
    for c in consumers:
        assert c.outcome() is None

    assert errors == []
    assert violations == 0
    assert seen == generation
    assert q.stats().retries == 4 * 500


# -- blocking get ----------------------------------------------------------------


def test_blocked_get_is_woken_by_add_from_another_thread(q: WorkQueue[Any]) -> None:
    getter = started(q.get)
    wait_getters(q, 1)
    q.add("a")
    assert getter.outcome() == "a"


@pytest.mark.parametrize("add_one", ["add", "add_many"])
def test_a_woken_getter_gets_its_key_within_a_bounded_number_of_adds_of_a_spinning_producer(
    add_one: str,
) -> None:
    """A producer spinning on ``add`` yields the GIL to the getter it woke every
    ``_YIELD_EVERY`` adds, so the getter runs long before CPython's switch
    interval would force the producer off (set to 10 s here: without the yield
    the getter would wait for millions of adds)."""
    from keyqueue._threading import _YIELD_EVERY  # noqa: PLC0415

    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []
    getter = Call(lambda: got.append(q.get()))
    getter.start()
    wait_getters(q, 1)
    add = q.add if add_one == "add" else lambda key: q.add_many([key])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        adds = 0
        while not got and adds < 1000 * _YIELD_EVERY:
            add("k")  # the first pushes and wakes the getter; the rest are absorbed
            adds += 1
    finally:
        sys.setswitchinterval(interval)
    getter.join(JOIN)
    assert got == ["k"]
    assert adds <= 20 * _YIELD_EVERY, f"the woken getter ran after {adds:,} adds"


@pytest.mark.parametrize("add_one", ["add", "add_many"])
def test_a_worker_back_from_a_blocking_handler_runs_within_a_bounded_number_of_adds(
    add_one: str,
) -> None:
    """A worker holding a key, back from a call that blocked (its handler
    waited on I/O), needs the GIL to call ``done``; no getter is blocked. A
    producer spinning on ``add`` yields it every ``_YIELD_EVERY`` adds while a
    key is held, so the worker runs long before CPython's switch interval
    would force the producer off (set to 10 s here: without the yield the
    worker would wait for the producer's million adds)."""
    from keyqueue._threading import _YIELD_EVERY  # noqa: PLC0415

    q: WorkQueue[str] = WorkQueue()
    q.add("held")
    holding, answered = threading.Event(), threading.Event()
    finished: list[str] = []

    def worker() -> None:
        key = q.get()
        holding.set()
        answered.wait()  # the handler's I/O: it releases the GIL while it blocks
        q.done(key)
        finished.append(key)

    holder = Call(worker)
    holder.start()
    wait_until(holding.is_set, "the worker to hold its key")
    add = q.add if add_one == "add" else lambda key: q.add_many([key])
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        answered.set()  # the worker wakes, and waits for the GIL
        adds = 0
        while not finished and adds < 1000 * _YIELD_EVERY:
            add("k")  # the first pushes; the rest are absorbed
            adds += 1
    finally:
        sys.setswitchinterval(interval)
    holder.join(JOIN)
    assert finished == ["held"]
    # A yield hands the GIL over only once the OS has run the woken worker:
    # a loaded machine may take several yields.
    assert adds <= 100 * _YIELD_EVERY, f"the worker ran after {adds:,} adds"


def test_each_add_wakes_one_of_several_blocked_getters(q: WorkQueue[Any]) -> None:
    getters = [started(q.get) for _ in range(3)]
    wait_getters(q, 3)
    for key in ("a", "b", "c"):
        q.add(key)
    assert sorted(g.outcome() for g in getters) == ["a", "b", "c"]


def test_get_timeout_zero_returns_a_waiting_key(q: WorkQueue[Any]) -> None:
    q.add("a")
    assert q.get(timeout=0) == "a"
    with pytest.raises(Empty):
        q.get(timeout=0)


def test_get_timeout_on_a_fake_clock_that_never_steps_expires_in_wall_time(
    q: WorkQueue[Any], clock: FakeClock
) -> None:
    def timed_get() -> float:
        began = time.monotonic()
        with pytest.raises(Empty):
            q.get(timeout=0.05)
        return time.monotonic() - began

    # In a thread: a get that waited on the fake clock would never return.
    waited = started(timed_get).outcome()
    assert isinstance(waited, float), waited
    assert 0.049 <= waited < JOIN  # 0.049: float rounding of monotonic differences
    assert clock.now() == 0.0


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan")])
def test_get_with_negative_or_nan_timeout_raises_value_error(
    q: WorkQueue[Any], timeout: float
) -> None:
    q.add("a")
    with pytest.raises(ValueError, match="timeout"):
        q.get(timeout=timeout)
    assert len(q) == 1  # nothing was taken


@pytest.mark.parametrize("timeout", [float("inf"), 1e12])
def test_get_with_an_infinite_or_huge_timeout_waits_like_no_timeout(
    q: WorkQueue[Any], timeout: float
) -> None:
    # The timeout is accepted (it is >= 0), so it must mean "wait", not crash.
    getter = started(lambda: q.get(timeout=timeout))
    wait_until(lambda: q._getters == 1 or not getter.is_alive(), "get to block or return")
    q.add("a")
    assert getter.outcome() == "a"


# -- shutdown ----------------------------------------------------------------------


def test_shutdown_releases_getters_blocked_in_several_threads(q: WorkQueue[Any]) -> None:
    getters = [started(q.get) for _ in range(4)]
    wait_getters(q, 4)
    q.shutdown()
    for g in getters:
        assert isinstance(g.outcome(), ShutDown)


def test_getter_blocked_while_redelivery_is_pending_gets_the_key_not_shutdown(
    q: WorkQueue[Any],
) -> None:
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    getters = [started(q.get) for _ in range(2)]
    wait_getters(q, 2)
    q.shutdown()
    # Shutdown woke them, but a redelivery is pending: they must keep waiting.
    for g in getters:
        g.join(0.05)
        assert g.is_alive()
    q.done("a")
    outcomes = [g.outcome() for g in getters]
    assert outcomes.count("a") == 1
    assert sum(isinstance(o, ShutDown) for o in outcomes) == 1


def test_drain_waits_for_waiting_processing_and_readded_keys(q: WorkQueue[Any]) -> None:
    q.add("a")
    q.add("b")
    assert q.get_nowait() == "a"
    q.add("a")  # pending redelivery
    drainer = started(lambda: q.shutdown(drain=True))
    wait_drainers(q, 1)
    assert q.shutting_down

    q.done("a")  # redelivered behind "b"
    assert drainer.is_alive()
    assert q.get_nowait() == "b"
    q.done("b")
    assert drainer.is_alive()
    assert q.get_nowait() == "a"
    q.add("a")  # adds during a drain are no-ops: nothing more to wait for
    drainer.join(0.05)
    assert drainer.is_alive()
    q.done("a")

    assert drainer.outcome() is True
    with pytest.raises(ShutDown):
        q.get_nowait()


def test_drain_with_consumer_threads_returns_true_when_all_processed(q: WorkQueue[Any]) -> None:
    for i in range(20):
        q.add(i)
    processed: list[int] = []

    def consume() -> None:
        while True:
            try:
                key = q.get(timeout=JOIN)
            except ShutDown:
                return
            processed.append(key)
            q.done(key)

    consumers = [started(consume) for _ in range(3)]
    assert started(lambda: q.shutdown(drain=True)).outcome() is True
    for c in consumers:
        assert c.outcome() is None
    assert sorted(processed) == list(range(20))


def test_drain_with_an_infinite_timeout_waits_like_no_timeout(q: WorkQueue[Any]) -> None:
    q.add("a")
    assert q.get_nowait() == "a"
    drainer = started(lambda: q.shutdown(drain=True, timeout=float("inf")))
    wait_until(lambda: q._joiners == 1 or not drainer.is_alive(), "drain to block or return")
    q.done("a")
    assert drainer.outcome() is True


# -- delays ------------------------------------------------------------------------


def test_blocked_get_is_woken_by_a_clock_step(q: WorkQueue[Any], clock: FakeClock) -> None:
    q.add_after("a", 3)
    getter = started(q.get)
    wait_getters(q, 1)
    clock.step(2)
    getter.join(0.05)
    assert getter.is_alive()
    clock.step(1)
    assert getter.outcome() == "a"


def _timer_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"keyqueue-timer-{name}"]


def test_real_clock_timer_delivers_a_short_delay_to_a_blocked_get() -> None:
    name = "real-short-delay"
    q: WorkQueue[str] = WorkQueue(name)
    try:
        q.add_after("a", 0.01)
        assert q.get(timeout=5) == "a"
        # With nothing left to wait for, the timer thread ends on its own.
        for t in _timer_threads(name):
            t.join(JOIN)
            assert not t.is_alive()
    finally:
        q.shutdown()


def test_real_clock_uses_one_timer_thread_however_many_add_after_calls() -> None:
    name = "real-one-timer"
    q: WorkQueue[str] = WorkQueue(name)
    try:
        for i in range(50):
            q.add_after(f"slow{i}", 1000 + i)
        assert len(_timer_threads(name)) == 1
        q.add_after("fast", 0.01)  # earlier than what the timer sleeps toward
        assert len(_timer_threads(name)) == 1
        assert q.get(timeout=5) == "fast"
        assert len(_timer_threads(name)) == 1
        assert q.stats().delayed == 50
    finally:
        timers = _timer_threads(name)
        q.shutdown()
    for t in timers:
        t.join(JOIN)
        assert not t.is_alive()
    assert _timer_threads(name) == []


def test_fake_clock_queue_starts_no_timer_thread(q: WorkQueue[Any]) -> None:
    q.add_after("a", 10)
    assert _timer_threads(q.name) == []


@pytest.mark.parametrize("delay", [1e300, 3600.0])
def test_dropped_queue_with_a_far_delayed_key_is_collected_and_its_timer_thread_ends(
    delay: float,
) -> None:
    name = f"dropped-{delay}"
    q: WorkQueue[str] = WorkQueue(name)
    q.add_after("k", delay)
    q.add_after("first", 0.001)
    assert q.get(timeout=JOIN) == "first"  # the timer has been round its loop
    q.done("first")
    (timer,) = _timer_threads(name)
    ref = weakref.ref(q)

    del q
    gc.collect()

    assert ref() is None
    timer.join(JOIN)
    assert not timer.is_alive()


@pytest.mark.parametrize("cls", [WorkQueue, AsyncWorkQueue])
def test_a_dropped_queue_is_freed_at_once_without_the_garbage_collector(cls: type[Any]) -> None:
    # No reference cycle through the queue's subscribers: one exists only
    # while a callback is subscribed (it runs marked as the queue's).
    gc.disable()
    try:
        q = cls("no-cycle")
        ref = weakref.ref(q)
        del q
        assert ref() is None
        q = cls("no-cycle-after-subscribers")
        unsubscribe = q.subscribe(lambda event: None)
        unsubscribe()
        ref = weakref.ref(q)
        del q, unsubscribe
        assert ref() is None
    finally:
        gc.enable()


def test_a_fake_clock_forgets_collected_queues_and_still_steps_the_live_ones() -> None:
    clock = FakeClock()
    live: list[WorkQueue[str]] = []
    for i in range(1000):
        q: WorkQueue[str] = WorkQueue(f"q{i}", clock=clock)
        q.add_after("k", 1)
        if i % 20 == 0:
            live.append(q)
    del q
    gc.collect()

    assert len(clock._subscribers) < 200  # not one reference per queue ever made
    clock.step(1)
    assert [len(q) for q in live] == [1] * 50


def test_dropped_queue_is_collected_while_its_timer_thread_is_still_releasing_keys() -> None:
    name = "dropped-busy"
    q: WorkQueue[int] = WorkQueue(name)
    for i in range(200):
        q.add_after(i, 0.001 * (i % 7 + 1))
    q.add_after(-1, 1e300)
    (timer,) = _timer_threads(name)
    ref = weakref.ref(q)

    del q
    gc.collect()

    assert ref() is None
    timer.join(JOIN)
    assert not timer.is_alive()


# -- the clock is read under the queue's lock ------------------------------------------


class PausingClock(FakeClock):
    """A FakeClock that, in one chosen thread, blocks right after one reading.

    The test can then act from other threads exactly where a preemption could
    have let them act.
    """

    def __init__(self) -> None:
        super().__init__()
        self._target: int | None = None
        self.read = threading.Event()
        self.resume = threading.Event()

    def pause_next_read_in(self, ident: int) -> None:
        self._target = ident

    def now(self) -> float:
        value = super().now()
        if self._target is not None and threading.get_ident() == self._target:
            self._target = None
            self.read.set()
            assert self.resume.wait(JOIN)
        return value


def run_paused(clock: PausingClock, fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``fn`` in a thread whose first clock read blocks; wait for that read."""
    out: list[Any] = []

    def body() -> None:
        clock.pause_next_read_in(threading.get_ident())
        try:
            out.append(fn())
        except Exception as exc:  # surfaced to the test
            out.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert clock.read.wait(JOIN)
    return thread, out


def test_a_clock_step_racing_add_after_still_releases_the_key_once_due() -> None:
    clock = PausingClock()
    q: WorkQueue[str] = WorkQueue("race", clock=clock)
    adder, out = run_paused(clock, lambda: q.add_after("k", 1))  # read t=0, paused
    stepper = threading.Thread(target=clock.step, args=(5,))
    stepper.start()
    wait_until(lambda: clock.now() == 5, "the other thread to step the clock")
    clock.resume.set()
    adder.join(JOIN)
    stepper.join(JOIN)
    assert not adder.is_alive()
    assert not stepper.is_alive()
    assert out == [None]
    assert q.stats().delayed == 0, "ready at t=1 but still delayed at t=5"
    assert q.get_nowait() == "k"


def test_a_get_racing_a_step_and_an_add_never_records_a_negative_queue_wait() -> None:
    clock = PausingClock()
    q: WorkQueue[str] = WorkQueue("wait", clock=clock)
    waits: list[float | None] = []
    q.subscribe(lambda e: waits.append(e.duration) if e.kind is EventKind.GET else None)
    getter, out = run_paused(clock, q.get_nowait)  # read t=0, paused

    def produce() -> None:
        clock.step(5)
        q.add("a")  # dirty since t=5

    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: clock.now() == 5, "the producer to step the clock")
    clock.resume.set()
    getter.join(JOIN)
    producer.join(JOIN)
    assert not getter.is_alive()
    assert not producer.is_alive()
    assert len(out) == 1
    got = q.get_nowait() if isinstance(out[0], Empty) else out[0]
    assert got == "a"
    assert waits == [0.0]
    assert q.stats().queue_wait_seconds == 0.0


# -- metrics -----------------------------------------------------------------------


class RecordingProvider:
    """A custom MetricsProvider: keeps what each queue hands it."""

    def __init__(self) -> None:
        self.queues: list[tuple[str, Callable[[], QueueGauges]]] = []

    def new_queue_metrics(self, name: str, gauges: Callable[[], QueueGauges]) -> None:
        self.queues.append((name, gauges))


def test_custom_metrics_provider_gets_gauges_that_read_the_queue_levels(clock: FakeClock) -> None:
    provider = RecordingProvider()
    q: WorkQueue[str] = WorkQueue("levels", clock=clock, metrics=provider)
    ((name, gauges),) = provider.queues
    assert name == "levels"
    assert gauges() == QueueGauges(0, 0, 0.0, 0.0)

    for key in "abcd":
        q.add(key)
    clock.step(1)
    assert q.get_nowait() == "a"  # held since t=1
    clock.step(2)
    assert q.get_nowait() == "b"  # held since t=3
    q.add("a")  # pending redelivery: dirty, not in the FIFO
    q.add_after("x", 100)
    q.add_after("y", 50)
    q.add_after("c", 30)  # waiting and delayed
    clock.step(7)  # t=10

    assert gauges() == QueueGauges(
        depth=3,  # c, d waiting; a pending
        delayed=3,
        unfinished_work_seconds=9.0 + 7.0,
        longest_running_processor_seconds=9.0,
        waiting_by_priority={0: 2},  # c, d
        oldest_wait_seconds=10.0,  # c and d, added at t=0
    )
    assert q.stats().depth == 2

    q.done("a")  # redelivered: waiting now
    clock.step(30)  # t=40: c comes due (already waiting), y and x not yet
    assert gauges() == QueueGauges(
        depth=3,
        delayed=2,
        unfinished_work_seconds=37.0,
        longest_running_processor_seconds=37.0,
        waiting_by_priority={0: 3},
        oldest_wait_seconds=40.0,
    )
    q.shutdown()
    assert gauges().delayed == 0


def test_another_thread_calling_the_queue_while_a_callback_runs_waits_its_turn() -> None:
    q: WorkQueue[str] = WorkQueue("reentry-other")
    in_callback, release = threading.Event(), threading.Event()

    def callback(event: Event[str]) -> None:
        if event.key == "x":
            in_callback.set()
            assert release.wait(5)

    q.subscribe(callback)
    first = threading.Thread(target=q.add, args=("x",))
    first.start()
    assert in_callback.wait(5)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            q.add("y")
        except BaseException as exc:
            errors.append(exc)

    second = threading.Thread(target=other)
    second.start()
    release.set()
    first.join(5)
    second.join(5)
    assert errors == []
    assert len(q) == 2
