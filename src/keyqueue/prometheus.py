"""Prometheus metrics with client-go's workqueue names (extra ``keyqueue[prometheus]``).

    from prometheus_client import start_http_server
    from keyqueue import WorkQueue
    from keyqueue.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics()          # registers on prometheus_client.REGISTRY
    q = WorkQueue("pods", metrics=metrics)

Exported, each with a ``name`` label: ``workqueue_depth``, ``workqueue_adds_total``
(adds that newly mark a key dirty), ``workqueue_queue_duration_seconds`` (from the
add that made a key dirty to its ``get``), ``workqueue_work_duration_seconds``,
``workqueue_unfinished_work_seconds``, ``workqueue_longest_running_processor_seconds``,
``workqueue_retries_total`` (every ``add_after``/``add_rate_limited`` on a live
queue), plus ``workqueue_coalesced_adds_total``, ``workqueue_delayed_keys``,
``workqueue_waiting_keys`` (keys waiting, with a ``priority`` label) and
``workqueue_oldest_wait_seconds`` (how long the waiting key that arrived
first has waited: what ``aging`` bounds), and
for the Redis backend ``workqueue_leases_expired_total`` (leases this process's
calls took back from a holder that stopped renewing) and
``workqueue_leases_lost_total`` (this process's own holds taken back).
Levels (depth, delayed, unfinished, longest running, waiting by priority,
oldest wait) are read from the queues when scraped; there is no ticker
thread. ``workqueue_depth`` means what it means in client-go: keys marked
dirty, waiting or pending redelivery. ``workqueue_waiting_keys`` always has
its ``priority="0"`` series (0 when none waits), so a sum over it is never
empty.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import REGISTRY, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "keyqueue.prometheus needs prometheus_client: pip install 'keyqueue[prometheus]'"
    ) from exc

from ._events import EventKind, Observer
from ._metrics import QueueGauges

__all__ = ["DURATION_BUCKETS", "PrometheusMetrics"]

DURATION_BUCKETS = tuple(1e-8 * 10**i for i in range(10))
"""client-go's buckets: ``prometheus.ExponentialBuckets(10e-9, 10, 10)``."""


class PrometheusMetrics:
    """A ``MetricsProvider`` exporting every queue built with it to ``registry``.

    ``registry=None`` means prometheus_client's default ``REGISTRY``. Use one
    instance per registry; queues sharing a name add up under one label.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        labels = ["name"]
        self._adds = Counter(
            "workqueue_adds_total",
            "Total number of adds handled by workqueue",
            labels,
            registry=registry,
        )
        self._coalesced = Counter(
            "workqueue_coalesced_adds_total",
            "Total number of adds absorbed by a key already waiting or pending redelivery",
            labels,
            registry=registry,
        )
        self._leases_expired = Counter(
            "workqueue_leases_expired_total",
            "Total number of leases that ran out and were taken back from their holder",
            labels,
            registry=registry,
        )
        self._leases_lost = Counter(
            "workqueue_leases_lost_total",
            "Total number of this process's holds whose lease was taken back",
            labels,
            registry=registry,
        )
        self._retries = Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            labels,
            registry=registry,
        )
        self._queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._lock = threading.Lock()
        self._queues: list[tuple[str, weakref.WeakMethod[Callable[[], QueueGauges]]]] = []
        registry.register(_LevelsCollector(self))

    def new_queue_metrics(self, name: str, gauges: Callable[[], QueueGauges]) -> Observer:
        """Export the queue called ``name`` (series labelled so); ``gauges`` is held weakly."""
        with self._lock:
            self._queues.append((name, weakref.WeakMethod(gauges)))
        adds = self._adds.labels(name).inc
        coalesced = self._coalesced.labels(name).inc
        retries = self._retries.labels(name).inc
        leases_expired = self._leases_expired.labels(name).inc
        leases_lost = self._leases_lost.labels(name).inc
        queued = self._queue_duration.labels(name).observe
        worked = self._work_duration.labels(name).observe
        counted: dict[EventKind, Callable[[], None]] = {
            EventKind.ENQUEUE: adds,
            EventKind.MARK_WHILE_PROCESSING: adds,
            EventKind.COALESCE: coalesced,
            EventKind.DELAY: retries,
            EventKind.RATE_LIMIT: retries,
            EventKind.LEASE_EXPIRED: leases_expired,
            EventKind.LEASE_LOST: leases_lost,
        }

        def observe(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
            if kind is EventKind.GET:
                queued(duration or 0.0)
            elif kind is EventKind.DONE:
                worked(duration or 0.0)
            else:
                inc = counted.get(kind)
                if inc is not None:
                    inc()

        return observe

    def levels(self) -> dict[str, QueueGauges]:
        """Each live queue name's levels now (queues sharing a name are added up)."""
        with self._lock:
            live = [(name, ref()) for name, ref in self._queues]
            self._queues = [q for q, (_, g) in zip(self._queues, live, strict=True) if g]
        out: dict[str, QueueGauges] = {}
        for name, gauges in live:
            if gauges is None:
                continue
            g = gauges()
            prev = out.get(name)
            if prev is not None:
                waiting = dict(prev.waiting_by_priority)
                for priority, n in g.waiting_by_priority.items():
                    waiting[priority] = waiting.get(priority, 0) + n
                g = QueueGauges(
                    prev.depth + g.depth,
                    prev.delayed + g.delayed,
                    prev.unfinished_work_seconds + g.unfinished_work_seconds,
                    max(
                        prev.longest_running_processor_seconds, g.longest_running_processor_seconds
                    ),
                    waiting,
                    max(prev.oldest_wait_seconds, g.oldest_wait_seconds),
                )
            out[name] = g
        return out


_LEVELS = (
    ("workqueue_depth", "Current depth of workqueue", "depth"),
    (
        "workqueue_unfinished_work_seconds",
        "How many seconds of work has done that is in progress and hasn't been observed by "
        "work_duration. Large values indicate stuck threads. One can deduce the number of "
        "stuck threads by observing the rate at which this increases.",
        "unfinished_work_seconds",
    ),
    (
        "workqueue_longest_running_processor_seconds",
        "How many seconds has the longest running processor for workqueue been running.",
        "longest_running_processor_seconds",
    ),
    ("workqueue_delayed_keys", "Current number of keys waiting for their ready time", "delayed"),
    (
        "workqueue_oldest_wait_seconds",
        "How many seconds the waiting key that arrived first has been waiting.",
        "oldest_wait_seconds",
    ),
)
_WAITING = (
    "workqueue_waiting_keys",
    "Current number of keys waiting to be handed out, by priority",
)


class _LevelsCollector:
    """Reads depth, delayed keys, unfinished work and longest running at scrape time."""

    def __init__(self, owner: PrometheusMetrics) -> None:
        self._owner = owner  # strong: the registry keeps the provider; it holds queues weakly

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(n, h, labels=["name"]) for n, h, _ in _LEVELS] + [
            GaugeMetricFamily(*_WAITING, labels=["name", "priority"])
        ]

    def collect(self) -> Iterable[Metric]:
        levels = self._owner.levels()
        for metric_name, help_text, field in _LEVELS:
            family = GaugeMetricFamily(metric_name, help_text, labels=["name"])
            for name, g in levels.items():
                family.add_metric([name], float(getattr(g, field)))
            yield family
        waiting = GaugeMetricFamily(*_WAITING, labels=["name", "priority"])
        for name, g in levels.items():
            for priority, n in sorted({0: 0, **g.waiting_by_priority}.items()):
                waiting.add_metric([name, str(priority)], float(n))
        yield waiting
