"""One behaviour suite, run against every front (DESIGN.md is the contract).

Each test takes the ``front`` fixture (conftest.py) and so runs once per
implementation: ``WorkQueue`` (threading) and ``AsyncWorkQueue`` (asyncio), and
later the Redis backend. Tests build their queues with ``front.make(...)`` and
use only what every front shares: the plain methods, ``await front.get``,
``await front.shutdown`` and ``await front.run_workers``. Nothing here reaches
into private attributes or depends on threads or an event loop; those belong in
fronts/test_threading.py and fronts/test_asyncio.py.

Time passes only through ``keyqueue.testing.FakeClock.step``: no test sleeps for
a delay to pass. The only wall-clock waits are short drain/get timeouts that are
expected to expire, and generous bounds for a runner to reach a state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import math
import queue as stdlib_queue
import threading
import weakref
from dataclasses import astuple
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from keyqueue import (
    AsyncWorkQueue,
    BucketRateLimiter,
    Empty,
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    PermanentError,
    Requeue,
    RunStats,
    ShutDown,
    Stats,
)
from keyqueue._errors import LeaseLost
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.testing import FakeClock

if TYPE_CHECKING:
    from tests.support.fronts import Front

E = EventKind
SHORT = 0.05  # wall seconds for a drain/get that is expected to time out


# -- helpers -----------------------------------------------------------------------


def take_all(q: Any) -> list[Any]:
    """Get and finish every waiting key, in order; stop at Empty or ShutDown."""
    keys = []
    while True:
        try:
            key = q.get_nowait()
        except (Empty, ShutDown):
            return keys
        q.done(key)
        keys.append(key)


def exponential(base: float = 1.0, cap: float = 1000.0) -> ItemExponentialFailureRateLimiter:
    return ItemExponentialFailureRateLimiter(base, cap)


def record(q: Any) -> list[tuple[EventKind, Any, float, float | None]]:
    """Subscribe to ``q``; the list fills with (kind, key, time, duration)."""
    seen: list[tuple[EventKind, Any, float, float | None]] = []

    def on_event(event: Event[Any]) -> None:
        seen.append((event.kind, event.key, event.time, event.duration))

    q.subscribe(on_event)
    return seen


def idle(q: Any) -> bool:
    s = q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


class Key:
    """A small hashable key that can be weakly referenced."""

    __slots__ = ("__weakref__", "name")

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Key({self.name!r})"


def assert_collected(ref: weakref.ref[Any]) -> None:
    gc.collect()
    assert ref() is None, gc.get_referrers(ref()) if ref() is not None else None


def metered(
    front: Front, name: str = "pods", clock: FakeClock | None = None
) -> tuple[Any, CollectorRegistry]:
    """A queue exporting Prometheus metrics to a registry of its own."""
    registry = CollectorRegistry()
    q = front.make(
        name,
        clock=clock or FakeClock(),
        metrics=PrometheusMetrics(registry=registry),
        rate_limiter=exponential(1.0, 100.0),
    )
    return q, registry


def sample(registry: CollectorRegistry, metric: str, name: str = "pods") -> float | None:
    """The value of ``metric`` for the queue called ``name`` (None if not exported)."""
    return registry.get_sample_value(metric, {"name": name})


# -- coalescing --------------------------------------------------------------------


async def test_add_of_a_waiting_key_is_stored_once(front: Front) -> None:
    q = front.make("coalesce")
    q.add("a")
    q.add("a")
    q.add("a")

    assert len(q) == 1
    s = q.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (3, 1, 2, 0)
    assert s.depth == 1
    assert take_all(q) == ["a"]
    with pytest.raises(Empty):
        q.get_nowait()


async def test_the_empty_string_is_a_key_like_any_other(front: Front) -> None:
    q = front.make("empty-key", max_retries=1)
    q.add("")
    q.add("b")
    assert q.get_nowait() == ""
    q.add("")  # marked while held: one redelivery
    q.done("")
    assert take_all(q) == ["b", ""]
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth, s.redeliveries) == (3, 3, 0, 0, 1)


async def test_a_callback_that_calls_its_queue_gets_runtime_error_not_a_deadlock(
    front: Front,
) -> None:
    q = front.make("reentry")
    refused: list[str] = []

    def callback(event: Event[Any]) -> None:
        try:
            q.add("y")
        except RuntimeError as exc:
            refused.append(str(exc))

    q.subscribe(callback)
    q.add("x")  # returns: no deadlock (threading), no transition re-entered (asyncio)

    assert refused
    assert "add() called from a subscribe() callback" in refused[0]
    assert len(q) == 1  # the refused add changed nothing


async def test_distinct_keys_come_out_in_fifo_order(front: Front) -> None:
    q = front.make("fifo")
    for key in ["c", "a", "b", "a", "c", "d"]:
        q.add(key)

    assert len(q) == 4
    assert q.stats().max_depth == 4
    assert take_all(q) == ["c", "a", "b", "d"]


async def test_add_many_is_add_on_each_key_in_order(front: Front) -> None:
    clock = FakeClock()
    q = front.make("add-many", clock=clock)
    events = record(q)
    q.add("b")
    assert q.get_nowait() == "b"

    q.add_many(iter(["c", "a", "b", "a", "d"]))  # any iterable; "b" is held: marked
    q.add_many([], priority=5)  # nothing

    assert take_all(q) == ["c", "a", "d"]
    q.done("b")
    assert take_all(q) == ["b"]
    s = q.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (6, 4, 1, 1)
    kinds = [
        (kind, key)
        for kind, key, *_ in events
        if kind in (E.ENQUEUE, E.COALESCE, E.MARK_WHILE_PROCESSING)
    ]
    assert kinds == [
        (E.ENQUEUE, "b"),
        (E.ENQUEUE, "c"),
        (E.ENQUEUE, "a"),
        (E.MARK_WHILE_PROCESSING, "b"),
        (E.COALESCE, "a"),
        (E.ENQUEUE, "d"),
    ]


async def test_add_many_with_a_priority_hands_those_keys_out_first(front: Front) -> None:
    q = front.make("add-many-priority")
    q.add("low")
    q.add_many(["x", "y"], priority=3)

    assert take_all(q) == ["x", "y", "low"]


@pytest.mark.parametrize(
    ("keys", "priority", "error"),
    [
        ("abc", 0, TypeError),  # a str is one key, not an iterable of keys
        (["a", ["unhashable"]], 0, TypeError),  # checked before "a" is added
        (["a", "b"], "high", TypeError),
        (["a", "b"], 2**31, ValueError),
    ],
)
async def test_add_many_with_bad_input_raises_and_adds_nothing(
    front: Front, keys: Any, priority: Any, error: type[Exception]
) -> None:
    q = front.make("add-many-bad")
    seen = record(q)
    before = q.stats()

    with pytest.raises(error):
        q.add_many(keys, priority=priority)

    assert q.stats() == before
    assert seen == []
    assert len(q) == 0


async def test_any_hashable_can_be_a_key(front: Front) -> None:
    q = front.make("hashable")
    keys: list[Any] = [("default", "pod-1"), 7, frozenset({"x"}), "name"]
    for key in keys:
        q.add(key)
    q.add(("default", "pod-1"))

    assert take_all(q) == keys


async def test_get_with_timeout_on_an_empty_queue_raises_empty(front: Front) -> None:
    q = front.make("empty")
    with pytest.raises(Empty) as info:
        await front.get(q, timeout=0.01)
    assert isinstance(info.value, stdlib_queue.Empty)
    assert isinstance(info.value, asyncio.QueueEmpty)
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().gets == 0


# -- the one-redelivery proof -----------------------------------------------------


async def test_key_added_while_held_is_handed_out_exactly_once_more(front: Front) -> None:
    q = front.make("proof")
    q.add("a")
    assert await front.get(q) == "a"
    for _ in range(5):
        q.add("a")
        with pytest.raises(Empty):  # still held: nobody else may have it
            q.get_nowait()
    assert len(q) == 0

    q.done("a")

    assert len(q) == 1
    assert await front.get(q) == "a"
    with pytest.raises(Empty):
        q.get_nowait()
    q.done("a")
    with pytest.raises(Empty):
        q.get_nowait()
    s = q.stats()
    assert (s.adds, s.enqueued, s.marked_while_processing, s.coalesced) == (6, 1, 1, 4)
    assert (s.redeliveries, s.gets, s.dones, s.processing, s.depth) == (1, 2, 2, 0, 0)


async def test_redelivered_key_queue_wait_runs_from_the_add_while_it_was_held(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("wait", clock=clock)
    events = record(q)
    q.add("a")  # t=0
    clock.step(2)
    assert q.get_nowait() == "a"  # waited 2
    clock.step(1)
    q.add("a")  # t=3: marks the held key; its wait starts here
    clock.step(4)
    q.add("a")  # t=7: coalesced, does not restart the wait
    clock.step(8)
    q.done("a")  # t=15
    clock.step(16)
    assert q.get_nowait() == "a"  # t=31: waited 31 - 3 = 28

    gets = [duration for kind, _, _, duration in events if kind is E.GET]
    assert gets == [2.0, 28.0]
    assert q.stats().queue_wait_seconds == 30.0


async def test_done_without_a_pending_add_does_not_redeliver(front: Front) -> None:
    q = front.make("no-redeliver")
    q.add("a")
    assert q.get_nowait() == "a"
    q.done("a")

    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().redeliveries == 0


# -- per-key exclusion and done ---------------------------------------------------


async def test_held_key_is_not_handed_to_a_second_getter(front: Front) -> None:
    q = front.make("exclusion")
    q.add("a")
    q.add("b")
    assert q.get_nowait() == "a"
    q.add("a")

    assert q.get_nowait() == "b"  # the other key, never "a" twice
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().processing == 2
    q.done("a")
    assert q.get_nowait() == "a"
    q.done("b")
    q.done("a")
    assert q.stats().processing == 0


@pytest.mark.parametrize("case", ["never-added", "already-done", "waiting-not-got"])
async def test_done_of_a_key_not_processing_raises_and_changes_nothing(
    front: Front, case: str
) -> None:
    clock = FakeClock()
    q = front.make("bad-done", clock=clock)
    q.add("held")
    assert q.get_nowait() == "held"
    if case == "already-done":
        q.add("a")
        assert q.get_nowait() == "a"
        q.done("a")
    elif case == "waiting-not-got":
        q.add("a")
    clock.step(1)
    before = q.stats()

    with pytest.raises(ValueError, match="not being processed"):
        q.done("a")

    assert q.stats() == before
    q.done("held")  # the queue still works
    assert take_all(q) == (["a"] if case == "waiting-not-got" else [])


async def test_len_counts_waiting_keys_only(front: Front) -> None:
    clock = FakeClock()
    q = front.make("len", clock=clock)
    q.add("a")
    q.add("b")
    q.add("c")
    assert len(q) == 3
    assert q.get_nowait() == "a"
    assert len(q) == 2  # processing is not counted
    q.add_after("d", 5)
    assert len(q) == 2  # delayed is not counted
    q.add("a")
    assert len(q) == 2  # pending redelivery is not waiting yet
    q.done("a")
    assert len(q) == 3
    clock.step(5)
    assert len(q) == 4
    s = q.stats()
    assert (s.depth, s.processing, s.delayed) == (4, 0, 0)


# -- delays (add_after on a FakeClock) --------------------------------------------


async def test_add_after_is_not_ready_before_its_time_and_ready_right_after_the_step(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("delay", clock=clock)
    q.add_after("a", 5)
    assert q.stats().delayed == 1
    assert len(q) == 0

    clock.step(4.75)
    with pytest.raises(Empty):
        q.get_nowait()
    assert len(q) == 0
    assert q.stats().delayed == 1

    clock.step(0.25)  # exactly at the ready time
    assert len(q) == 1  # released before step returned
    assert q.get_nowait() == "a"
    s = q.stats()
    assert (s.delayed, s.retries, s.adds, s.enqueued) == (0, 1, 1, 1)


async def test_add_after_later_request_for_a_delayed_key_is_ignored(front: Front) -> None:
    clock = FakeClock()
    q = front.make("earliest", clock=clock)
    q.add_after("a", 2)
    q.add_after("a", 5)
    assert q.stats().delayed == 1

    clock.step(2)
    assert q.get_nowait() == "a"
    q.done("a")
    clock.step(10)
    with pytest.raises(Empty):  # the later request left no second entry
        q.get_nowait()


async def test_add_after_earlier_request_replaces_the_later_one(front: Front) -> None:
    clock = FakeClock()
    q = front.make("replace", clock=clock)
    q.add_after("a", 5)
    q.add_after("a", 2)
    assert q.stats().delayed == 1

    clock.step(1.5)
    with pytest.raises(Empty):
        q.get_nowait()
    clock.step(0.5)
    assert q.get_nowait() == "a"
    q.done("a")
    clock.step(3)  # t=5: the replaced entry never fires
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().delayed == 0


async def test_delayed_keys_come_out_in_ready_time_order(front: Front) -> None:
    clock = FakeClock()
    q = front.make("order", clock=clock)
    q.add_after("c", 3)
    q.add_after("a", 1)
    q.add_after("d", 4)
    q.add_after("b", 2)
    q.add("now")

    clock.step(3)
    assert take_all(q) == ["now", "a", "b", "c"]
    clock.step(1)
    assert take_all(q) == ["d"]


async def test_add_after_zero_or_negative_adds_now(front: Front) -> None:
    clock = FakeClock()
    q = front.make("now", clock=clock)
    q.add_after("a", 0)
    q.add_after("b", -3)

    assert len(q) == 2
    s = q.stats()
    assert (s.delayed, s.retries, s.adds, s.enqueued) == (0, 2, 2, 2)
    assert take_all(q) == ["a", "b"]


async def test_delayed_key_fires_once(front: Front) -> None:
    clock = FakeClock()
    q = front.make("once", clock=clock)
    q.add_after("a", 1)
    clock.step(1)
    clock.step(1)
    assert take_all(q) == ["a"]
    clock.step(100)
    assert take_all(q) == []
    assert q.stats().adds == 1


async def test_explicit_add_does_not_cancel_a_pending_delayed_entry(front: Front) -> None:
    clock = FakeClock()
    q = front.make("no-cancel", clock=clock)
    q.add_after("a", 5)
    q.add("a")
    assert take_all(q) == ["a"]
    assert q.stats().delayed == 1

    clock.step(5)
    assert take_all(q) == ["a"]  # the requested future check still happens
    assert q.stats().gets == 2


async def test_delayed_key_coming_due_while_held_is_redelivered_once(front: Front) -> None:
    clock = FakeClock()
    q = front.make("due-held", clock=clock)
    q.add("a")
    q.add_after("a", 1)
    assert q.get_nowait() == "a"
    clock.step(1)
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().marked_while_processing == 1
    q.done("a")
    assert take_all(q) == ["a"]


async def test_delayed_keys_are_dropped_at_shutdown(front: Front) -> None:
    clock = FakeClock()
    q = front.make("drop", clock=clock)
    q.add_after("a", 5)
    q.add_after("b", 1)
    assert q.stats().delayed == 2

    assert await front.shutdown(q)

    assert q.stats().delayed == 0
    clock.step(10)
    with pytest.raises(ShutDown):
        q.get_nowait()
    s = q.stats()
    assert (s.adds, s.depth, s.delayed) == (0, 0, 0)


async def test_add_after_nan_raises_value_error_and_changes_nothing(front: Front) -> None:
    q = front.make("nan", clock=FakeClock())
    before = q.stats()
    with pytest.raises(ValueError, match="nan"):
        q.add_after("a", float("nan"))
    assert q.stats() == before


# -- rate limiting and retries ----------------------------------------------------


async def test_add_rate_limited_backoff_doubles_and_forget_resets(front: Front) -> None:
    clock = FakeClock()
    q = front.make("backoff", clock=clock, rate_limiter=exponential(1.0))

    def ready_after(key: str, delay: float) -> bool:
        """True if ``key`` is not ready just before ``delay`` and ready at it."""
        clock.step(delay - 0.25)
        early = len(q)
        clock.step(0.25)
        return early == 0 and take_all(q) == [key]

    q.add_rate_limited("a")
    assert q.num_requeues("a") == 1
    assert ready_after("a", 1)
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 2
    assert ready_after("a", 2)
    q.add_rate_limited("a")
    assert ready_after("a", 4)
    assert q.num_requeues("b") == 0

    q.forget("a")

    assert q.num_requeues("a") == 0
    q.add_rate_limited("a")
    assert ready_after("a", 1)
    s = q.stats()
    assert (s.retries, s.rate_limited) == (4, 4)


async def test_seed_exercise_max_retries_two(front: Front) -> None:
    clock = FakeClock()
    q = front.make("seed", clock=clock, max_retries=2, rate_limiter=exponential(1.0))
    q.add("a")
    assert await front.get(q) == "a"
    q.add("a")
    with pytest.raises(Empty):  # still in flight
        q.get_nowait()
    q.done("a")
    assert await front.get(q) == "a"

    assert q.retry("a") is True  # first failure: backed off
    assert q.stats().delayed == 1
    assert q.retry("a") is False  # second failure: give up
    assert q.stats().rate_limited == 1  # the give-up did not schedule another try
    q.forget("a")
    q.done("a")
    clock.step(1)
    assert take_all(q) == ["a"]  # the one retry that was scheduled


async def test_max_retries_gives_up_with_a_bare_token_bucket(front: Front) -> None:
    clock = FakeClock()
    q = front.make(
        "bucket", clock=clock, max_retries=2, rate_limiter=BucketRateLimiter(10, 100, clock=clock)
    )
    q.add("a")
    assert q.get_nowait() == "a"

    assert q.retry("a") is True
    assert q.num_requeues("a") == 0  # the bucket keeps no per-key count
    assert q.retry("a") is False
    q.forget("a")
    assert q.retry("a") is True  # forget resets the count the queue keeps


async def test_forget_resets_the_max_retries_count(front: Front) -> None:
    q = front.make("forget", clock=FakeClock(), max_retries=2, rate_limiter=exponential())
    assert q.retry("a") is True
    q.forget("a")
    assert q.retry("a") is True
    assert q.retry("a") is False


async def test_retry_without_max_retries_never_gives_up(front: Front) -> None:
    q = front.make("forever", clock=FakeClock(), rate_limiter=exponential())
    assert all(q.retry("a") for _ in range(20))
    assert q.num_requeues("a") == 20
    assert q.stats().rate_limited == 20


async def test_retries_and_rate_limited_are_counted_on_a_live_queue_only(front: Front) -> None:
    clock = FakeClock()
    q = front.make("counts", clock=clock, rate_limiter=exponential())
    q.add_after("a", 5)
    q.add_after("b", 0)
    q.add_rate_limited("c")
    assert q.retry("d") is True
    q.add("e")
    s = q.stats()
    assert (s.retries, s.rate_limited) == (4, 2)

    assert await front.shutdown(q)
    q.add_after("a", 5)
    q.add_rate_limited("c")
    q.retry("d")

    s = q.stats()
    assert (s.retries, s.rate_limited, s.delayed) == (4, 2, 0)


# -- shutdown ---------------------------------------------------------------------


async def test_add_after_shutdown_is_a_silent_no_op(front: Front) -> None:
    clock = FakeClock()
    q = front.make("late-add", clock=clock)
    assert await front.shutdown(q)
    before = q.stats()

    q.add("a")
    q.add_after("b", 0)
    q.add_after("c", 1)
    q.add_rate_limited("d")
    clock.step(10)

    assert len(q) == 0
    s = q.stats()
    assert s == before
    assert (s.adds, s.enqueued, s.retries) == (0, 0, 0)
    with pytest.raises(ShutDown):
        q.get_nowait()


async def test_waiting_keys_are_handed_out_after_shutdown_then_get_raises_shutdown(
    front: Front,
) -> None:
    q = front.make("hand-out")
    q.add("a")
    q.add("b")
    assert await front.shutdown(q)

    assert q.get_nowait() == "a"
    q.done("a")
    assert await front.get(q) == "b"
    q.done("b")

    with pytest.raises(ShutDown):
        q.get_nowait()
    with pytest.raises(ShutDown):
        await front.get(q)
    with pytest.raises(ShutDown):  # and forever after
        q.get_nowait()


async def test_get_raises_shutdown_while_keys_are_held_if_no_redelivery_is_owed(
    front: Front,
) -> None:
    q = front.make("held-shutdown")
    q.add("a")
    q.add("b")
    assert await front.shutdown(q)
    assert q.shutting_down

    assert await front.get(q) == "a"
    assert q.get_nowait() == "b"
    with pytest.raises(ShutDown):  # both held, neither changed: nothing is owed
        q.get_nowait()
    with pytest.raises(ShutDown):
        await front.get(q)

    q.done("a")
    q.done("b")
    with pytest.raises(ShutDown):
        await front.get(q)
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.redeliveries) == (2, 2, 0, 0)


async def test_key_marked_while_held_is_redelivered_after_shutdown(front: Front) -> None:
    q = front.make("marked-shutdown")
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    assert await front.shutdown(q)

    with pytest.raises(Empty):  # not ShutDown: a change is still owed
        q.get_nowait()
    q.done("a")
    assert await front.get(q) == "a"
    q.done("a")
    with pytest.raises(ShutDown):
        q.get_nowait()
    assert q.stats().redeliveries == 1


async def test_drain_times_out_while_a_key_is_held_and_succeeds_once_it_is_done(
    front: Front,
) -> None:
    q = front.make("drain")
    q.add("a")
    assert q.get_nowait() == "a"

    assert await front.shutdown(q, drain=True, timeout=SHORT) is False
    assert q.shutting_down

    q.done("a")
    assert await front.shutdown(q, drain=True, timeout=5) is True


async def test_drain_waits_for_waiting_and_redelivered_keys(front: Front) -> None:
    q = front.make("drain-waiting")
    q.add("a")
    q.add("b")
    assert q.get_nowait() == "a"
    q.add("a")

    assert await front.shutdown(q, drain=True, timeout=SHORT) is False  # a held, b waiting
    assert q.get_nowait() == "b"
    q.done("b")
    q.done("a")  # redelivered
    assert await front.shutdown(q, drain=True, timeout=SHORT) is False  # a waiting again
    assert take_all(q) == ["a"]
    assert await front.shutdown(q, drain=True, timeout=5) is True


async def test_drain_of_an_idle_queue_returns_true_at_once(front: Front) -> None:
    q = front.make("drain-idle")
    q.add("a")
    take_all(q)
    assert await front.shutdown(q, drain=True, timeout=0) is True
    assert await front.shutdown(q, drain=True, timeout=5) is True
    assert await front.shutdown(q, drain=True) is True


async def test_drain_with_a_negative_timeout_raises_value_error_and_does_not_shut_down(
    front: Front,
) -> None:
    q = front.make("drain-negative")
    q.add("a")

    with pytest.raises(ValueError, match="timeout"):
        await front.shutdown(q, drain=True, timeout=-1)

    assert q.shutting_down is False
    assert take_all(q) == ["a"]


# -- join, and a drain that loses no key ---------------------------------------------

JOINED = 10.0  # wall seconds a join woken by a transition is given to return


async def until_shut_down(q: Any) -> None:
    """Wait (bounded) until a drain started in a task or thread has shut ``q`` down."""
    for _ in range(int(JOINED / 0.001)):
        if q.shutting_down:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the drain did not start")


async def test_join_of_an_idle_queue_returns_true_at_once(front: Front) -> None:
    q = front.make("join-idle")
    assert await front.join(q, 0) is True
    q.add("a")
    assert await front.join(q, 0) is False
    assert take_all(q) == ["a"]
    assert await front.join(q, 0) is True
    assert await front.join(q) is True  # no timeout: returns at once all the same


async def test_join_waits_until_nothing_waits_is_held_or_is_delayed(front: Front) -> None:
    clock = FakeClock()
    q = front.make("join-states", clock=clock)
    q.add("a")
    q.add_after("b", 5)

    assert await front.join(q, SHORT) is False  # a waits, b is delayed
    assert q.get_nowait() == "a"
    assert await front.join(q, SHORT) is False  # a is held
    q.add("a")
    q.done("a")
    assert await front.join(q, SHORT) is False  # a redelivered: waiting again
    assert take_all(q) == ["a"]
    assert await front.join(q, SHORT) is False  # b is still delayed
    clock.step(5)
    assert await front.join(q, SHORT) is False  # b waits now
    assert take_all(q) == ["b"]
    assert await front.join(q, 0) is True
    assert q.shutting_down is False  # join does not shut the queue down
    q.add("c")
    assert await front.join(q, 0) is False


async def test_join_is_woken_by_the_done_that_leaves_the_queue_idle(front: Front) -> None:
    q = front.make("join-wake")
    q.add("a")
    q.add("b")
    assert q.get_nowait() == "a"
    assert q.get_nowait() == "b"
    joining = asyncio.create_task(front.join(q, 60 * JOINED))
    await asyncio.sleep(SHORT)
    assert not joining.done()
    q.done("a")
    await asyncio.sleep(SHORT)
    assert not joining.done()  # b is still held

    q.done("b")
    # Woken by that done, not by its timeout (which is far beyond this bound).
    assert await asyncio.wait_for(joining, JOINED) is True


async def test_join_with_a_bad_timeout_raises(front: Front) -> None:
    q = front.make("join-bad")
    with pytest.raises(ValueError, match="timeout"):
        await front.join(q, -1)
    with pytest.raises(TypeError, match="timeout"):
        await front.join(q, True)  # type: ignore[arg-type]


async def test_a_key_failing_during_a_drain_is_never_given_up(front: Front) -> None:
    # The documented choice per queue: in memory, the drain retries it after its
    # backoff and waits for it; on Redis (shutdown is per client) it stays on the
    # server, backing off, for the other clients or the next start.
    clock = FakeClock()
    q = front.make("drain-fail", clock=clock, max_retries=5, rate_limiter=exponential(1.0))
    q.add_many(["a", "b", "c"])
    assert q.get_nowait() == "a"
    assert q.get_nowait() == "b"
    drain = asyncio.create_task(front.drain(q, timeout=JOINED))
    await until_shut_down(q)

    assert q.retry("a") is True  # a failed during the drain: it comes back
    q.done("a")
    q.forget("b")
    q.done("b")
    assert q.stats().delayed == 1  # a, backing off: kept, not dropped

    if front.per_client_shutdown:
        assert await asyncio.wait_for(drain, JOINED) is True  # this client holds nothing
        s = q.stats()
        assert (s.depth, s.delayed, s.processing) == (1, 1, 0)  # c waits, a backs off
        after = front.make("drain-fail", clock=clock, rate_limiter=exponential(1.0))  # next start
        assert take_all(after) == ["c"]
        clock.step(1.0)
        assert take_all(after) == ["a"]
        assert await front.join(after, JOINED) is True
    else:
        assert take_all(q) == ["c"]  # still handed out: the queue drains
        await asyncio.sleep(SHORT)
        assert not drain.done()  # a backs off: the drain waits for it
        with pytest.raises(Empty):  # not ShutDown: a is still to come
            q.get_nowait()
        clock.step(1.0)
        assert take_all(q) == ["a"]
        assert await asyncio.wait_for(drain, JOINED) is True
        with pytest.raises(ShutDown):
            q.get_nowait()
    s = q.stats()
    assert (s.retries, s.rate_limited) == (1, 1)


async def test_a_drain_keeps_keys_backing_off_and_takes_held_keys_backoffs(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    q = front.make("drain-keeps", clock=clock, rate_limiter=exponential(1.0))
    q.add_many(["a", "held"])
    assert q.get_nowait() == "a"
    assert q.retry("a") is True  # failed before the drain: backing off 1 s
    q.done("a")
    q.add_after("later", 300)  # a look scheduled for later (Requeue(after=300))
    assert q.get_nowait() == "held"
    # Until the test ends: the drain's thread logs after it marks the queue
    # shut down, and its shutdown call has surely logged only once it returned.
    caplog.set_level(logging.INFO, logger="keyqueue")
    drain = asyncio.create_task(front.drain(q, timeout=JOINED))
    await until_shut_down(q)
    q.add_rate_limited("held")  # the holder's Requeue(): taken, as its retry would be
    q.add_after("held", 5)  # Requeue(after=5) while draining: a no-op, as any add
    q.add("new")  # new work: a no-op
    q.done("held")

    if front.per_client_shutdown:  # the queue outlives the client: everything stays
        assert await asyncio.wait_for(drain, JOINED) is True
        assert sorted(d.key for d in q.snapshot().delayed) == ["a", "held", "later"]
        assert len(q) == 1  # "new"
        return
    assert sorted(d.key for d in q.snapshot().delayed) == ["a", "held"]
    clock.step(1.0)
    assert take_all(q) == ["a", "held"]
    assert await asyncio.wait_for(drain, JOINED) is True
    infos = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(infos) == 1, infos
    assert "dropped 1 delayed key(s)" in infos[0]
    s = q.stats()
    assert (s.adds, s.retries, s.rate_limited, s.delayed) == (4, 3, 2, 0)


async def test_a_drain_that_times_out_leaves_the_unfinished_keys_queued_with_a_warning(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    q = front.make("drain-late", clock=clock, max_retries=5, rate_limiter=exponential(1.0))
    q.add_many(["a", "b"])
    assert q.get_nowait() == "a"

    with caplog.at_level(logging.WARNING, logger="keyqueue"):
        if front.per_client_shutdown:
            # The drain waits for this client's hold of a, which outlasts it.
            assert await front.drain(q, timeout=SHORT) is False
            assert q.retry("a") is True  # then a fails: backing off, on the server
            q.done("a")
        else:
            drain = asyncio.create_task(front.drain(q, timeout=0.5))
            await until_shut_down(q)
            assert q.retry("a") is True  # a fails during the drain...
            q.done("a")
            assert take_all(q) == ["b"]
            # ...and its backoff (1 s on a clock that does not move) outlasts the drain.
            assert await asyncio.wait_for(drain, JOINED) is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "drain timed out" in warnings[0]
    assert "left queued, not given up" in warnings[0]
    assert "giving up" not in caplog.text

    # Nothing was lost: a (backing off) and, on Redis, b (waiting) are still queued.
    s = q.stats()
    assert (s.delayed, s.processing) == (1, 0)
    assert [d.key for d in q.snapshot().delayed] == ["a"]
    if front.per_client_shutdown:
        assert s.depth == 1
        q = front.make("drain-late", clock=clock, rate_limiter=exponential(1.0))  # next start
        assert take_all(q) == ["b"]
    clock.step(1.0)
    assert take_all(q) == ["a"]  # the queue goes on with it (in memory: still draining)
    assert await front.join(q, JOINED) is True


async def test_runner_drain_handles_every_keys_final_version_and_gives_none_up(
    front: Front,
) -> None:
    # Every key's final version is handled, also for keys that fail during the
    # drain: none is given up ("cannot retry, giving up").
    limiter = exponential(0.001, 0.001)  # a real clock: the drain waits out each backoff
    q = front.make("drain-33", max_retries=5, rate_limiter=limiter)
    keys = [f"k{i}" for i in range(33)]
    latest = dict.fromkeys(keys, 1)
    q.add_many(keys)
    for key in keys[::2]:
        latest[key] = 2
        q.add(key)  # a newer version of a waiting key: coalesced
    failed: set[str] = set()
    handled: dict[str, int] = {}
    given_up: list[Any] = []

    def handler(key: str) -> None:
        if int(key[1:]) % 3 == 0 and key not in failed:
            failed.add(key)
            raise RuntimeError(f"{key}: first try fails")
        handled[key] = latest[key]

    def give_up(key: Any, exc: BaseException) -> None:
        given_up.append(key)

    # The drain starts as the workers do: the failures happen during it.
    stats = await front.run_workers(q, handler, workers=4, on_give_up=give_up, until=lambda: True)
    if front.per_client_shutdown:  # the keys this client left stay on the server
        after = front.make("drain-33", max_retries=5, rate_limiter=limiter)  # the next start
        more = await front.run_workers(after, handler, workers=4, on_give_up=give_up)
        stats = RunStats(*(a + b for a, b in zip(astuple(stats), astuple(more), strict=True)))

    assert handled == latest  # every key's final version
    assert given_up == []
    assert failed == {k for k in keys if int(k[1:]) % 3 == 0}
    assert (stats.succeeded, stats.retried, stats.gave_up) == (33, 11, 0)


@pytest.mark.parametrize("drain", ["yes", 1, 0, None])
async def test_shutdown_with_a_drain_that_is_not_a_bool_raises_type_error_and_changes_nothing(
    front: Front, drain: Any
) -> None:
    q = front.make("drain-type")
    q.add("a")

    with pytest.raises(TypeError, match="drain"):
        await front.shutdown(q, drain=drain, timeout=SHORT)  # a truthy "yes" would drain

    assert q.shutting_down is False
    assert take_all(q) == ["a"]


async def test_shutting_down_flag_and_a_second_shutdown(front: Front) -> None:
    q = front.make("twice")
    assert q.shutting_down is False
    assert q.stats().shutting_down is False

    assert await front.shutdown(q) is True
    assert q.shutting_down is True
    assert q.stats().shutting_down is True

    assert await front.shutdown(q) is True  # twice is fine
    assert q.shutting_down is True
    with pytest.raises(ShutDown):
        q.get_nowait()


async def test_repeated_shutdown_emits_one_shutdown_event_and_keeps_waiting_keys(
    front: Front,
) -> None:
    q = front.make("idempotent")
    events = record(q)
    q.add("a")

    assert await front.shutdown(q) is True
    assert await front.shutdown(q) is True
    assert await front.shutdown(q, drain=False) is True

    assert q.shutting_down
    assert [kind for kind, *_ in events].count(E.SHUTDOWN) == 1
    assert q.get_nowait() == "a"  # the later shutdowns did not drop it
    q.done("a")
    assert await front.shutdown(q, drain=True, timeout=5) is True


# -- events -----------------------------------------------------------------------


async def test_events_of_the_one_redelivery_proof_in_order(front: Front) -> None:
    q = front.make("events", clock=FakeClock())
    events = record(q)
    q.add("a")
    q.get_nowait()
    q.add("a")
    q.add("a")
    q.done("a")
    q.get_nowait()
    q.done("a")
    await front.shutdown(q)

    assert [(kind, key) for kind, key, _, _ in events] == [
        (E.ENQUEUE, "a"),
        (E.GET, "a"),
        (E.MARK_WHILE_PROCESSING, "a"),
        (E.COALESCE, "a"),
        (E.DONE, "a"),
        (E.REDELIVER, "a"),
        (E.GET, "a"),
        (E.DONE, "a"),
        (E.SHUTDOWN, None),
    ]


async def test_event_times_and_durations_on_a_fake_clock(front: Front) -> None:
    clock = FakeClock(100.0)
    q = front.make("durations", clock=clock, rate_limiter=exponential(0.25))
    events = record(q)
    q.add("a")  # t=100
    clock.step(3)
    q.get_nowait()  # t=103: waited 3
    clock.step(2)
    q.done("a")  # t=105: worked 2
    q.add_rate_limited("b")  # backoff 0.25
    q.add_rate_limited("b")  # backoff 0.5
    q.add_after("c", 7)

    assert events == [
        (E.ENQUEUE, "a", 100.0, None),
        (E.GET, "a", 103.0, 3.0),
        (E.DONE, "a", 105.0, 2.0),
        (E.RATE_LIMIT, "b", 105.0, 0.25),
        (E.RATE_LIMIT, "b", 105.0, 0.5),
        (E.DELAY, "c", 105.0, 7.0),
    ]


async def test_event_times_and_durations_of_a_redelivery_on_a_fake_clock(front: Front) -> None:
    clock = FakeClock()
    q = front.make("redelivery-times", clock=clock)
    events = record(q)
    q.add("a")  # t=0
    clock.step(1)
    assert q.get_nowait() == "a"  # t=1: waited 1
    q.add("a")  # marks the held key: the redelivery's wait starts here
    q.add("a")
    q.add("a")
    clock.step(2)
    q.done("a")  # t=3: held 2
    assert q.get_nowait() == "a"  # waited from the add while held (1) to 3

    assert events == [
        (E.ENQUEUE, "a", 0.0, None),
        (E.GET, "a", 1.0, 1.0),
        (E.MARK_WHILE_PROCESSING, "a", 1.0, None),
        (E.COALESCE, "a", 1.0, None),
        (E.COALESCE, "a", 1.0, None),
        (E.DONE, "a", 3.0, 2.0),
        (E.REDELIVER, "a", 3.0, None),
        (E.GET, "a", 3.0, 2.0),
    ]


async def test_delayed_key_coming_due_is_an_enqueue_at_its_ready_time(front: Front) -> None:
    clock = FakeClock()
    q = front.make("due-event", clock=clock)
    events = record(q)
    q.add_after("a", 2)
    clock.step(5)
    q.get_nowait()

    assert events == [
        (E.DELAY, "a", 0.0, 2.0),
        (E.ENQUEUE, "a", 5.0, None),
        (E.GET, "a", 5.0, 0.0),
    ]


async def test_unsubscribe_stops_events(front: Front) -> None:
    q = front.make("unsubscribe")
    seen: list[EventKind] = []
    unsubscribe = q.subscribe(lambda event: seen.append(event.kind))
    q.add("a")
    unsubscribe()
    q.add("a")
    q.get_nowait()
    q.done("a")
    unsubscribe()  # twice is harmless

    assert seen == [E.ENQUEUE]
    assert q.stats().gets == 1


async def test_unsubscribing_one_subscriber_keeps_delivering_to_the_others(
    front: Front,
) -> None:
    q = front.make("unsubscribe-one")
    kept: list[Event[Any]] = []
    dropped: list[Event[Any]] = []
    q.subscribe(kept.append)
    unsubscribe = q.subscribe(dropped.append)
    q.add("a")
    unsubscribe()
    unsubscribe()  # twice is harmless
    q.add("b")

    assert [e.key for e in kept] == ["a", "b"]
    assert [e.key for e in dropped] == ["a"]


async def test_subscribe_rejects_a_non_callable(front: Front) -> None:
    q = front.make("not-callable")
    with pytest.raises(TypeError, match="callable"):
        q.subscribe("not callable")


async def test_raising_subscriber_leaves_the_queue_consistent(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    q = front.make("raising")

    def broken(event: Event[Any]) -> None:
        raise RuntimeError("subscriber bug")

    q.subscribe(broken)
    events = record(q)
    with caplog.at_level(logging.ERROR, logger="keyqueue"):
        q.add("a")
        assert q.get_nowait() == "a"
        q.add("a")
        q.done("a")
        assert q.get_nowait() == "a"
        q.done("a")

    assert [kind for kind, *_ in events] == [
        E.ENQUEUE,
        E.GET,
        E.MARK_WHILE_PROCESSING,
        E.DONE,
        E.REDELIVER,
        E.GET,
        E.DONE,
    ]
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth, s.redeliveries) == (2, 2, 0, 0, 1)
    assert any(
        r.exc_info is not None and "subscriber bug" in str(r.exc_info[1]) for r in caplog.records
    )


# -- the runner -------------------------------------------------------------------


async def test_runner_success_forgets_the_key(front: Front) -> None:
    limiter = exponential()
    q = front.make("run-ok", clock=FakeClock(), rate_limiter=limiter)
    limiter.when("a")
    limiter.when("a")
    assert q.num_requeues("a") == 2
    handled: list[Any] = []
    q.add("a")

    await front.run_workers(q, handled.append)

    assert handled == ["a"]
    assert q.num_requeues("a") == 0
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries) == (1, 1, 0, 0)


async def test_runner_handles_every_key_once_and_always_calls_done(front: Front) -> None:
    q = front.make("run-many")
    handled: list[Any] = []
    keys = [f"k{i}" for i in range(30)]
    for key in keys:
        q.add(key)

    await front.run_workers(q, handled.append, workers=3)

    assert sorted(handled) == sorted(keys)
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth) == (30, 30, 0, 0)


async def test_runner_requeue_after_brings_the_key_back_only_after_the_step(
    front: Front,
) -> None:
    clock = FakeClock()
    limiter = exponential()
    q = front.make("run-requeue", clock=clock, rate_limiter=limiter)
    limiter.when("a")  # a failure on record, forgotten by the Requeue
    events = record(q)
    calls: list[float] = []

    def handler(key: Any) -> Requeue | None:
        calls.append(clock.now())
        return Requeue(after=5) if len(calls) == 1 else None

    seen: dict[str, Any] = {}

    def until() -> bool:
        s = q.stats()
        if "stepped" not in seen and s.delayed == 1 and s.processing == 0:
            seen["requeues"] = q.num_requeues("a")
            clock.step(4.75)
            early = q.stats()
            seen["early"] = (len(calls), early.delayed, early.depth)
            clock.step(0.25)
            seen["stepped"] = True
        return len(calls) == 2 and idle(q)

    q.add("a")
    await front.run_workers(q, handler, until=until)

    assert seen["requeues"] == 0  # Requeue forgot the failure on record
    assert seen["early"] == (1, 1, 0)  # at t=4.75 still delayed, not handled again
    assert calls == [0.0, 5.0]
    assert [(key, duration) for kind, key, _, duration in events if kind is E.DELAY] == [("a", 5)]
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries, s.rate_limited) == (2, 2, 0, 1, 0)


async def test_runner_requeue_after_zero_redelivers_once_the_handler_is_done(front: Front) -> None:
    q = front.make("run-requeue-now", clock=FakeClock())
    calls: list[Any] = []

    def handler(key: Any) -> Requeue | None:
        calls.append(key)
        return Requeue(after=0) if len(calls) == 1 else None

    q.add("a")
    await front.run_workers(q, handler)

    assert calls == ["a", "a"]
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.redeliveries, s.marked_while_processing) == (
        2,
        2,
        0,
        1,
        1,
    )


async def test_runner_permanent_error_is_not_retried_and_not_given_up(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = ItemFastSlowRateLimiter(0, 0, 1)  # were it retried, it would end, not hang
    q = front.make("run-permanent", rate_limiter=limiter, max_retries=3)
    limiter.when("a")
    calls: list[Any] = []
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        calls.append(key)
        raise PermanentError("cannot ever work")

    q.add("a")
    await front.run_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e)))

    assert calls == ["a"]
    assert given_up == []
    assert q.num_requeues("a") == 0
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries, s.delayed) == (1, 1, 0, 0, 0)
    assert "cannot ever work" in caplog.text  # logged, since nobody is told otherwise


async def test_runner_error_retries_until_max_retries_then_gives_up_once(front: Front) -> None:
    q = front.make("run-give-up", rate_limiter=ItemFastSlowRateLimiter(0, 0, 1), max_retries=3)
    raised: list[BaseException] = []
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        exc = RuntimeError(f"attempt {len(raised) + 1}")
        raised.append(exc)
        raise exc

    q.add("a")
    await front.run_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e)))

    assert len(raised) == 3
    assert len(given_up) == 1
    assert given_up[0][0] == "a"
    assert given_up[0][1] is raised[-1]
    assert q.num_requeues("a") == 0  # forgotten after giving up
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries, s.rate_limited) == (3, 3, 0, 2, 2)


async def test_runner_error_is_retried_only_after_each_backoff_then_given_up(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("run-backoff", clock=clock, max_retries=3, rate_limiter=exponential(1.0, 100.0))
    events = record(q)
    raised: list[Exception] = []
    given_up: list[tuple[Any, BaseException]] = []
    seen: dict[str, Any] = {}

    def handler(key: Any) -> None:
        exc = ValueError(f"attempt {len(raised) + 1}")
        raised.append(exc)
        raise exc

    def backing_off(attempts: int) -> bool:
        s = q.stats()
        return len(raised) == attempts and s.delayed == 1 and s.processing == 0

    def until() -> bool:
        if "first" not in seen and backing_off(1):
            seen["first"] = q.num_requeues("a")
            clock.step(0.5)
            seen["at 0.5"] = len(raised)  # the backoff of 1 s is not over yet
            clock.step(0.5)
        if "second" not in seen and backing_off(2):
            seen["second"] = q.num_requeues("a")
            seen["backoffs"] = [d for kind, _, _, d in events if kind is E.RATE_LIMIT]
            clock.step(1.5)
            seen["at 2.5"] = len(raised)  # the backoff of 2 s is not over yet
            clock.step(0.5)
        return len(given_up) == 1 and idle(q)

    q.add("a")
    await front.run_workers(
        q, handler, workers=2, on_give_up=lambda k, e: given_up.append((k, e)), until=until
    )

    assert (seen["first"], seen["at 0.5"]) == (1, 1)
    assert (seen["second"], seen["at 2.5"]) == (2, 2)
    assert seen["backoffs"] == [1.0, 2.0]
    assert len(raised) == 3
    assert len(given_up) == 1
    assert given_up[0][0] == "a"
    assert given_up[0][1] is raised[-1]
    assert q.num_requeues("a") == 0  # forgotten after giving up
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries, s.rate_limited) == (3, 3, 0, 2, 2)


async def test_runner_gives_up_on_each_key_separately(front: Front) -> None:
    q = front.make("run-give-up-keys", rate_limiter=ItemFastSlowRateLimiter(0, 0, 1), max_retries=2)
    attempts: dict[Any, int] = {}
    given_up: list[Any] = []

    def handler(key: Any) -> None:
        attempts[key] = attempts.get(key, 0) + 1
        if key == "flaky" and attempts[key] == 2:
            return
        raise RuntimeError(key)

    q.add("bad")
    q.add("flaky")
    await front.run_workers(q, handler, workers=2, on_give_up=lambda k, e: given_up.append(k))

    assert attempts == {"bad": 2, "flaky": 2}
    assert given_up == ["bad"]
    s = q.stats()
    assert (s.gets, s.dones, s.processing) == (4, 4, 0)  # one get and one done per attempt


async def test_runner_handler_returning_something_else_counts_as_a_failure(
    front: Front,
) -> None:
    q = front.make("run-odd", clock=FakeClock(), max_retries=1)
    given_up: list[tuple[Any, BaseException]] = []
    q.add("a")

    await front.run_workers(q, lambda key: "ok", on_give_up=lambda k, e: given_up.append((k, e)))

    assert len(given_up) == 1
    assert given_up[0][0] == "a"
    assert isinstance(given_up[0][1], TypeError)
    s = q.stats()
    assert (s.gets, s.dones, s.processing) == (1, 1, 0)


async def test_runner_raising_on_give_up_does_not_stop_the_workers(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    q = front.make("run-give-up-bug", clock=FakeClock(), max_retries=1)
    calls: list[Any] = []

    def handler(key: Any) -> None:
        calls.append(key)
        raise ValueError(key)

    def on_give_up(key: Any, exc: BaseException) -> None:
        raise RuntimeError("on_give_up bug")

    for key in ("a", "b", "c"):
        q.add(key)
    await front.run_workers(q, handler, on_give_up=on_give_up)

    assert calls == ["a", "b", "c"]
    assert "on_give_up bug" in caplog.text
    s = q.stats()
    assert (s.gets, s.dones, s.processing) == (3, 3, 0)


async def test_runner_calls_done_for_every_key_whatever_the_outcome(front: Front) -> None:
    q = front.make("run-mixed", clock=FakeClock(), max_retries=1)

    def handler(key: int) -> Requeue | None:
        match key % 4:
            case 0:
                return None
            case 1:
                return Requeue(after=1)  # stays delayed: the clock is never stepped
            case 2:
                raise PermanentError(str(key))
            case _:
                raise ValueError(key)

    def until() -> bool:
        s = q.stats()
        return s.gets == 40 and s.processing == 0 and s.depth == 0

    for key in range(40):
        q.add(key)
    stats = await front.run_workers(q, handler, workers=4, until=until)

    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth) == (40, 40, 0, 0)
    assert s.delayed == 0  # the ten Requeue(after=1) keys were dropped at shutdown
    assert stats == RunStats(processed=40, succeeded=10, requeued=10, permanent=10, gave_up=10)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
async def test_runner_invalid_worker_count_raises_value_error(front: Front, workers: Any) -> None:
    q = front.make("run-bad-workers")
    with pytest.raises(ValueError, match="workers"):
        await front.run_workers(q, lambda key: None, workers=workers)
    assert q.stats().gets == 0


async def test_runner_non_callable_handler_raises_type_error(front: Front) -> None:
    q = front.make("run-bad-handler")
    with pytest.raises(TypeError, match="handler"):
        await front.run_workers(q, "nope")  # type: ignore[arg-type]
    assert q.stats().gets == 0


async def test_runner_requeue_without_after_backs_off_and_is_not_a_failure(front: Front) -> None:
    clock = FakeClock()
    q = front.make("run-requeue-backoff", clock=clock, max_retries=2, rate_limiter=exponential())
    events = record(q)
    calls: list[float] = []
    given_up: list[Any] = []

    def handler(key: Any) -> Requeue | None:
        calls.append(clock.now())
        return Requeue() if len(calls) <= 3 else None

    def until() -> bool:
        s = q.stats()
        if s.delayed == 1 and s.processing == 0:
            clock.step(0.5)  # half a second at a time: a key let out early shows in calls
        return len(calls) == 4 and idle(q)

    q.add("a")
    stats = await front.run_workers(
        q, handler, on_give_up=lambda k, e: given_up.append(k), until=until
    )

    assert calls == [0.0, 1.0, 3.0, 7.0]  # backoff 1, 2, 4 s: as add_rate_limited
    assert [d for kind, _, _, d in events if kind is E.RATE_LIMIT] == [1.0, 2.0, 4.0]
    assert given_up == []  # three requeues with max_retries=2: none was a failure
    assert q.num_requeues("a") == 0  # the success forgot the backoff
    s = q.stats()
    assert (s.gets, s.dones, s.retries, s.rate_limited) == (4, 4, 3, 3)
    assert stats == RunStats(processed=4, succeeded=1, requeued=3)


async def test_retry_while_shutting_down_returns_false_and_adds_nothing(front: Front) -> None:
    q = front.make("retry-shut", clock=FakeClock(), max_retries=3, rate_limiter=exponential())
    q.add("a")
    key = await front.get(q)
    await front.shutdown(q)

    assert q.retry(key) is False  # the re-add would be a no-op: say it will not be retried
    assert q.num_requeues(key) == 0
    q.done(key)
    s = q.stats()
    assert (s.retries, s.rate_limited, s.delayed, s.depth) == (0, 0, 0, 0)


def run_now(step: Any) -> Any:
    """Run a coroutine that never suspends (``front.shutdown`` without drain) to its end,
    here and now: a plain function (a rate limiter's ``when``) can call it."""
    try:
        step.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


class _ShutsDownWhenAsked:
    """A rate limiter whose ``when`` shuts the queue down: the shutdown lands after
    ``retry`` started and before its re-add, deterministically."""

    def __init__(self, front: Front) -> None:
        self.front, self.q, self.asked = front, None, 0

    def when(self, key: Any) -> float:
        self.asked += 1
        assert run_now(self.front.shutdown(self.q))
        return 1.0

    def forget(self, key: Any) -> None:
        pass

    def num_requeues(self, key: Any) -> int:
        return 0


async def test_retry_whose_re_add_meets_a_shutdown_gives_the_key_up_instead_of_losing_it(
    front: Front,
) -> None:
    limiter = _ShutsDownWhenAsked(front)
    q = front.make("retry-meets-shutdown", clock=FakeClock(), max_retries=3, rate_limiter=limiter)
    limiter.q = q
    q.add("a")
    key = await front.get(q)

    assert q.retry(key) is False  # shut down after the limiter was asked: cannot come back
    assert (limiter.asked, q.shutting_down) == (1, True)
    q.done(key)
    s = q.stats()
    assert (s.retries, s.rate_limited, s.delayed, s.depth) == (0, 0, 0, 0)
    with pytest.raises(ShutDown):
        q.get_nowait()


async def test_runner_failure_whose_retry_meets_a_shutdown_is_given_up_with_a_warning(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = _ShutsDownWhenAsked(front)
    q = front.make("run-retry-meets-shutdown", clock=FakeClock(), rate_limiter=limiter)
    limiter.q = q
    boom = RuntimeError("failed just before shutdown")
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        raise boom

    q.add("a")
    stats = await front.run_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e)))

    assert given_up == [("a", boom)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'a'" in m and "shutting down" in m for m in warnings), warnings
    assert stats == RunStats(processed=1, gave_up=1)


class _Answers:
    """A rate limiter that answers what it is told to (NaN included)."""

    def __init__(self, delay: Any) -> None:
        self.delay = delay

    def when(self, key: Any) -> float:
        return self.delay  # type: ignore[no-any-return]

    def forget(self, key: Any) -> None:
        pass

    def num_requeues(self, key: Any) -> int:
        return 0


@pytest.mark.parametrize(("delay", "error"), [(math.nan, ValueError), ("1", TypeError)])
async def test_retry_whose_limiter_answers_no_number_raises_and_counts_no_failure(
    front: Front, delay: Any, error: type[Exception]
) -> None:
    limiter = _Answers(delay)
    q = front.make("retry-bad-delay", clock=FakeClock(), max_retries=2, rate_limiter=limiter)
    q.add("a")
    key = await front.get(q)

    with pytest.raises(error, match="delay"):
        q.retry(key)
    limiter.delay = 1.0
    assert q.retry(key) is True  # still the first failure: the one that raised did not count
    assert q.retry(key) is False
    s = q.stats()
    assert (s.retries, s.rate_limited, s.delayed) == (1, 1, 1)


async def test_retry_of_a_key_re_added_while_held_during_shutdown_is_true_and_redelivers_it(
    front: Front,
) -> None:
    q = front.make("retry-dirty-shut", clock=FakeClock(), max_retries=2, rate_limiter=exponential())
    q.add("a")
    key = await front.get(q)
    q.add("a")  # changed while held: owed one redelivery, shutdown or not
    await front.shutdown(q)

    assert q.retry(key) is True  # it comes back anyway: not given up
    assert q.num_requeues(key) == 0  # no backoff asked: the redelivery is at once
    q.done(key)
    assert await front.get(q) == "a"
    assert q.retry("a") is False  # the second failure (max_retries=2), and nothing owed
    q.done("a")
    s = q.stats()
    assert (s.gets, s.redeliveries, s.retries, s.rate_limited, s.delayed) == (2, 1, 0, 0, 0)
    with pytest.raises(ShutDown):
        q.get_nowait()


async def test_runner_failure_of_a_key_re_added_while_held_at_shutdown_is_retried_not_given_up(
    front: Front,
) -> None:
    q = front.make("run-dirty-shut", clock=FakeClock(), max_retries=5)
    boom = RuntimeError("failed with a change pending")
    calls: list[Any] = []
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        calls.append(key)
        if len(calls) == 1:
            q.add(key)  # a change arrives while it is held...
            assert run_now(front.shutdown(q))  # ...then the queue shuts down
            raise boom

    q.add("a")
    stats = await front.run_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e)))

    assert calls == ["a", "a"]  # redelivered for the change that arrived
    assert given_up == []
    s = q.stats()
    assert (s.gets, s.dones, s.redeliveries, s.processing) == (2, 2, 1, 0)
    assert stats == RunStats(processed=2, retried=1, succeeded=1)


