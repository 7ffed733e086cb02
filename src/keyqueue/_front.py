"""What every front shares: construction, collaborators, event fan-out.

A front owns one ``Core`` and serializes calls into it; it never decides a
rule. This base holds what is the same for the threading and asyncio fronts:
the clock, the rate limiter, failure counting, subscribers and metrics wiring.

The fronts are compiled (``keyqueue._build``), so they are written for mypyc:
keys are ``Any`` here (the public classes in ``_queues`` add the key type),
every argument a front checks itself is ``Any`` too (a compiled function would
otherwise reject or convert it before the check: ``True`` as a timeout), and
the fronts allow interpreted subclasses, which is what the public classes are.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from threading import get_ident
from typing import Any, Final

from ._build import mypyc_attr
from ._clock import Clock, resolve_clock
from ._core import Core, check_number, check_priority
from ._events import Event, EventKind, Observer, fan_out
from ._metrics import MetricsProvider, NoopMetrics, QueueGauges
from ._ratelimit import RateLimiter, default_controller_rate_limiter

__all__ = ["QueueBase"]

logger: Final = logging.getLogger("keyqueue")


def check_timeout(timeout: Any) -> float | None:
    """``None``, or wall seconds >= 0 as a float (an int beyond float range is
    ``inf``): ``TypeError`` for a bool or a non-number, ``ValueError`` otherwise."""
    if timeout is None:
        return None
    if timeout.__class__ is float and timeout >= 0.0:  # the common case, at C speed
        return timeout
    must = "timeout must be None or a number of seconds >= 0"
    seconds = check_number(timeout, must)
    if not seconds >= 0:
        raise ValueError(f"{must}, got {timeout!r}")
    return seconds


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueBase:
    """State and collaborators shared by ``WorkQueue`` and ``AsyncWorkQueue``.

    Not generic, and weakly referenced only through a subclass: a compiled
    generic class gets a weakref slot its deallocator never clears
    (mypyc/mypyc#1102), while an interpreted subclass of a class without one
    gets its own, cleared as usual.
    """

    def __init__(
        self,
        name: Any = "",
        *,
        rate_limiter: Any = None,
        max_retries: Any = None,
        clock: Any = None,
        metrics: Any = None,
        aging: Any = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        self.name: str = name
        self._clock = resolve_clock(clock)
        self._now = self._clock.now
        self._core: Core[Any] = Core(max_retries, aging)
        if rate_limiter is None:
            rate_limiter = default_controller_rate_limiter(self._clock)
        elif not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                f"rate_limiter must have when/forget/num_requeues, got {rate_limiter!r}"
            )
        self._rate_limiter: RateLimiter = rate_limiter
        provider = NoopMetrics() if metrics is None else metrics
        if not isinstance(provider, MetricsProvider):
            raise TypeError(f"metrics must have new_queue_metrics(), got {metrics!r}")
        self._metrics_observer = provider.new_queue_metrics(name, self._gauges)
        self._subscribe_lock = threading.Lock()
        self._subscribers: tuple[Callable[[Event[Any]], None], ...] = ()
        # Ident of the thread running this queue's subscribe() callbacks, 0 when
        # none runs: a call from one would deadlock on the queue's lock (or
        # re-enter the core mid-transition), so the methods refuse it. Only a
        # queue with subscribers ever sets it.
        self._emitting: int = 0
        self._rewire()

    # -- read-only ----------------------------------------------------------------

    @property
    def max_retries(self) -> int | None:
        """Failures after which ``retry`` gives a key up (None: never)."""
        return self._core.max_retries

    @property
    def rate_limiter(self) -> RateLimiter:
        """The limiter ``add_rate_limited`` and ``retry`` ask for each key's delay."""
        return self._rate_limiter

    @property
    def clock(self) -> Clock:
        """The clock every delay and wait of this queue is measured on."""
        return self._clock

    @property
    def aging(self) -> float | None:
        """Seconds a waiting key takes to gain one priority step (None: strict)."""
        return self._core.aging

    @property
    def shutting_down(self) -> bool:
        """True once ``shutdown`` was called."""
        return self._core.shutting_down

    def __len__(self) -> int:
        """Keys waiting (not processing, not delayed). Informational under concurrency."""
        return len(self._core.waiting)

    def num_requeues(self, key: Any) -> int:
        """Failures the rate limiter has recorded for ``key`` since it was forgotten."""
        return self._rate_limiter.num_requeues(key)

    # -- asking the rate limiter ---------------------------------------------------

    def _rate_limited_delay(self, key: Any, priority: Any) -> float | None:
        """For ``add_rate_limited``: the limiter's delay for ``key``, or None after
        shutdown (the add is a no-op, and the limiter records nothing).

        The key and the priority are checked before the limiter records the
        failure, its answer after (``check_add_after``'s rule): bad input raises
        and the queue changes nothing.
        """
        if self._core.shutting_down:
            return None
        hash(key)
        if priority:
            check_priority(priority)
        return self._backoff(key)

    def _retry_delay(self, key: Any) -> float:
        """For ``retry``: the limiter's delay for ``key`` if the core would back it
        off (``Core.retry_backs_off``), else 0.0 without asking. An unhashable
        key raises first."""
        hash(key)
        return self._backoff(key) if self._core.retry_backs_off(key) else 0.0

    def _backoff(self, key: Any) -> float:
        # Any: a compiled call would convert (True) or reject the answer before the check.
        limiter: Any = self._rate_limiter
        return check_number(
            limiter.when(key), "a rate limiter's delay must be an int or float (seconds)"
        )

    def _gauges(self) -> QueueGauges:
        core = self._core
        now = self._now()
        unfinished, longest = core.unfinished(now)
        return QueueGauges(
            len(core.dirty),
            len(core.delayed),
            unfinished,
            longest,
            core.waiting_by_priority(),
            core.oldest_wait(now),
        )

    # -- events ------------------------------------------------------------------

    # Subscribing swaps an immutable tuple and the core's observer in one
    # assignment each, under ``_subscribe_lock`` only: not the queue's lock, so a
    # callback (which runs under the queue's lock) may unsubscribe itself.

    def _add_subscriber(self, callback: Any) -> Callable[[], None]:
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {callback!r}")
        with self._subscribe_lock:
            self._subscribers = (*self._subscribers, callback)
            self._rewire()
        return lambda: self._remove_subscriber(callback)

    def _remove_subscriber(self, callback: Callable[[Event[Any]], None]) -> None:
        with self._subscribe_lock:
            subscribers = list(self._subscribers)
            if callback in subscribers:
                subscribers.remove(callback)
                self._subscribers = tuple(subscribers)
                self._rewire()

    def _rewire(self) -> None:
        """Point the core at exactly what is subscribed: nothing, metrics, or a fan-out.

        Observers run after the core changed state; an exception in one is
        logged and never reaches the queue's caller (a failing metrics backend
        must not leave a key held by nobody).
        """
        observe = fan_out(self.name, self._metrics_observer, self._subscribers)
        if observe is not None and self._subscribers:
            observe = _marking_callbacks(self, observe)
        self._core.observer = observe

    def __repr__(self) -> str:
        core = self._core
        state = "shutting down" if core.shutting_down else "running"
        return (
            f"<{type(self).__name__} {self.name!r} {state}: {len(core.waiting)} waiting, "
            f"{len(core.processing)} processing, {len(core.delayed)} delayed>"
        )


def _marking_callbacks(front: QueueBase, observe: Observer) -> Observer:
    """``observe``, with ``front._emitting`` set to this thread while it runs."""

    def marked(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
        front._emitting = get_ident()
        try:
            observe(kind, key, now, duration)
        finally:
            front._emitting = 0

    return marked


def reentered(front: QueueBase, what: str) -> None:
    """Raise ``RuntimeError`` if this thread is running ``front``'s subscribe()
    callbacks (the caller checked ``front._emitting`` first: free otherwise)."""
    if front._emitting == get_ident():
        raise RuntimeError(
            f"{what}() called from a subscribe() callback of queue {front.name!r}: "
            "callbacks run under the queue's lock and must not call the queue"
        )
