"""keyqueue: Kubernetes client-go's work queue for Python.

A firehose of "key changed" events becomes each key processed one at a time,
never lost, never duplicated: coalescing adds, one redelivery for a key changed
while held, per-key exclusion, delays, rate-limited retries, graceful shutdown.

``import keyqueue`` needs only the standard library; ``keyqueue.prometheus``
needs the ``keyqueue[prometheus]`` extra. ``keyqueue.COMPILED`` says whether
the core and the queues run compiled by mypyc or as Python source.
"""

from ._build import COMPILED  # first: it decides how the queues' modules load
from ._clock import Clock, MonotonicClock
from ._dead import DeadKey
from ._errors import Empty, ShutDown
from ._events import Event, EventKind
from ._metrics import MetricsProvider, NoopMetrics, QueueGauges
from ._outcome import PermanentError, Requeue, RunStats
from ._queues import AsyncWorkQueue, WorkQueue
from ._ratelimit import (
    BucketRateLimiter,
    EndpointRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    WithMaxWaitRateLimiter,
    default_controller_rate_limiter,
)
from ._runner import arun_workers, run_workers
from ._snapshot import DelayedKey, FailingKey, HeldKey, Snapshot, WaitingKey
from ._stats import Stats

__version__ = "0.1.0"
"""This release's version (as in the package metadata)."""

__all__ = [
    "COMPILED",
    "AsyncWorkQueue",
    "BucketRateLimiter",
    "Clock",
    "DeadKey",
    "DelayedKey",
    "Empty",
    "EndpointRateLimiter",
    "Event",
    "EventKind",
    "FailingKey",
    "HeldKey",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "MetricsProvider",
    "MonotonicClock",
    "NoopMetrics",
    "PermanentError",
    "QueueGauges",
    "RateLimiter",
    "Requeue",
    "RunStats",
    "ShutDown",
    "Snapshot",
    "Stats",
    "WaitingKey",
    "WithMaxWaitRateLimiter",
    "WorkQueue",
    "__version__",
    "arun_workers",
    "default_controller_rate_limiter",
    "run_workers",
]
