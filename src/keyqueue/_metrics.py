"""The metrics provider interface (as client-go's ``MetricsProvider``).

A queue calls ``provider.new_queue_metrics(name, gauges)`` once when it is built.
The provider returns an observer that the queue calls on every transition (see
``_events``), or ``None`` to observe nothing, which costs nothing. Values that
are *levels* rather than events (depth, delayed keys, unfinished work, longest
running processor, waiting keys by priority, the oldest wait) are not pushed:
the provider calls ``gauges()`` when it is scraped, so no ticker thread is
needed and the values are exact at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ._events import Observer

__all__ = ["MetricsProvider", "NoopMetrics", "QueueGauges"]


@dataclass(frozen=True, slots=True)
class QueueGauges:
    """One queue's levels, read at scrape time."""

    depth: int
    """As client-go's ``workqueue_depth``: keys marked dirty, that is waiting or
    pending redelivery (``Stats.depth`` counts only the waiting ones)."""
    delayed: int
    """Keys waiting for their ready time (``Stats.delayed``)."""
    unfinished_work_seconds: float
    """Sum over keys now processing of how many seconds each has been held."""
    longest_running_processor_seconds: float
    """Seconds the key held longest has been held (0 when none is)."""
    waiting_by_priority: Mapping[int, int] = field(default_factory=dict)
    """Keys waiting, by priority (``Stats.waiting_by_priority``)."""
    oldest_wait_seconds: float = 0.0
    """Seconds the waiting key that arrived first has waited (``Stats.oldest_wait_seconds``)."""


@runtime_checkable
class MetricsProvider(Protocol):
    """What a queue's ``metrics=`` takes: any object with ``new_queue_metrics``.

    ``keyqueue.prometheus.PrometheusMetrics`` is one; ``NoopMetrics`` (the
    default) observes nothing.
    """

    def new_queue_metrics(self, name: str, gauges: Callable[[], QueueGauges]) -> Observer | None:
        """Start observing the queue called ``name``.

        ``gauges`` reads the queue's levels (it takes the queue's lock briefly);
        providers should hold it weakly so a discarded queue can be collected.
        """
        ...


class NoopMetrics:
    """The default provider: observes nothing."""

    def new_queue_metrics(self, name: str, gauges: Callable[[], QueueGauges]) -> Observer | None:
        """Observe nothing: None, so the queue calls no observer."""
        return None
