"""Transition events, for tracing and metrics, and who gets them.

The core reports every transition to at most one observer, a plain function
``observer(kind, key, now, duration)``; when nobody subscribed the observer is
``None`` and reporting costs one attribute test. A queue's ``Subscribers``
fans that observer out to its ``subscribe``d callbacks (which get an
``Event``) and to its metrics provider, and installs it wherever the queue's
transitions are decided (the in-memory core, a Redis client's replies).

Subscribing swaps an immutable tuple and the installed observer, one
assignment each, under the subscribers' own lock (not the queue's), so a
callback, which may run under the queue's lock, can unsubscribe itself.

Re-entry: an in-memory queue runs its callbacks under its lock (threading) or
mid-transition (asyncio), so a callback must not call the queue. Such a queue
subscribes with itself as the ``guard``: while its callbacks run,
``guard._emitting`` is the running thread's ident (0 otherwise), each of its
methods tests that field (one attribute test on the hot path, nothing else)
and, when it is set, calls ``reentered``. The guard is held only while a
callback is subscribed: the queue holds its ``Subscribers``, so holding the
queue back for good would make every queue a reference cycle, freed only by
the garbage collector.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from threading import get_ident
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Event", "EventKind", "Guarded", "Observer", "Subscribers", "reentered"]

K = TypeVar("K")


class EventKind(enum.Enum):
    """What happened to a key. ``Event.duration`` is set where noted."""

    ENQUEUE = "enqueue"
    """absent → waiting: the key was pushed onto the FIFO."""
    COALESCE = "coalesce"
    """An add absorbed by a key that is already dirty (waiting or pending)."""
    MARK_WHILE_PROCESSING = "mark_while_processing"
    """processing → processing + pending: it will be redelivered after ``done``."""
    REDELIVER = "redeliver"
    """``done`` pushed a pending key back onto the FIFO."""
    GET = "get"
    """waiting → processing. ``duration``: seconds since the add that made it dirty."""
    DONE = "done"
    """processing ended. ``duration``: seconds since the ``get``."""
    DELAY = "delay"
    """``add_after`` on a live queue. ``duration``: the delay asked for."""
    RATE_LIMIT = "rate_limit"
    """``add_rate_limited`` on a live queue. ``duration``: the backoff chosen."""
    SHUTDOWN = "shutdown"
    """The queue began shutting down (``key`` is ``None``)."""
    LEASE_EXPIRED = "lease_expired"
    """Redis backend: a holder's lease ran out and this client's call took the key
    back (as the holder's ``done``; the key waits again, charged nothing if its
    handler had not started, else a ``STALL``). ``duration``: seconds held."""
    LEASE_LOST = "lease_lost"
    """Redis backend: this client learned that its own lease on ``key`` was taken
    back (a late ``done`` or renewal); ``done`` raises ``LeaseLost``."""
    STALL = "stall"
    """Redis backend: a lease this client's call took back (``LEASE_EXPIRED``)
    was a stall: the holder's handler had started (the holder died, or stopped
    renewing, with it running). Not a failure; the key waits again.
    ``duration``: seconds held."""
    POISON = "poison"
    """Redis backend: this client's call gave ``key`` up as a poison key: it
    stalled its holder more than ``max_stalls`` times in a row (forgotten,
    with its failures; ``on_give_up`` gets ``Stalled``)."""


logger = logging.getLogger("keyqueue")

Observer = Callable[[EventKind, Any, float, "float | None"], None]
"""``observer(kind, key, now, duration)``, called under the queue's lock."""


@dataclass(frozen=True, slots=True)
class Event(Generic[K]):
    """One transition, as delivered to ``queue.subscribe`` callbacks."""

    kind: EventKind
    """What happened."""
    key: K
    """The key it happened to (``None`` for ``SHUTDOWN``)."""
    time: float
    """The queue's clock when it happened."""
    duration: float | None = None
    """Seconds: the queue wait (GET), the work time (DONE) or the delay (DELAY,
    RATE_LIMIT); else None."""


