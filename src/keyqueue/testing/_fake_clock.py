"""``FakeClock``: a clock that moves only when the test says so."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

__all__ = ["FakeClock"]


class FakeClock:
    """A virtual clock for deterministic tests.

    ``now()`` returns the current fake time; ``step(seconds)`` moves it forward.
    Queues built with ``clock=FakeClock()`` subscribe to it: when ``step`` returns,
    every delayed key whose ready time has passed is already in the queue's FIFO,
    and no key whose ready time is still ahead has been released. Rate limiters
    and metrics on the same clock see the same time.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._subscribers: list[weakref.WeakMethod[Callable[[], None]] | Callable[[], None]] = []
        self._prune_at = 16  # subscribe drops dead references once the list is this long

    def now(self) -> float:
        """The fake time: where the steps so far have moved it."""
        return self._now

    def step(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and notify subscribers."""
        if not seconds >= 0:  # also rejects NaN
            raise ValueError(f"FakeClock.step: seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._now += seconds
            refs = list(self._subscribers)
        dead = []
        for ref in refs:
            callback = _resolve(ref)
            if callback is None:
                dead.append(ref)
            else:
                callback()
        if dead:
            gone = set(map(id, dead))
            with self._lock:
                self._subscribers = [r for r in self._subscribers if id(r) not in gone]

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every ``step``.

        Bound methods are held weakly, so a queue that subscribed can be collected
        (and the references it leaves are dropped, here or at the next ``step``).
        """
        ref: weakref.WeakMethod[Callable[[], None]] | Callable[[], None]
        try:
            ref = weakref.WeakMethod(callback)
        except TypeError:  # a plain function: hold it strongly
            ref = callback
        with self._lock:
            subscribers = self._subscribers
            if len(subscribers) >= self._prune_at:  # amortized: the threshold doubles
                subscribers = self._subscribers = [
                    r for r in subscribers if _resolve(r) is not None
                ]
                self._prune_at = max(16, 2 * len(subscribers))
            subscribers.append(ref)

    def __repr__(self) -> str:
        return f"FakeClock(now={self._now!r})"


def _resolve(
    ref: weakref.WeakMethod[Callable[[], None]] | Callable[[], None],
) -> Callable[[], None] | None:
    """The subscriber behind ``ref``, or None once it was collected."""
    return ref() if isinstance(ref, weakref.WeakMethod) else ref
