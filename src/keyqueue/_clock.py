"""Clocks: where fronts and rate limiters read the time.

A clock is any object with ``now() -> float`` (seconds, monotonic). The core never
reads one; fronts read it and pass ``now`` in. A *virtual* clock (such as
``keyqueue.testing.FakeClock``) also has ``subscribe(callback)``: it calls each
subscriber after time moves, so a queue releases due delayed keys synchronously
inside ``step`` instead of waiting on a timer for wall time that never passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "VirtualClock", "resolve_clock"]


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the time in seconds."""

    def now(self) -> float:
        """Seconds on this clock: only differences mean something (never going back)."""
        ...


@runtime_checkable
class VirtualClock(Clock, Protocol):
    """A clock that moves only when told, and says so to its subscribers.

    ``subscribe`` keeps a weak reference to a bound-method callback, so a
    subscribed queue can still be garbage collected.
    """

    def subscribe(self, callback: Callable[[], None]) -> None: ...


class MonotonicClock:
    """The default clock: ``time.monotonic``."""

    __slots__ = ()

    now = staticmethod(time.monotonic)
    """Seconds on ``time.monotonic``: only differences mean something."""

    def __repr__(self) -> str:
        return "MonotonicClock()"


def resolve_clock(clock: Clock | None) -> Clock:
    """``None`` means the monotonic clock; anything else must have ``now()``."""
    if clock is None:
        return MonotonicClock()
    if not callable(getattr(clock, "now", None)):
        raise TypeError(f"clock must have a now() method returning seconds, got {clock!r}")
    return clock