async def test_runner_failure_while_shutting_down_is_given_up_with_a_warning(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    q = front.make("run-fail-at-shutdown", clock=FakeClock(), max_retries=5)
    boom = RuntimeError("failed during shutdown")
    given_up: list[tuple[Any, BaseException]] = []

    def handler(key: Any) -> None:
        raise boom

    q.add("a")
    await front.shutdown(q)  # "a" was waiting: it is still handed out
    stats = await front.run_workers(q, handler, on_give_up=lambda k, e: given_up.append((k, e)))

    assert given_up == [("a", boom)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'a'" in m and "shutting down" in m for m in warnings), warnings
    assert not any("too often" in m for m in warnings)
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.retries) == (1, 1, 0, 0)
    assert stats == RunStats(processed=1, gave_up=1)


class _LimiterBrokenFor:
    """A rate limiter with a bug for two keys: NaN for "nan", an exception for "raise"."""

    def when(self, key: Any) -> float:
        if key == "nan":
            return math.nan
        if key == "raise":
            raise RuntimeError("limiter bug")
        return 0.0

    def forget(self, key: Any) -> None:
        pass

    def num_requeues(self, key: Any) -> int:
        return 0


async def test_runner_goes_on_when_the_rate_limiter_fails_for_one_key(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    q = front.make("run-limiter-bug", rate_limiter=_LimiterBrokenFor())
    calls: list[Any] = []

    def handler(key: Any) -> None:
        calls.append(key)
        if calls.count(key) == 1:
            raise ValueError(f"{key} not ready yet")

    for key in ("before", "nan", "raise", "after"):
        q.add(key)
    stats = await front.run_workers(q, handler)

    # "nan" and "raise" could not be retried: logged and dropped; the others went on
    assert calls == ["before", "nan", "raise", "after", "before", "after"]
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert ["'nan'" in r.getMessage() for r in logged] == [True, False]
    assert ["'raise'" in r.getMessage() for r in logged] == [False, True]
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth) == (6, 6, 0, 0)
    assert stats == RunStats(processed=6, succeeded=2, retried=2, errors=2)


class _Faulty:
    """A queue whose ``method`` raises ``error`` for ``key``: ``done`` after releasing
    it (as a holder whose lease had expired: its late done changed nothing), any
    other method instead of running. Everything else goes to the queue."""

    def __init__(self, q: Any, method: str, key: Any, error: type[Exception]) -> None:
        self._q, self._method, self._key, self._error = q, method, key, error

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._q, name)
        if name != self._method:
            return real

        def faulty(key: Any) -> Any:
            if key != self._key:
                return real(key)
            if name == "done":
                real(key)
            raise self._error(f"{name}({key!r}) failed")

        return faulty