Callback = Callable[[Event[Any]], None]


class Guarded(Protocol):
    """A queue whose methods refuse a call from its own callbacks (see the module)."""

    name: str
    _emitting: int


class Subscribers:
    """One queue's ``subscribe()`` callbacks and metrics observer, as one observer.

    ``observer`` is what the queue's transitions report to: None (nobody
    listens), the metrics observer, or a fan-out to both; every change is
    also passed to ``install`` (the in-memory front points its core at it).
    Callbacks subscribed with a ``guard`` run with ``guard._emitting`` set
    (see the module docstring).
    """

    __slots__ = ("_callbacks", "_guard", "_install", "_lock", "_metrics", "name", "observer")

    def __init__(
        self,
        name: str,
        metrics: Observer | None,
        install: Callable[[Observer | None], None] | None = None,
    ) -> None:
        self.name = name
        self._metrics = metrics
        self._install = install
        self._guard: Guarded | None = None  # while a callback is subscribed
        self._lock = threading.Lock()
        self._callbacks: tuple[Callback, ...] = ()
        self.observer: Observer | None = None
        self._rewire()

    def __len__(self) -> int:
        return len(self._callbacks)

    def subscribe(self, callback: Any, guard: Guarded | None = None) -> Callable[[], None]:
        """Add ``callback`` (``TypeError`` if it is not callable), run with
        ``guard._emitting`` set if a ``guard`` is given; returns the function
        that removes it."""
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {callback!r}")
        with self._lock:
            if guard is not None:
                self._guard = guard
            self._callbacks = (*self._callbacks, callback)
            self._rewire()
        return lambda: self.unsubscribe(callback)

    def unsubscribe(self, callback: Callback) -> None:
        """Remove ``callback`` (its first subscription); a no-op if it is not there."""
        with self._lock:
            callbacks = list(self._callbacks)
            if callback in callbacks:
                callbacks.remove(callback)
                self._callbacks = tuple(callbacks)
                self._rewire()

    def _rewire(self) -> None:
        """Point ``observer`` (and what ``install`` sets) at exactly what listens."""
        observe = fan_out(self.name, self._metrics, self._callbacks)
        if not self._callbacks:
            self._guard = None  # let go of the queue (see the module docstring)
        elif observe is not None and self._guard is not None:
            observe = _marking(self._guard, observe)
        self.observer = observe
        if self._install is not None:
            self._install(observe)


def _marking(guard: Guarded, observe: Observer) -> Observer:
    """``observe``, with ``guard._emitting`` set to this thread while it runs."""

    def marked(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
        guard._emitting = get_ident()
        try:
            observe(kind, key, now, duration)
        finally:
            guard._emitting = 0

    return marked


def reentered(guard: Guarded, what: str) -> None:
    """Raise ``RuntimeError`` if this thread is running ``guard``'s subscribe()
    callbacks (the caller checked ``guard._emitting`` first: free otherwise)."""
    if guard._emitting == get_ident():
        raise RuntimeError(
            f"{what}() called from a subscribe() callback of queue {guard.name!r}: "
            "callbacks run under the queue's lock and must not call the queue"
        )


def fan_out(
    name: str, metrics: Observer | None, subscribers: tuple[Callback, ...]
) -> Observer | None:
    """The observer a queue gives its core: nothing, metrics, or metrics plus subscribers.

    Observers run after the state changed; an exception in one is logged and
    never reaches the queue's caller (a failing metrics backend must not leave
    a key held by nobody).
    """
    if metrics is None and not subscribers:
        return None

    def observe(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
        if metrics is not None:
            try:
                metrics(kind, key, now, duration)
            except Exception:
                logger.exception("keyqueue %r: metrics observer raised", name)
        if not subscribers:
            return
        event = Event(kind, key, now, duration)
        for callback in subscribers:
            try:
                callback(event)
            except Exception:
                logger.exception("keyqueue %r: event subscriber %r raised", name, callback)

    return observe
