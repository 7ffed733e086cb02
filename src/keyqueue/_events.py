"""Transition events, for tracing and metrics.

The core reports every transition to at most one observer, a plain function
``observer(kind, key, now, duration)``; when nobody subscribed the observer is
``None`` and reporting costs one attribute test. Fronts fan the observer out to
``subscribe``d callbacks (which get an ``Event``) and to the metrics provider.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["Event", "EventKind", "Observer"]

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
    back (as the holder's ``done``, plus one failure). ``duration``: seconds held."""
    LEASE_LOST = "lease_lost"
    """Redis backend: this client learned that its own lease on ``key`` was taken
    back (a late ``done`` or renewal); ``done`` raises ``LeaseLost``."""


logger = logging.getLogger("keyqueue")

Observer = Callable[[EventKind, Any, float, "float | None"], None]
"""``observer(kind, key, now, duration)``, called under the queue's lock."""


@dataclass(frozen=True, slots=True)
class Event(Generic[K]):
    """One transition, as delivered to ``queue.subscribe`` callbacks."""

    kind: EventKind
    key: K
    time: float
    """The queue's clock when it happened."""
    duration: float | None = None
    """Queue wait (GET), work time (DONE) or delay (DELAY, RATE_LIMIT); else None."""


def fan_out(
    name: str, metrics: Observer | None, subscribers: tuple[Callable[[Event[Any]], None], ...]
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