@pytest.mark.parametrize(
    ("method", "error", "field"),
    [
        ("done", RuntimeError, "errors"),
        ("done", LeaseLost, "lease_lost"),
        ("forget", RuntimeError, "errors"),
        ("forget", LeaseLost, "lease_lost"),
    ],
)
async def test_runner_goes_on_when_a_queue_method_raises_for_one_key(
    front: Front,
    caplog: pytest.LogCaptureFixture,
    method: str,
    error: type[Exception],
    field: str,
) -> None:
    inner = front.make("run-faulty", clock=FakeClock(), max_retries=3)
    q = _Faulty(inner, method, "bad", error)
    handled: list[Any] = []
    for key in ("a", "bad", "b"):
        q.add(key)

    stats = await front.run_workers(q, handled.append)

    assert handled == ["a", "bad", "b"]
    level = logging.WARNING if error is LeaseLost else logging.ERROR
    logged = [r.getMessage() for r in caplog.records if r.levelno == level]
    assert any("'bad'" in m for m in logged), logged
    s = inner.stats()
    assert (s.gets, s.dones, s.processing, s.retries) == (3, 3, 0, 0)
    assert stats == RunStats(processed=3, succeeded=2, **{field: 1})


async def test_runner_handler_raising_lease_lost_is_counted_and_not_retried(
    front: Front, caplog: pytest.LogCaptureFixture
) -> None:
    q = front.make("run-lease-lost", clock=FakeClock(), max_retries=3, rate_limiter=exponential())
    handled: list[Any] = []
    given_up: list[Any] = []

    def handler(key: Any) -> None:
        handled.append(key)
        if key == "lost":
            raise LeaseLost("renew: the lease expired")

    def until() -> bool:
        s = q.stats()
        return len(handled) == 3 and s.processing == 0 and s.depth == 0

    for key in ("a", "lost", "b"):
        q.add(key)
    stats = await front.run_workers(
        q, handler, on_give_up=lambda k, e: given_up.append(k), until=until
    )

    assert handled == ["a", "lost", "b"]
    s = q.stats()
    assert (s.retries, s.delayed) == (0, 0)  # another holder may have it: not retried
    assert given_up == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'lost'" in m and "lease" in m for m in warnings), warnings
    assert stats == RunStats(processed=3, succeeded=2, lease_lost=1)


