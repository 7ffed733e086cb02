"""``keyqueue.prometheus.PrometheusMetrics``: client-go's metric names, exact values.

Every queue runs on a ``FakeClock`` with its own ``CollectorRegistry``, so the
durations are exact and nothing leaks between tests.
"""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from keyqueue import ItemExponentialFailureRateLimiter, WorkQueue
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.testing import FakeClock


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> PrometheusMetrics:
    return PrometheusMetrics(registry=registry)


@pytest.fixture
def q(metrics: PrometheusMetrics, clock: FakeClock) -> WorkQueue[str]:
    return WorkQueue(
        "pods",
        clock=clock,
        metrics=metrics,
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 100.0),
    )


def value(registry: CollectorRegistry, metric: str, name: str = "pods") -> float | None:
    return registry.get_sample_value(metric, {"name": name})


def test_adds_total_counts_adds_that_newly_mark_a_key_dirty(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
    q.add("a")  # enqueue
    q.add("a")  # coalesced
    q.add("b")  # enqueue
    assert q.get_nowait() == "a"
    q.add("a")  # marked while processing
    q.add("a")  # coalesced (already pending)
    assert value(registry, "workqueue_adds_total") == 3
    assert value(registry, "workqueue_coalesced_adds_total") == 2
    q.done("a")  # a redelivery is not an add
    assert value(registry, "workqueue_adds_total") == 3


def test_adds_after_shutdown_are_not_counted(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
    q.add("a")
    q.shutdown()
    q.add("b")
    q.add("a")
    assert value(registry, "workqueue_adds_total") == 1
    assert value(registry, "workqueue_coalesced_adds_total") == 0


def test_depth_is_the_number_of_waiting_keys(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
    assert value(registry, "workqueue_depth") == 0
    q.add("a")
    q.add("b")
    q.add("b")
    assert value(registry, "workqueue_depth") == 2
    q.get_nowait()
    assert value(registry, "workqueue_depth") == 1
    q.add_after("c", 5)
    assert value(registry, "workqueue_depth") == 1


def test_delayed_keys_gauge_follows_the_delay_heap(
    q: WorkQueue[str], registry: CollectorRegistry, clock: FakeClock
) -> None:
    q.add_after("x", 5)
    q.add_after("y", 10)
    q.add_after("y", 20)  # the earlier ready time wins; still one key
    assert value(registry, "workqueue_delayed_keys") == 2
    clock.step(5)
    assert value(registry, "workqueue_delayed_keys") == 1
    assert value(registry, "workqueue_depth") == 1
    q.shutdown()
    assert value(registry, "workqueue_delayed_keys") == 0


def test_queue_duration_runs_from_the_dirtying_add_to_get_on_the_fake_clock(
    q: WorkQueue[str], registry: CollectorRegistry, clock: FakeClock
) -> None:
    q.add("a")  # t=0 makes it dirty
    clock.step(1)
    q.add("a")  # t=1 coalesced: does not restart the wait
    clock.step(1)
    assert q.get_nowait() == "a"  # t=2: waited 2
    assert value(registry, "workqueue_queue_duration_seconds_sum") == 2
    assert value(registry, "workqueue_queue_duration_seconds_count") == 1

    clock.step(1)
    q.add("a")  # t=3, while held: the redelivery's wait starts here
    clock.step(2)
    q.done("a")  # t=5
    clock.step(1)
    assert q.get_nowait() == "a"  # t=6: waited 6 - 3
    assert value(registry, "workqueue_queue_duration_seconds_sum") == 5
    assert value(registry, "workqueue_queue_duration_seconds_count") == 2


def test_queue_duration_of_a_delayed_key_starts_when_it_comes_due(
    q: WorkQueue[str], registry: CollectorRegistry, clock: FakeClock
) -> None:
    q.add_after("a", 4)
    clock.step(4)
    clock.step(1.5)
    assert q.get_nowait() == "a"
    assert value(registry, "workqueue_queue_duration_seconds_sum") == 1.5


def test_work_duration_runs_from_get_to_done(
    q: WorkQueue[str], registry: CollectorRegistry, clock: FakeClock
) -> None:
    q.add("a")
    q.add("b")
    q.get_nowait()
    clock.step(3)
    q.get_nowait()
    clock.step(0.5)
    q.done("a")  # held 3.5
    q.done("b")  # held 0.5
    assert value(registry, "workqueue_work_duration_seconds_sum") == 4
    assert value(registry, "workqueue_work_duration_seconds_count") == 2
    bucket = registry.get_sample_value(
        "workqueue_work_duration_seconds_bucket", {"name": "pods", "le": "+Inf"}
    )
    assert bucket == 2


def test_unfinished_work_and_longest_running_are_computed_at_scrape_time(
    q: WorkQueue[str], registry: CollectorRegistry, clock: FakeClock
) -> None:
    assert value(registry, "workqueue_unfinished_work_seconds") == 0
    assert value(registry, "workqueue_longest_running_processor_seconds") == 0
    q.add("a")
    q.add("b")
    q.get_nowait()  # "a" held from t=0
    clock.step(1)
    q.get_nowait()  # "b" held from t=1
    clock.step(2)  # t=3
    assert value(registry, "workqueue_unfinished_work_seconds") == 3 + 2
    assert value(registry, "workqueue_longest_running_processor_seconds") == 3
    clock.step(4)  # t=7: nothing happened but time passed
    assert value(registry, "workqueue_unfinished_work_seconds") == 7 + 6
    assert value(registry, "workqueue_longest_running_processor_seconds") == 7
    q.done("a")
    assert value(registry, "workqueue_unfinished_work_seconds") == 6
    assert value(registry, "workqueue_longest_running_processor_seconds") == 6
    q.done("b")
    assert value(registry, "workqueue_unfinished_work_seconds") == 0
    assert value(registry, "workqueue_longest_running_processor_seconds") == 0


def test_retries_total_counts_add_after_and_add_rate_limited_on_a_live_queue(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
    q.add_after("a", 5)
    q.add_after("a", 1)  # still a retry, even though it only moves the ready time
    q.add_after("b", 0)  # adds now, and still counts as a retry
    q.add_rate_limited("c")
    assert value(registry, "workqueue_retries_total") == 4
    assert value(registry, "workqueue_adds_total") == 1  # only "b" was made dirty
    q.shutdown()
    q.add_after("d", 1)
    q.add_rate_limited("d")
    assert value(registry, "workqueue_retries_total") == 4


def test_retry_counts_in_retries_total(q: WorkQueue[str], registry: CollectorRegistry) -> None:
    q.add("a")
    q.get_nowait()
    assert q.retry("a") is True
    assert value(registry, "workqueue_retries_total") == 1


def test_two_queues_with_different_names_are_counted_separately(
    registry: CollectorRegistry, clock: FakeClock
) -> None:
    metrics = PrometheusMetrics(registry=registry)
    pods: WorkQueue[str] = WorkQueue("pods", clock=clock, metrics=metrics)
    nodes: WorkQueue[str] = WorkQueue("nodes", clock=clock, metrics=metrics)
    pods.add("a")
    pods.add("b")
    pods.add("b")
    nodes.add("x")
    nodes.get_nowait()
    clock.step(2)
    assert value(registry, "workqueue_adds_total", "pods") == 2
    assert value(registry, "workqueue_adds_total", "nodes") == 1
    assert value(registry, "workqueue_coalesced_adds_total", "pods") == 1
    assert value(registry, "workqueue_coalesced_adds_total", "nodes") == 0
    assert value(registry, "workqueue_depth", "pods") == 2
    assert value(registry, "workqueue_depth", "nodes") == 0
    assert value(registry, "workqueue_longest_running_processor_seconds", "pods") == 0
    assert value(registry, "workqueue_longest_running_processor_seconds", "nodes") == 2


def test_all_metric_families_are_exported_with_the_name_label(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
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


def test_a_discarded_queue_disappears_from_the_level_gauges(
    registry: CollectorRegistry, clock: FakeClock
) -> None:
    metrics = PrometheusMetrics(registry=registry)
    gone: WorkQueue[str] = WorkQueue("gone", clock=clock, metrics=metrics)
    gone.add("a")
    assert value(registry, "workqueue_depth", "gone") == 1
    del gone
    gc.collect()
    assert value(registry, "workqueue_depth", "gone") is None


def test_level_gauges_work_when_only_the_queue_refers_to_the_provider(
    registry: CollectorRegistry, clock: FakeClock
) -> None:
    # The natural one-liner: nothing but the queue (and the registry) holds the
    # provider. The level gauges must not vanish when it is garbage collected.
    q: WorkQueue[str] = WorkQueue("inline", clock=clock, metrics=PrometheusMetrics(registry))
    q.add("a")
    q.add_after("b", 5)
    gc.collect()
    assert value(registry, "workqueue_adds_total", "inline") == 1
    assert value(registry, "workqueue_depth", "inline") == 1
    assert value(registry, "workqueue_delayed_keys", "inline") == 1


def test_metrics_keep_counting_while_a_subscriber_comes_and_goes(
    q: WorkQueue[str], registry: CollectorRegistry
) -> None:
    q.add("a")
    unsubscribe = q.subscribe(lambda event: None)
    q.add("b")
    q.add("b")
    unsubscribe()
    q.add("c")
    assert value(registry, "workqueue_adds_total") == 3
    assert value(registry, "workqueue_coalesced_adds_total") == 1
