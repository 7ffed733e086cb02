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
queue), ``workqueue_delayed_items`` (keys waiting for a delay or a backoff)
and ``workqueue_rate_limiter_delay_seconds`` (a histogram of the backoffs
the rate limiter hands out: each ``add_rate_limited`` and ``retry``, per-key
backoff and buckets alike; buckets ``RATE_LIMITER_DELAY_BUCKETS``, 1 ms to
1000 s), plus ``workqueue_coalesced_adds_total``, ``workqueue_delayed_keys``
(the same level as ``workqueue_delayed_items``, its older name),
``workqueue_waiting_keys`` (keys waiting, with a ``priority`` label, capped:
see below) and ``workqueue_oldest_wait_seconds`` (how long the waiting key
that arrived first has waited: what ``aging`` bounds), and
for the Redis backend ``workqueue_leases_expired_total`` (leases this process's
calls took back from a holder that stopped renewing), of them
``workqueue_stalls_total`` (those whose handler had started: not failures),
``workqueue_poison_keys_total`` (keys this process's calls gave up for
stalling more than ``max_stalls`` times in a row) and
``workqueue_leases_lost_total`` (this process's own holds taken back).
Levels (depth, delayed, unfinished, longest running, waiting by priority,
oldest wait) are read from the queues when scraped; there is no ticker
thread. ``workqueue_depth`` means what it means in client-go: keys marked
dirty, waiting or pending redelivery. ``workqueue_waiting_keys`` always has
its ``priority="0"`` series (0 when none waits), so a sum over it is never
empty.

The ``priority`` label is capped: each queue name exports at most
``PRIORITY_LABELS_MAX`` (25) distinct priority values as label values, the
first ones its scrapes see with keys waiting (``0`` always among them;
highest first within one scrape), for good, and counts the keys of any other
priority under ``priority="other"`` (``PRIORITY_OVERFLOW``). So an
application that uses an ever-growing priority makes at most 26
``workqueue_waiting_keys`` series per queue name, ever, not one per value
(controller-runtime's priority queue made 810K series so, and capped its
label at 25 values); a sum over the series is still the number of keys
waiting. What it trades: past the cap, a priority seen later shows only in
``other``, however many keys it has.

``add_informer(informer, name)`` exports a ``keyqueue.informer.Informer``'s
processing under client-go's informer names, ``informer_queued_items``
(changes handed to the handlers and not yet handled by all of them: the
informer's pipeline, ``InformerStats.in_flight``),
``informer_processing_latency_seconds`` (a histogram: from a change's
hand-over to its handlers until the last returned or its awaited add
completed; buckets ``DURATION_BUCKETS``) and
``informer_store_resource_version`` (the resource version the cache is
current to), and its
``stats()`` beside the queues', read at scrape time, under client-go's
reflector metric names where it has one (``reflector_lists_total``,
``reflector_watches_total``, ``reflector_short_watches_total``,
``reflector_last_resource_version``) and in their manner where it has none:
``reflector_list_pages_total``, ``reflector_list_restarts_total`` (continue
tokens that expired), ``reflector_watch_events_total``,
``reflector_bookmarks_total``, ``reflector_relists_total`` (with a ``reason``
label), ``reflector_backoffs_total``, ``reflector_resynced_objects_total``,
``reflector_cached_objects`` and ``reflector_last_list_duration_seconds``
(client-go's list duration is a summary; this is the last list's), and how
its changes reach the queue: ``reflector_handler_retries_total`` (handler
calls, a queue's add among them, made again after a connection error) and
``reflector_handler_in_flight`` (changes whose handlers have not all finished:
at ``max_in_flight``, the watch waits).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "keyqueue.prometheus needs prometheus_client: pip install 'keyqueue[prometheus]'"
    ) from exc

from ._events import EventKind, Observer
from ._metrics import QueueGauges

__all__ = [
    "DURATION_BUCKETS",
    "PRIORITY_LABELS_MAX",
    "PRIORITY_OVERFLOW",
    "RATE_LIMITER_DELAY_BUCKETS",
    "PrometheusMetrics",
]

DURATION_BUCKETS = tuple(1e-8 * 10**i for i in range(10))
"""client-go's buckets in seconds, 1e-08 to 10: ``prometheus.ExponentialBuckets(10e-9, 10, 10)``."""

RATE_LIMITER_DELAY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1000.0,
)
"""``workqueue_rate_limiter_delay_seconds``'s buckets, 1 ms to 1000 s: from the
default limiter's first backoff (5 ms) to its cap (1000 s), about 2.5x apart
below a minute and at 1, 2, 5 and 10 minutes above, so a key backing off for
a quarter of an hour shows in its own bucket (``le="1000"``), not only in
``+Inf``."""

PRIORITY_LABELS_MAX = 25
"""The most distinct ``priority`` label values one queue name exports."""

PRIORITY_OVERFLOW = "other"
"""The ``priority`` label value that counts the keys of every priority past the cap."""


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
        self._stalls = Counter(
            "workqueue_stalls_total",
            "Total number of leases taken back after their handler started (a holder that "
            "died or stopped renewing with its handler running)",
            labels,
            registry=registry,
        )
        self._poison = Counter(
            "workqueue_poison_keys_total",
            "Total number of keys given up for stalling their holder more than max_stalls "
            "times in a row",
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
        self._rate_limiter_delay = Histogram(
            "workqueue_rate_limiter_delay_seconds",
            "How long in seconds the rate limiter delays an item (each backoff it hands out).",
            labels,
            buckets=RATE_LIMITER_DELAY_BUCKETS,
            registry=registry,
        )
        self._lock = threading.Lock()
        # name -> the priorities that have a label value of their own (at most
        # PRIORITY_LABELS_MAX, 0 always among them); only grows, within the cap.
        self._priority_labels: dict[str, set[int]] = {}
        self._queues: list[tuple[str, weakref.WeakMethod[Callable[[], QueueGauges]]]] = []
        registry.register(_LevelsCollector(self))
        self._registry = registry
        # (name, informer.stats held weakly); the collector and the processing
        # histogram register with the first.
        self._informers: list[tuple[str, weakref.WeakMethod[Callable[[], _ReflectorStats]]]] = []
        self._processing: Histogram | None = None

    def add_informer(self, informer: _HasStats, name: str) -> None:
        """Export ``informer.stats()`` (a ``keyqueue.informer.Informer``) as the
        ``reflector_*`` and ``informer_*`` series labelled ``name``, read at scrape
        time, and time its changes (``informer.observe_processed``) for
        ``informer_processing_latency_seconds``; the informer is held weakly."""
        with self._lock:
            self._informers.append((name, weakref.WeakMethod(informer.stats)))
            processing = self._processing
            first = processing is None  # not "no informer": the dead ones are dropped
            if processing is None:
                processing = self._processing = Histogram(
                    "informer_processing_latency_seconds",
                    "How long in seconds the informer's handlers take to process a change "
                    "after it is handed to them.",
                    ["name"],
                    buckets=DURATION_BUCKETS,
                    registry=self._registry,
                )
        if first:
            self._registry.register(_ReflectorCollector(self))
        informer.observe_processed(processing.labels(name).observe)

    def informer_stats(self) -> list[tuple[str, _ReflectorStats]]:
        """``(name, stats)`` for each live informer added."""
        with self._lock:
            live = [(name, ref()) for name, ref in self._informers]
            self._informers = [i for i, (_, s) in zip(self._informers, live, strict=True) if s]
        return [(name, stats()) for name, stats in live if stats is not None]

    def new_queue_metrics(self, name: str, gauges: Callable[[], QueueGauges]) -> Observer:
        """Export the queue called ``name`` (series labelled so); ``gauges`` is held weakly."""
        with self._lock:
            self._queues.append((name, weakref.WeakMethod(gauges)))
        adds = self._adds.labels(name).inc
        coalesced = self._coalesced.labels(name).inc
        retries = self._retries.labels(name).inc
        leases_expired = self._leases_expired.labels(name).inc
        leases_lost = self._leases_lost.labels(name).inc
        stalls = self._stalls.labels(name).inc
        poison = self._poison.labels(name).inc
        queued = self._queue_duration.labels(name).observe
        worked = self._work_duration.labels(name).observe
        backed_off = self._rate_limiter_delay.labels(name).observe
        counted: dict[EventKind, Callable[[], None]] = {
            EventKind.ENQUEUE: adds,
            EventKind.MARK_WHILE_PROCESSING: adds,
            EventKind.COALESCE: coalesced,
            EventKind.DELAY: retries,
            EventKind.RATE_LIMIT: retries,
            EventKind.LEASE_EXPIRED: leases_expired,
            EventKind.LEASE_LOST: leases_lost,
            EventKind.STALL: stalls,
            EventKind.POISON: poison,
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
                    if kind is EventKind.RATE_LIMIT:
                        backed_off(duration or 0.0)

        return observe

    def priority_series(self, name: str, waiting: Mapping[int, int]) -> dict[str, int]:
        """Keys waiting by ``priority`` label value for the queue ``name``, capped.

        ``priority="0"`` is always there; a priority with keys waiting gets a
        label value of its own if it has one already or the name has fewer
        than ``PRIORITY_LABELS_MAX`` (the new ones highest first), for good;
        the keys of any other priority count under ``PRIORITY_OVERFLOW``. Only
        priorities with keys waiting are there (and the overflow only when it
        counts some): at most ``PRIORITY_LABELS_MAX + 1`` label values per
        name, ever.
        """
        with self._lock:
            labelled = self._priority_labels.setdefault(name, {0})
            for priority in sorted(waiting, reverse=True):
                if priority not in labelled and len(labelled) < PRIORITY_LABELS_MAX:
                    labelled.add(priority)
        series = {"0": 0}
        overflow = 0
        for priority, n in sorted(waiting.items()):
            if priority in labelled:
                series[str(priority)] = series.get(str(priority), 0) + n
            else:
                overflow += n
        if overflow:
            series[PRIORITY_OVERFLOW] = overflow
        return series

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
        "workqueue_delayed_items",
        "Current number of items waiting for a delay or a backoff before they are added",
        "delayed",
    ),
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
            for priority, n in self._owner.priority_series(name, g.waiting_by_priority).items():
                waiting.add_metric([name, priority], float(n))
        yield waiting


class _ReflectorStats(Protocol):
    """What the reflector series read from ``keyqueue.informer.InformerStats``."""

    @property
    def lists(self) -> int: ...
    @property
    def watches(self) -> int: ...
    @property
    def events(self) -> int: ...
    @property
    def short_watches(self) -> int: ...
    @property
    def backoffs(self) -> int: ...
    @property
    def resource_version(self) -> str: ...
    @property
    def cached(self) -> int: ...
    @property
    def pages(self) -> int: ...
    @property
    def bookmarks(self) -> int: ...
    @property
    def list_restarts(self) -> int: ...
    @property
    def relists(self) -> Mapping[str, int]: ...
    @property
    def resynced(self) -> int: ...
    @property
    def last_sync_seconds(self) -> float: ...
    @property
    def handler_retries(self) -> int: ...
    @property
    def in_flight(self) -> int: ...


class _HasStats(Protocol):
    def stats(self) -> _ReflectorStats: ...
    def observe_processed(self, observer: Callable[[float], None]) -> Callable[[], None]: ...


_REFLECTOR_COUNTERS = (
    ("reflector_lists", "Total number of API lists done by the reflectors", "lists"),
    ("reflector_list_pages", "Total number of list pages received", "pages"),
    (
        "reflector_list_restarts",
        "Total number of lists restarted because their continue token expired",
        "list_restarts",
    ),
    ("reflector_watches", "Total number of API watches done by the reflectors", "watches"),
    (
        "reflector_short_watches",
        "Total number of short API watches done by the reflectors",
        "short_watches",
    ),
    ("reflector_watch_events", "Total number of watch events received", "events"),
    ("reflector_bookmarks", "Total number of watch bookmarks received", "bookmarks"),
    ("reflector_backoffs", "Total number of back-offs before a list", "backoffs"),
    (
        "reflector_resynced_objects",
        "Total number of cached objects re-delivered by resyncs",
        "resynced",
    ),
    (
        "reflector_handler_retries",
        "Total number of handler calls made again after a connection error",
        "handler_retries",
    ),
)
_REFLECTOR_GAUGES = (
    ("reflector_cached_objects", "Number of objects in the informer's cache", "cached"),
    (
        "reflector_last_list_duration_seconds",
        "How long the last successful list took, every page",
        "last_sync_seconds",
    ),
    (
        "reflector_handler_in_flight",
        "Number of changes whose handlers have not all finished",
        "in_flight",
    ),
    (
        "informer_queued_items",
        "Number of changes handed to the informer's handlers and not yet processed by all",
        "in_flight",
    ),
)


class _ReflectorCollector:
    """Reads each added informer's ``stats()`` at scrape time."""

    def __init__(self, owner: PrometheusMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterable[Metric]:
        return self._families(self._owner.informer_stats())

    @staticmethod
    def _families(informers: list[tuple[str, _ReflectorStats]]) -> Iterable[Metric]:
        for metric_name, help_text, attr in _REFLECTOR_COUNTERS:
            counter = CounterMetricFamily(metric_name, help_text, labels=["name"])
            for name, stats in informers:
                counter.add_metric([name], float(getattr(stats, attr)))
            yield counter
        relists = CounterMetricFamily(
            "reflector_relists",
            "Total number of lists after the first sync, by what caused them",
            labels=["name", "reason"],
        )
        for name, stats in informers:
            for reason, n in sorted(stats.relists.items()):
                relists.add_metric([name, reason], float(n))
        yield relists
        for metric_name, help_text, attr in _REFLECTOR_GAUGES:
            gauge = GaugeMetricFamily(metric_name, help_text, labels=["name"])
            for name, stats in informers:
                gauge.add_metric([name], float(getattr(stats, attr)))
            yield gauge
        last = GaugeMetricFamily(
            "reflector_last_resource_version",
            "Last resource version seen for the reflectors",
            labels=["name"],
        )
        store = GaugeMetricFamily(
            "informer_store_resource_version",
            "Resource version the informer's store is current to",
            labels=["name"],
        )
        for name, stats in informers:
            if stats.resource_version.isdigit():
                last.add_metric([name], float(stats.resource_version))
                store.add_metric([name], float(stats.resource_version))
        yield last
        yield store