# -- metrics (Prometheus, on a FakeClock) -----------------------------------------


async def test_prometheus_metrics_on_a_fake_clock(front: Front) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    q = front.make("pods", clock=clock, metrics=metrics, rate_limiter=exponential())

    def value(metric: str) -> float | None:
        return registry.get_sample_value(metric, {"name": "pods"})

    assert value("workqueue_depth") == 0  # exported from the start
    q.add("a")  # t=0
    q.add("a")
    q.add("b")
    q.add_after("c", 10)
    assert value("workqueue_adds_total") == 2
    assert value("workqueue_coalesced_adds_total") == 1
    assert value("workqueue_depth") == 2
    assert value("workqueue_delayed_keys") == 1
    assert value("workqueue_retries_total") == 1
    assert value("workqueue_unfinished_work_seconds") == 0
    assert value("workqueue_longest_running_processor_seconds") == 0

    clock.step(1)
    assert q.get_nowait() == "a"  # waited 1, held from t=1
    assert value("workqueue_depth") == 1
    clock.step(2)
    assert q.get_nowait() == "b"  # waited 3, held from t=3
    assert value("workqueue_queue_duration_seconds_sum") == 4
    assert value("workqueue_queue_duration_seconds_count") == 2
    assert value("workqueue_depth") == 0

    clock.step(4)  # t=7: a held 6, b held 4
    assert value("workqueue_unfinished_work_seconds") == 10
    assert value("workqueue_longest_running_processor_seconds") == 6

    q.add("a")  # marks the held key: newly dirty, counted as an add
    q.add("a")  # coalesced
    assert value("workqueue_adds_total") == 3
    assert value("workqueue_coalesced_adds_total") == 2
    q.done("a")  # worked 6, redelivered: a redelivery is not an add
    assert value("workqueue_adds_total") == 3
    assert value("workqueue_coalesced_adds_total") == 2
    assert value("workqueue_work_duration_seconds_sum") == 6
    assert value("workqueue_depth") == 1

    clock.step(1)  # t=8
    assert q.get_nowait() == "a"  # waited 1, from the add while it was held
    assert value("workqueue_queue_duration_seconds_sum") == 5
    assert value("workqueue_unfinished_work_seconds") == 5
    assert value("workqueue_longest_running_processor_seconds") == 5
    q.done("b")  # worked 5
    q.done("a")  # worked 0
    assert value("workqueue_work_duration_seconds_sum") == 11
    assert value("workqueue_work_duration_seconds_count") == 3
    assert value("workqueue_unfinished_work_seconds") == 0
    assert value("workqueue_longest_running_processor_seconds") == 0

    q.add_rate_limited("d")  # ready at t=9
    assert value("workqueue_retries_total") == 2
    assert value("workqueue_delayed_keys") == 2
    clock.step(3)  # t=11: c and d come due
    assert value("workqueue_delayed_keys") == 0
    assert value("workqueue_depth") == 2
    assert value("workqueue_adds_total") == 5

    assert registry.get_sample_value("workqueue_adds_total", {"name": "other"}) is None


