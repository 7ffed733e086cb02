"""What every in-memory front shares: construction, collaborators, event wiring.

A front owns one ``Core`` and serializes calls into it; it never decides a
rule. This base holds what is the same for the threading and asyncio fronts:
the options (``QueueOptions``) resolved into a clock, a rate limiter and a
core, asking the limiter for a delay, the subscribers and metrics wiring
(``Subscribers``, with the queue as its re-entry guard), gauges and repr.

The fronts are compiled (``keyqueue._build``), so they are written for mypyc:
keys are ``Any`` here (the public classes in ``_queues`` add the key type),
every argument a front checks itself is ``Any`` too (a compiled function would
otherwise reject or convert it before the check: ``True`` as a timeout), and
the fronts allow interpreted subclasses, which is what the public classes are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from ._build import mypyc_attr
from ._checks import check_number, check_priority
from ._clock import Clock, resolve_clock
from ._core import Core
from ._events import Observer, Subscribers
from ._metrics import QueueGauges
from ._options import QueueOptions
from ._ratelimit import RateLimiter, default_controller_rate_limiter

__all__ = ["QueueBase", "drain_timed_out", "dropped_at_shutdown", "unfinished"]

logger: Final = logging.getLogger("keyqueue")


@mypyc_attr(allow_interpreted_subclasses=True)
class QueueBase:
    """State and collaborators shared by ``WorkQueue`` and ``AsyncWorkQueue``.

    Built from a ``QueueOptions`` (the fronts' constructors make it from their
    arguments). Not generic, and weakly referenced only through a subclass: a
    compiled generic class gets a weakref slot its deallocator never clears
    (mypyc/mypyc#1102), while an interpreted subclass of a class without one
    gets its own, cleared as usual.
    """

    def __init__(self, options: QueueOptions) -> None:
        name = options.name
        self.name: str = name
        """The queue's name, as given (its metrics label)."""
        self._clock = resolve_clock(options.clock)
        self._now = self._clock.now
        self._core: Core[Any] = Core(options.max_retries, options.aging, options.fair_by)
        rate_limiter = options.rate_limiter
        if rate_limiter is None:
            rate_limiter = default_controller_rate_limiter(self._clock)
        elif not isinstance(rate_limiter, RateLimiter):
            raise TypeError(
                f"rate_limiter must have when/forget/num_requeues, got {rate_limiter!r}"
            )
        self._rate_limiter: RateLimiter = rate_limiter
        # Ident of the thread running this queue's subscribe() callbacks, 0 when
        # none runs (``Subscribers`` sets it: the queue subscribes as its guard).
        # A call from one would deadlock on the queue's lock (or re-enter the
        # core mid-transition), so each method tests it first. Only a queue
        # with subscribers ever sets it.
        self._emitting: int = 0
        # Callbacks run after the core changed state; an exception in one is
        # logged and never reaches the caller (a failing metrics backend must
        # not leave a key held by nobody).
        self._subscribers = Subscribers(
            name, options.metrics.new_queue_metrics(name, self._gauges), _installer(self._core)
        )

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
    def fair_by(self) -> Callable[[Any], str] | None:
        """A key's group: keys are handed out round-robin across groups within a
        priority, FIFO within a group (None: FIFO across the queue)."""
        return self._core.fair_by

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
        shutdown (the add is a no-op, and the limiter records nothing), unless
        the queue drains and ``key`` is held (its backoff is taken, as ``retry``'s).

        The key, the priority and the key's group (``fair_by``) are checked
        before the limiter records the failure, its answer after
        (``check_add_after``'s rule): bad input raises and the queue changes
        nothing.
        """
        hash(key)
        core = self._core
        if core.shutting_down and not core.backs_off_draining(key):
            return None
        if priority:
            check_priority(priority)
        if core.fair_by is not None:
            core.check_group(key)
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

    def __repr__(self) -> str:
        core = self._core
        state = "shutting down" if core.shutting_down else "running"
        return (
            f"<{type(self).__name__} {self.name!r} {state}: {len(core.waiting)} waiting, "
            f"{len(core.processing)} processing, {len(core.delayed)} delayed>"
        )


def unfinished(core: Core[Any]) -> tuple[int, int, int, int]:
    """What keeps ``core`` from being idle: keys waiting, pending redelivery,
    held and delayed (under the front's lock, or on its loop)."""
    waiting = len(core.waiting)
    return waiting, len(core.dirty) - waiting, len(core.processing), len(core.delayed)


def dropped_at_shutdown(name: str, dropped: int, drain: bool) -> None:
    """Say that a shutdown dropped ``dropped`` delayed keys (not silently)."""
    logger.info(
        "keyqueue %r: shutdown dropped %d delayed key(s) (%s); snapshot() before "
        "shutdown lists them",
        name,
        dropped,
        "looks scheduled for later with add_after: a drain keeps only keys backing off"
        if drain
        else "no drain: delays and backoffs alike",
    )


def drain_timed_out(name: str, timeout: float | None, left: tuple[int, int, int, int]) -> None:
    """Say that a drain of the queue ``name`` timed out, and what it left queued."""
    waiting, pending, held, delayed = left
    logger.warning(
        "keyqueue %r: the drain timed out after %.3g s; left queued, not given up: %d "
        "waiting, %d pending redelivery, %d held, %d backing off (snapshot() lists them; "
        "the workers go on with them until the queue is idle or they are stopped)",
        name,
        timeout,
        waiting,
        pending,
        held,
        delayed,
    )


def _installer(core: Core[Any]) -> Callable[[Observer | None], None]:
    """What points ``core`` at its queue's observer (``Subscribers``' ``install``)."""

    def install(observer: Observer | None) -> None:
        core.observer = observer

    return install
