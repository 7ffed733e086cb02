"""The backlog you can see, on every front: delayed keys, the rate limiter's
delays, and a priority label that cannot grow without bound.

Each test takes the ``front`` fixture (conftest.py), so it runs once per
queue (threading, asyncio, Redis, async Redis, and both sharded). Metrics are
read back from a ``prometheus_client`` registry of the test's own; time passes
only through ``FakeClock.step``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from keyqueue import Empty, ItemExponentialFailureRateLimiter
from keyqueue.prometheus import (
    PRIORITY_LABELS_MAX,
    PRIORITY_OVERFLOW,
    RATE_LIMITER_DELAY_BUCKETS,
    PrometheusMetrics,
)
from keyqueue.testing import FakeClock

if TYPE_CHECKING:
    from tests.support.fronts import Front


def metered(front: Front, clock: FakeClock, name: str = "pods") -> tuple[Any, CollectorRegistry]:
    """A queue on ``clock`` backing off 1 s doubling to 100 s, exporting to its own registry."""
    registry = CollectorRegistry()
    q = front.make(
        name,
        clock=clock,
        metrics=PrometheusMetrics(registry=registry),
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0),
    )
    return q, registry


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, {"name": "pods", **labels})


def waiting_series(registry: CollectorRegistry) -> dict[str, float]:
    """``workqueue_waiting_keys`` of the queue "pods", by ``priority`` label value."""
    return {
        s.labels["priority"]: s.value
        for family in registry.collect()
        if family.name == "workqueue_waiting_keys"
        for s in family.samples
        if s.labels["name"] == "pods"
    }


# -- delayed items ---------------------------------------------------------------------


async def test_delayed_items_counts_keys_waiting_for_a_delay_or_a_backoff(front: Front) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock)
    assert sample(registry, "workqueue_delayed_items") == 0
    q.add_after("a", 5)  # a delay
    q.add_rate_limited("b")  # a backoff: 1 s
    q.add_rate_limited("b")  # 2 s: the earlier ready time stands, still one key
    q.add("c")  # waiting, not delayed
    assert sample(registry, "workqueue_delayed_items") == 2
    assert sample(registry, "workqueue_delayed_keys") == 2  # its older name, the same level
    assert q.stats().delayed == 2

    clock.step(1)  # b comes due
    assert sample(registry, "workqueue_delayed_items") == 1
    assert sample(registry, "workqueue_depth") == 2
    clock.step(4)  # a comes due
    assert sample(registry, "workqueue_delayed_items") == 0
    assert q.stats().delayed == 0


# -- the rate limiter's delays -----------------------------------------------------------


async def test_rate_limiter_delay_histogram_and_stats_record_each_backoff_handed_out(
    front: Front,
) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock)
    q.add_rate_limited("a")  # 1 s
    q.add_rate_limited("a")  # 2 s
    q.add_rate_limited("a")  # 4 s
    q.add_after("b", 7)  # a delay asked for, not the rate limiter's: not recorded
    q.add("c")
    assert q.get_nowait() == "c"
    assert q.retry("c") is True  # a failure's backoff: 1 s

    assert sample(registry, "workqueue_rate_limiter_delay_seconds_count") == 4
    assert sample(registry, "workqueue_rate_limiter_delay_seconds_sum") == 1 + 2 + 4 + 1
    buckets = {
        le: sample(registry, "workqueue_rate_limiter_delay_seconds_bucket", le=str(le))
        for le in (0.5, 1.0, 2.5, 5.0, 1000.0)
    }
    assert buckets == {0.5: 0, 1.0: 2, 2.5: 3, 5.0: 4, 1000.0: 4}
    assert sample(registry, "workqueue_retries_total") == 5  # the delay counts as a retry
    s = q.stats()
    assert s.rate_limited == 4
    assert s.rate_limit_delay_seconds == 8
    assert s.max_rate_limit_delay_seconds == 4
    # Stats' identity holds beside them.
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing


async def test_a_quarter_hour_backoff_lands_in_its_own_bucket(front: Front) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    q = front.make(
        "pods",
        clock=clock,
        metrics=PrometheusMetrics(registry=registry),
        rate_limiter=ItemExponentialFailureRateLimiter(900.0, 1000.0),
    )
    q.add_rate_limited("slow")  # 15 minutes

    assert RATE_LIMITER_DELAY_BUCKETS[0] == 0.001
    assert RATE_LIMITER_DELAY_BUCKETS[-1] == 1000.0
    assert sample(registry, "workqueue_rate_limiter_delay_seconds_bucket", le="600.0") == 0
    assert sample(registry, "workqueue_rate_limiter_delay_seconds_bucket", le="1000.0") == 1
    assert q.stats().max_rate_limit_delay_seconds == 900


async def test_no_backoff_handed_out_leaves_the_delay_figures_at_zero(front: Front) -> None:
    clock = FakeClock()
    q, registry = metered(front, clock)
    q.add("a")
    q.add_after("b", 3)
    s = q.stats()
    assert (s.rate_limited, s.rate_limit_delay_seconds, s.max_rate_limit_delay_seconds) == (
        0,
        0,
        0,
    )
    assert sample(registry, "workqueue_rate_limiter_delay_seconds_count") == 0


# -- the priority label's cap ------------------------------------------------------------


async def test_a_thousand_distinct_priorities_make_at_most_the_cap_plus_one_series(
    front: Front,
) -> None:
    """An ever-growing priority (controller-runtime #3396's 810K series): the
    label takes the first PRIORITY_LABELS_MAX values it sees, 0 among them,
    and counts every other priority under PRIORITY_OVERFLOW, scrape after scrape."""
    q, registry = metered(front, FakeClock())
    for priority in range(1, 1001):
        q.add(f"k{priority}", priority)
    first = waiting_series(registry)

    assert PRIORITY_LABELS_MAX == 25
    assert len(first) == PRIORITY_LABELS_MAX + 1
    # 0, and the 24 highest of the priorities first seen, each one key.
    labelled = {"0"} | {str(p) for p in range(977, 1001)}
    assert set(first) == labelled | {PRIORITY_OVERFLOW}
    assert first["0"] == 0
    assert first[PRIORITY_OVERFLOW] == 1000 - 24
    assert sum(first.values()) == 1000

    while True:  # hand every key out; new priorities arrive meanwhile
        try:
            q.done(q.get_nowait())
        except Empty:
            break
    for priority in range(2000, 3000):
        q.add(f"n{priority}", priority)
    q.add("again", 990)  # a priority with a label value of its own keeps it
    second = waiting_series(registry)

    assert set(second) == {"0", "990", PRIORITY_OVERFLOW}  # no new label value, ever
    assert second[PRIORITY_OVERFLOW] == 1000
    assert sum(second.values()) == 1001
    seen = set(first) | set(second)
    assert len(seen) <= PRIORITY_LABELS_MAX + 1


async def test_a_queue_with_few_priorities_has_one_series_each_and_no_overflow(
    front: Front,
) -> None:
    q, registry = metered(front, FakeClock())
    q.add("a")
    q.add("b", 3)
    q.add("c", 3)
    q.add("d", -1)

    assert waiting_series(registry) == {"-1": 1, "0": 1, "3": 2}