async def test_prometheus_retries_not_counted_after_shutdown(front: Front) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    q = front.make("late", clock=FakeClock(), metrics=metrics)
    q.add_after("a", 1)
    await front.shutdown(q)
    q.add_after("a", 1)
    q.add("b")

    assert registry.get_sample_value("workqueue_retries_total", {"name": "late"}) == 1
    assert registry.get_sample_value("workqueue_adds_total", {"name": "late"}) == 0
    assert registry.get_sample_value("workqueue_delayed_keys", {"name": "late"}) == 0


async def test_prometheus_levels_exported_without_keeping_the_provider(front: Front) -> None:
    """prometheus_client's own idiom: the registry keeps a collector alive, so a
    provider passed inline (never bound to a name) must still export its levels."""
    clock = FakeClock()
    registry = CollectorRegistry()
    q = front.make("inline", clock=clock, metrics=PrometheusMetrics(registry=registry))
    gc.collect()
    q.add("a")
    q.add_after("b", 5)

    def value(metric: str) -> float | None:
        return registry.get_sample_value(metric, {"name": "inline"})

    gc.collect()  # and again after the adds: only the queue refers to the provider
    assert value("workqueue_adds_total") == 1  # event counters survive
    assert value("workqueue_depth") == 1
    assert value("workqueue_delayed_keys") == 1


async def test_metrics_adds_after_shutdown_are_not_counted(front: Front) -> None:
    q, registry = metered(front)
    q.add("a")
    await front.shutdown(q)
    q.add("b")
    q.add("a")  # would be coalesced on a live queue

    assert sample(registry, "workqueue_adds_total") == 1
    assert sample(registry, "workqueue_coalesced_adds_total") == 0


async def test_metrics_delayed_keys_gauge_follows_the_delay_heap(front: Front) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock=clock)
    q.add_after("x", 5)
    q.add_after("y", 10)
    q.add_after("y", 20)  # the earlier ready time wins; still one key
    assert sample(registry, "workqueue_delayed_keys") == 2

    clock.step(5)
    assert sample(registry, "workqueue_delayed_keys") == 1
    assert sample(registry, "workqueue_depth") == 1

    await front.shutdown(q)
    assert sample(registry, "workqueue_delayed_keys") == 0


async def test_metrics_queue_duration_runs_from_the_dirtying_add_to_get(front: Front) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock=clock)
    q.add("a")  # t=0 makes it dirty
    clock.step(1)
    q.add("a")  # t=1 coalesced: does not restart the wait
    clock.step(1)
    assert q.get_nowait() == "a"  # t=2: waited 2
    assert sample(registry, "workqueue_queue_duration_seconds_sum") == 2
    assert sample(registry, "workqueue_queue_duration_seconds_count") == 1

    clock.step(1)
    q.add("a")  # t=3, while held: the redelivery's wait starts here
    clock.step(2)
    q.done("a")  # t=5
    clock.step(1)
    assert q.get_nowait() == "a"  # t=6: waited 6 - 3
    assert sample(registry, "workqueue_queue_duration_seconds_sum") == 5
    assert sample(registry, "workqueue_queue_duration_seconds_count") == 2


async def test_metrics_queue_duration_of_a_delayed_key_starts_when_it_comes_due(
    front: Front,
) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock=clock)
    q.add_after("a", 4)
    clock.step(4)
    clock.step(1.5)
    assert q.get_nowait() == "a"
    assert sample(registry, "workqueue_queue_duration_seconds_sum") == 1.5


async def test_metrics_work_duration_runs_from_get_to_done(front: Front) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock=clock)
    q.add("a")
    q.add("b")
    q.get_nowait()
    clock.step(3)
    q.get_nowait()
    clock.step(0.5)
    q.done("a")  # held 3.5
    q.done("b")  # held 0.5

    assert sample(registry, "workqueue_work_duration_seconds_sum") == 4
    assert sample(registry, "workqueue_work_duration_seconds_count") == 2
    bucket = registry.get_sample_value(
        "workqueue_work_duration_seconds_bucket", {"name": "pods", "le": "+Inf"}
    )
    assert bucket == 2


async def test_metrics_unfinished_work_and_longest_running_are_computed_at_scrape_time(
    front: Front,
) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock=clock)
    assert sample(registry, "workqueue_unfinished_work_seconds") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 0
    q.add("a")
    q.add("b")
    q.get_nowait()  # "a" held from t=0
    clock.step(1)
    q.get_nowait()  # "b" held from t=1
    clock.step(2)  # t=3
    assert sample(registry, "workqueue_unfinished_work_seconds") == 3 + 2
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 3
    clock.step(4)  # t=7: nothing happened but time passed
    assert sample(registry, "workqueue_unfinished_work_seconds") == 7 + 6
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 7
    q.done("a")
    assert sample(registry, "workqueue_unfinished_work_seconds") == 6
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 6
    q.done("b")
    assert sample(registry, "workqueue_unfinished_work_seconds") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 0


async def test_metrics_retries_total_counts_add_after_and_add_rate_limited_on_a_live_queue(
    front: Front,
) -> None:
    q, registry = metered(front)
    q.add_after("a", 5)
    q.add_after("a", 1)  # still a retry, even though it only moves the ready time
    q.add_after("b", 0)  # adds now, and still counts as a retry
    q.add_rate_limited("c")
    assert sample(registry, "workqueue_retries_total") == 4
    assert sample(registry, "workqueue_adds_total") == 1  # only "b" was made dirty

    await front.shutdown(q)
    q.add_after("d", 1)
    q.add_rate_limited("d")
    assert sample(registry, "workqueue_retries_total") == 4


async def test_metrics_retry_counts_in_retries_total(front: Front) -> None:
    q, registry = metered(front)
    q.add("a")
    q.get_nowait()
    assert q.retry("a") is True
    assert sample(registry, "workqueue_retries_total") == 1


async def test_metrics_two_queues_with_different_names_are_counted_separately(
    front: Front,
) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    pods = front.make("pods", clock=clock, metrics=metrics)
    nodes = front.make("nodes", clock=clock, metrics=metrics)
    pods.add("a")
    pods.add("b")
    pods.add("b")
    nodes.add("x")
    nodes.get_nowait()
    clock.step(2)

    assert sample(registry, "workqueue_adds_total", "pods") == 2
    assert sample(registry, "workqueue_adds_total", "nodes") == 1
    assert sample(registry, "workqueue_coalesced_adds_total", "pods") == 1
    assert sample(registry, "workqueue_coalesced_adds_total", "nodes") == 0
    assert sample(registry, "workqueue_depth", "pods") == 2
    assert sample(registry, "workqueue_depth", "nodes") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "pods") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "nodes") == 2


async def test_metrics_all_families_are_exported_with_the_name_label(front: Front) -> None:
    q, registry = metered(front)
    q.add("a")
    q.get_nowait()
    q.done("a")

    text = generate_latest(registry).decode()
    for family in (
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_coalesced_adds_total",
        "workqueue_delayed_keys",
        "workqueue_queue_duration_seconds_count",
        "workqueue_work_duration_seconds_count",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "workqueue_retries_total",
    ):
        assert f'{family}{{name="pods"}}' in text, family


async def test_metrics_discarded_queue_disappears_from_the_level_gauges(front: Front) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry=registry)
    gone = front.make("gone", clock=FakeClock(), metrics=metrics)
    gone.add("a")
    assert sample(registry, "workqueue_depth", "gone") == 1

    del gone
    gc.collect()

    assert sample(registry, "workqueue_depth", "gone") is None


async def test_metrics_keep_counting_while_a_subscriber_comes_and_goes(front: Front) -> None:
    q, registry = metered(front)
    q.add("a")
    unsubscribe = q.subscribe(lambda event: None)
    q.add("b")
    q.add("b")
    unsubscribe()
    q.add("c")

    assert sample(registry, "workqueue_adds_total") == 3
    assert sample(registry, "workqueue_coalesced_adds_total") == 1


# -- nothing kept alive -------------------------------------------------------------


async def test_key_is_not_kept_alive_after_add_get_done_forget(front: Front) -> None:
    q = front.make("weak-key", clock=FakeClock())
    key = Key("a")
    ref = weakref.ref(key)
    q.add(key)
    q.add(key)
    got = q.get_nowait()
    assert got is key
    q.add(key)  # marked while processing
    q.done(key)
    again = q.get_nowait()
    q.done(again)
    q.forget(key)

    del key, got, again
    assert_collected(ref)


async def test_key_is_not_kept_alive_after_retry_and_forget_once_the_delay_fired(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("weak-retry", clock=clock, max_retries=3)
    key = Key("a")
    ref = weakref.ref(key)
    q.add(key)
    got = q.get_nowait()
    assert q.retry(got) is True
    q.done(got)
    assert q.num_requeues(key) == 1
    clock.step(1000)
    got = q.get_nowait()
    assert got == key
    q.done(got)
    q.forget(got)
    assert q.num_requeues(key) == 0

    del key, got
    assert_collected(ref)


async def test_discarded_queue_on_a_fake_clock_can_be_collected(front: Front) -> None:
    clock = FakeClock()
    q = front.make("gone", clock=clock)
    q.add_after("a", 5)
    ref = weakref.ref(q)

    del q
    assert_collected(ref)
    clock.step(10)  # the clock must cope with a dead subscriber


# -- stats --------------------------------------------------------------------------


async def test_stats_counters_after_a_mixed_sequence_match_the_calls_and_the_events(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("mixed", clock=clock, rate_limiter=exponential())
    events = record(q)
    q.add("a")
    q.add("b")
    q.add("a")  # coalesced
    assert q.get_nowait() == "a"
    q.add("a")  # marked
    q.add("a")  # coalesced (pending)
    q.add_after("c", 1)
    q.add_after("b", 1)  # comes due while b waits: coalesced
    q.add_after("d", 0)  # adds now
    q.add_rate_limited("a")  # comes due while a is held and pending: coalesced
    clock.step(1)
    q.done("a")
    take_all(q)
    await front.shutdown(q)
    q.add("e")  # not accepted, not counted

    s = q.stats()
    # 5 add calls, add_after("d", 0) and 3 delayed keys coming due: 9 accepted adds.
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (9, 4, 4, 1)
    assert (s.redeliveries, s.gets, s.dones, s.retries, s.rate_limited) == (1, 5, 5, 4, 1)
    assert (s.depth, s.processing, s.delayed, s.max_depth) == (0, 0, 0, 4)
    # Each counter agrees with the transitions the queue reported one by one.
    kinds = [kind for kind, *_ in events]
    adding = (E.ENQUEUE, E.COALESCE, E.MARK_WHILE_PROCESSING)
    assert s.adds == sum(kinds.count(kind) for kind in adding)
    assert (s.enqueued, s.coalesced, s.marked_while_processing) == tuple(map(kinds.count, adding))
    assert (s.redeliveries, s.gets, s.dones) == tuple(
        map(kinds.count, (E.REDELIVER, E.GET, E.DONE))
    )
    assert (s.retries, s.rate_limited) == (
        kinds.count(E.DELAY) + kinds.count(E.RATE_LIMIT),
        kinds.count(E.RATE_LIMIT),
    )


async def test_stats_is_a_frozen_snapshot(front: Front) -> None:
    q = front.make("snapshot")
    q.add("a")
    snapshot = q.stats()
    assert isinstance(snapshot, Stats)

    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.adds = 99  # type: ignore[misc]
    q.add("b")
    q.get_nowait()

    assert (snapshot.adds, snapshot.depth, snapshot.gets, snapshot.processing) == (1, 1, 0, 0)
    assert (q.stats().adds, q.stats().depth, q.stats().gets) == (2, 1, 1)


async def test_metrics_depth_counts_a_key_marked_while_processing_as_client_go(
    front: Front,
) -> None:
    # client-go increments depth for every add that newly marks a key dirty,
    # also one marked while processing, and decrements it at get.
    registry = CollectorRegistry()
    q = front.make("pods", clock=FakeClock(), metrics=PrometheusMetrics(registry))
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # marked while processing: owed one redelivery
    assert registry.get_sample_value("workqueue_adds_total", {"name": "pods"}) == 2.0
    assert registry.get_sample_value("workqueue_depth", {"name": "pods"}) == 1.0
    assert len(q) == 0  # nothing is waiting in the FIFO itself
    q.done("a")
    assert registry.get_sample_value("workqueue_depth", {"name": "pods"}) == 1.0
    assert q.get_nowait() == "a"
    assert registry.get_sample_value("workqueue_depth", {"name": "pods"}) == 0.0


class _RaisingOnGet:
    """A metrics provider whose observer fails on GET (a backend that is down)."""

    def new_queue_metrics(self, name: str, gauges: Any) -> Any:
        def observe(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
            if kind is EventKind.GET:
                raise OSError("metrics backend down")

        return observe


async def test_a_failing_metrics_backend_leaves_no_key_held_by_nobody(front: Front) -> None:
    q = front.make("m", clock=FakeClock(), metrics=_RaisingOnGet())
    q.add("a")
    assert q.get_nowait() == "a"  # the observer's error is logged, not raised
    assert q.stats().processing == 1
    q.done("a")
    assert await front.shutdown(q, drain=True, timeout=1.0)


# -- bad input changes nothing; seconds are ints or floats ------------------------------


@pytest.mark.parametrize(
    ("key", "delay", "error", "match"),
    [
        (["unhashable"], 1, TypeError, None),
        ("a", True, TypeError, "delay"),
        ("a", Decimal(1), TypeError, "delay"),
        ("a", "1", TypeError, "delay"),
        ("a", None, TypeError, "delay"),
        ("a", math.nan, ValueError, "nan"),
    ],
)
async def test_add_after_with_a_bad_key_or_delay_raises_and_counts_no_retry_and_emits_nothing(
    front: Front, key: Any, delay: Any, error: type[Exception], match: str | None
) -> None:
    clock = FakeClock()
    q = front.make("bad-delay", clock=clock)
    seen = record(q)
    before = q.stats()

    with pytest.raises(error, match=match):
        q.add_after(key, delay)

    clock.step(10)
    assert q.stats() == before  # no retries count, nothing delayed or added
    assert seen == []  # no DELAY event


async def test_add_rate_limited_of_an_unhashable_key_raises_before_the_limiter_spends_a_token(
    front: Front,
) -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(1, 1, clock=clock)  # one token; the next one a second later
    q = front.make("bad-rate", clock=clock, rate_limiter=bucket)
    seen = record(q)
    before = q.stats()

    with pytest.raises(TypeError):
        q.add_rate_limited(["unhashable"])

    assert q.stats() == before
    assert seen == []
    assert bucket.when("other") == 0.0  # the token is still there


@pytest.mark.parametrize("timeout", [True, False, "1", Decimal("0.01")])
async def test_get_and_drain_with_a_timeout_that_is_not_a_number_raise_type_error(
    front: Front, timeout: Any
) -> None:
    q = front.make("timeout-type")
    q.add("a")

    with pytest.raises(TypeError, match="timeout"):
        await front.get(q, timeout=timeout)  # get(True) is not get(timeout=1)
    with pytest.raises(TypeError, match="timeout"):
        await front.shutdown(q, drain=True, timeout=timeout)

    assert (len(q), q.stats().gets, q.shutting_down) == (1, 0, False)


async def test_get_and_drain_take_an_int_timeout_beyond_float_range_as_forever(
    front: Front,
) -> None:
    q = front.make("timeout-huge-int")
    q.add("a")

    assert await front.get(q, timeout=10**400) == "a"  # no OverflowError: it waits for ever
    q.done("a")
    assert await front.shutdown(q, drain=True, timeout=10**400) is True


async def test_add_after_an_int_delay_beyond_float_range_is_for_ever_on_every_front(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("delay-huge-int", clock=clock)

    q.add_after("a", 10**400)  # no OverflowError: due never

    clock.step(1e300)
    s = q.stats()
    assert (s.delayed, s.depth, s.retries) == (1, 0, 1)
    with pytest.raises(Empty):
        q.get_nowait()


async def test_add_after_too_small_to_move_a_far_fake_clock_adds_now_on_every_front(
    front: Front,
) -> None:
    clock = FakeClock(1e6)
    assert 1e6 + 1e-12 == 1e6  # the delay vanishes in floating point
    q = front.make("tiny-delay", clock=clock)
    seen = record(q)

    q.add_after("tiny", 1e-12)

    assert q.get_nowait() == "tiny"  # ready now, not at the next step
    assert [(kind, key) for kind, key, _, _ in seen] == [
        (E.DELAY, "tiny"),
        (E.ENQUEUE, "tiny"),
        (E.GET, "tiny"),
    ]
    q.done("tiny")

    q.add_after("small", 1e-9)  # moves the clock's now: a real delay
    with pytest.raises(Empty):
        q.get_nowait()
    clock.step(1e-9)
    assert q.get_nowait() == "small"
    q.done("small")
    assert q.stats().delayed == 0


# -- snapshot -----------------------------------------------------------------------


def held_here(q: Any, key: str) -> tuple[str | None, int | None]:
    """(holder, token) a snapshot shows for ``key`` taken by this test's code
    from ``q``: a Redis client's identity and the hold's token; in memory, the
    name of the task (asyncio) or thread that took it, and no token."""
    if not hasattr(q, "holder"):
        task = asyncio.current_task() if isinstance(q, AsyncWorkQueue) else None
        return (threading.current_thread().name if task is None else task.get_name()), None
    return q.holder, q.token(key)


async def test_snapshot_shows_the_waiting_held_delayed_and_failing_keys_the_calls_left(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("snap", clock=clock, rate_limiter=exponential(1.0, 100.0))
    q.add("held")
    assert q.get_nowait() == "held"
    q.add("fail")
    for backoff in (1.0, 2.0):  # two failures: back after 1 s, then 2 s
        assert q.get_nowait() == "fail"
        assert q.retry("fail") is True
        q.done("fail")
        if backoff == 1.0:
            clock.step(1.5)
    q.add_many(["a", "b", "c"])
    clock.step(0.5)
    q.add("d")
    q.add("a")  # coalesced: keeps its place and its wait
    q.add_after("later", 10.0, priority=0)
    q.add_after("sooner", 5.0)

    snap = q.snapshot()

    assert snap.taken_at == clock.now()
    assert snap.stats == q.stats()
    assert [(w.key, w.priority, w.waited) for w in snap.waiting] == [
        ("a", 0, 0.5),
        ("b", 0, 0.5),
        ("c", 0, 0.5),
        ("d", 0, 0.0),
    ]
    holder, token = held_here(q, "held")
    assert [(h.key, h.holder, h.token, h.held) for h in snap.processing] == [
        ("held", holder, token, 2.0)
    ]
    lease_left = snap.processing[0].lease_left
    assert lease_left is None if token is None else lease_left == 28.0  # a 30 s lease
    assert [(d.key, d.due_in, d.priority) for d in snap.delayed] == [
        ("fail", 1.5, 0),
        ("sooner", 5.0, 0),
        ("later", 10.0, 0),
    ]
    assert [(f.key, f.failures, f.comes_back_in) for f in snap.failing] == [("fail", 2, 1.5)]
    assert snap.failing_keys == 1
    assert json.loads(snap.to_json()) == snap.as_dict()

    q.forget("fail")
    q.done("held")
    after = q.snapshot(limit=2)
    assert (after.failing, after.processing) == ((), ())
    assert [w.key for w in after.waiting] == ["a", "b"]
    assert [d.key for d in after.delayed] == ["fail", "sooner"]
    assert (after.limit, after.stats.depth, after.failing_keys) == (2, 4, 0)


async def test_snapshot_of_a_ranked_queue_lists_keys_in_the_order_gets_take_them(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("snap-ranked", clock=clock)
    for i, priority in enumerate([0, 3, 1, 3, 2, 0, 5]):
        q.add(f"k{i}", priority=priority)
        clock.step(1.0)
    q.add("k2", priority=4)  # moves up, keeps its arrival
    q.add_after("soon", 1.0, priority=7)

    snap = q.snapshot()

    assert [(w.key, w.priority) for w in snap.waiting] == [
        ("k6", 5),
        ("k2", 4),
        ("k1", 3),
        ("k3", 3),
        ("k4", 2),
        ("k0", 0),
        ("k5", 0),
    ]
    assert [w.waited for w in snap.waiting][:3] == [1.0, 5.0, 6.0]
    assert [(d.key, d.priority) for d in snap.delayed] == [("soon", 7)]
    assert [w.key for w in q.snapshot(limit=3).waiting] == ["k6", "k2", "k1"]
    order = []
    while True:
        try:
            key = q.get_nowait()
        except Empty:
            break
        order.append(key)
        q.done(key)
    assert order == [w.key for w in snap.waiting]


async def test_snapshot_of_a_key_pushed_back_by_done_waits_from_that_done(front: Front) -> None:
    clock = FakeClock()
    q = front.make("snap-pushed", clock=clock)
    q.add("a")
    q.add("x")
    assert q.get_nowait() == "a"
    q.add("a")  # marked while held
    clock.step(3.0)
    q.done("a")  # waits again from now
    clock.step(1.0)
    assert [(w.key, w.waited) for w in q.snapshot().waiting] == [("x", 4.0), ("a", 1.0)]


@pytest.mark.parametrize("limit", [-1, 2.0, True, "3", None])
async def test_snapshot_with_a_bad_limit_raises_and_sends_nothing(front: Front, limit: Any) -> None:
    q = front.make("snap-bad")
    with pytest.raises((TypeError, ValueError), match="limit"):
        q.snapshot(limit=limit)
    assert q.snapshot(limit=0).waiting == ()
