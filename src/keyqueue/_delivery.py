"""Handing an informer's changes to its handlers: in order per key, a bounded number in flight.

Theory of operation
-------------------
A handler is plain (``WorkQueue.add``, ``AsyncWorkQueue.add``: the change is
handled when it returns) or returns an awaitable (``AsyncRedisWorkQueue.add``,
an ``async def``, a ``RedisWorkQueue.add`` sent to a thread: the change is
handled when that completes). The informer hands ``deliver`` each change in
the order its watch delivered them; ``deliver`` gives it to every handler in
turn, each finishing before the next begins.

- In line while it can. A change whose key has nothing in flight goes to the
  handlers at once, on the caller's task; while each returns a plain value,
  nothing is allocated and nothing waits, so a ``WorkQueue`` costs what it
  always cost.
- A bounded pipeline. A handler that returns an awaitable moves the rest of
  its change (that awaitable, then the handlers after it) into a task: a
  delivery in flight. At most ``limit`` are in flight: ``deliver`` waits for
  room before it begins a change, so a slow server stops the informer reading
  its watch (TCP carries the back-pressure to the API server) instead of
  piling up tasks and events.
- Per-key order. A change whose key has a delivery in flight waits in a task
  for that one first: one chain per key, whose last link is in ``_tails``.
  Changes of different keys may overtake each other; a queue does not care,
  and a handler that reads the informer's cache reads the latest object
  anyway.
- Connection errors are not failures. A handler that raises one
  (``is_connection_error``: the server is down, restarting, unreachable) is
  called again with the same change after a back-off (``RETRY_INITIAL``
  doubling to ``RETRY_MAX``, each stretched by a uniform factor in ``[1,
  2)``), until it returns or the informer stops; the later changes of its key
  wait behind it. Any other exception is logged, and the change goes on to
  the next handler, as it always did.
- Stopping. ``close`` cancels what is in flight and logs how many changes it
  did not finish: none is dropped without a word.
- Timing, only when asked. With a ``processed`` observer installed, each
  change's processing time (from ``_begin`` until its last handler returned,
  or its delivery in flight ended) goes to it; a delivery cancelled by
  ``close`` reports nothing. Without one, ``_begin`` pays one test of an empty
  tuple and one call more, and reads no clock.

Why a bounded pipeline rather than an ``await`` of each add in line: in line,
the informer waits one round trip per event, so a relist of N keys takes N
round trips in series (2,000 keys: about a second against a local Valkey;
docs/DESIGN.md has the figures); ``limit`` in flight take about N/limit, and
``limit=1`` is the in-line await. The bound is also what a ``RedisWorkQueue``
(blocking) costs: each of its adds runs in a thread (``asyncio.to_thread``),
at most ``limit`` at once.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import logging
import random
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["RETRY_INITIAL", "RETRY_MAX", "Deliveries", "is_connection_error"]

logger = logging.getLogger("keyqueue.informer")

C = TypeVar("C")

RETRY_INITIAL = 0.05
"""Seconds before the first call again of a handler that could not connect."""
RETRY_MAX = 5.0
"""The longest wait between two calls (before the jitter stretches it by up to 2x)."""

# An OSError with one of these means the network or the peer, not the handler.
_NETWORK_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "EPIPE",
        "ETIMEDOUT",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "ENOTCONN",
    )
    if hasattr(errno, name)
)


def is_connection_error(exc: BaseException) -> bool:
    """True for an error that says the server could not be reached or answered too late.

    ``ConnectionError`` and ``TimeoutError`` (the built-ins, ``asyncio``'s
    included), a name that did not resolve (``socket.gaierror``), any
    ``OSError`` with a network ``errno``, and redis-py's ``ConnectionError``
    and ``TimeoutError`` (read from ``sys.modules``: redis is never imported
    here). A ``FileNotFoundError`` or a ``PermissionError`` is the handler's
    own failure, not the network's.
    """
    if isinstance(exc, ConnectionError | TimeoutError | socket.gaierror):
        return True
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return True
    exceptions = sys.modules.get("redis.exceptions")
    if exceptions is not None:
        return isinstance(exc, exceptions.ConnectionError | exceptions.TimeoutError)
    return False


def retry_delay(attempt: int) -> float:
    """Seconds to wait before call ``attempt + 1`` of a handler (``attempt`` from 0)."""
    return min(RETRY_MAX, RETRY_INITIAL * 2.0**attempt) * (1.0 + random.random())


class Deliveries(Generic[C]):
    """Every change to every handler in ``handlers`` (a live list), in order per key.

    ``limit``: most deliveries in flight at once (>= 1). ``sleep``: the
    back-off's sleep (the informer's clock's, so a test's clock steps it).
    ``now``: the clock that times each change for the ``processed`` observers
    (read only while one is installed).
    """

    def __init__(
        self,
        handlers: list[Callable[[C], Awaitable[None] | None]],
        limit: int,
        sleep: Callable[[float], Awaitable[None]],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handlers = handlers
        self._limit = limit
        self._sleep = sleep
        self._now = now
        # Each is called with the seconds a change took, once every handler
        # handled it; a tuple swapped whole, so _begin reads it without a lock.
        self._processed: tuple[Callable[[float], None], ...] = ()
        # Deliveries in flight -> the awaitable each began with (None: none),
        # closed by ``close`` if the task never got to await it. At most ``limit``.
        self._flight: dict[asyncio.Task[None], Awaitable[None] | None] = {}
        # key -> its last delivery in flight: a later change of the key waits for it.
        # Every value is in ``_flight``; a task leaves both when it ends.
        self._tails: dict[str, asyncio.Task[None]] = {}
        # Set when a delivery ends: whoever waits for room looks again.
        self._room: asyncio.Event | None = None
        self.retries = 0
        """Handler calls made again after a connection error."""
        self.peak = 0
        """The most deliveries in flight at once so far."""

    @property
    def in_flight(self) -> int:
        """Changes some handler is still handling (each awaiting, or waiting its turn)."""
        return len(self._flight)

    def deliver(self, key: str, change: C) -> Awaitable[None] | None:
        """Hand ``change`` (of ``key``) to the handlers: None if it is handled or in
        flight already; else (``limit`` in flight) an awaitable to await, which
        waits for room and then does so. No coroutine is made when none waits."""
        if len(self._flight) >= self._limit:
            return self._deliver_with_room(key, change)
        self._begin(key, change)
        return None

    async def _deliver_with_room(self, key: str, change: C) -> None:
        while len(self._flight) >= self._limit:
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()
        self._begin(key, change)

    def observe_processed(self, observer: Callable[[float], None]) -> Callable[[], None]:
        """Call ``observer(seconds)`` for each change begun from now on, once every
        handler has handled it (see the module); returns the function that stops it.
        An exception from ``observer`` is logged."""
        self._processed = (*self._processed, observer)

        def stop() -> None:
            observers = list(self._processed)
            if observer in observers:
                observers.remove(observer)
                self._processed = tuple(observers)

        return stop

    def _begin(self, key: str, change: C) -> None:
        if not self._processed:
            self._hand(key, change)
            return
        started = self._now()
        task = self._hand(key, change)
        if task is None:
            self._report(started)
        else:
            task.add_done_callback(functools.partial(self._report_delivery, started))

    def _report_delivery(self, started: float, task: asyncio.Task[None]) -> None:
        if not task.cancelled():
            self._report(started)

    def _report(self, started: float) -> None:
        seconds = max(0.0, self._now() - started)
        for observer in self._processed:
            try:
                observer(seconds)
            except Exception:
                logger.exception("informer: processed observer %r raised", observer)

    def _hand(self, key: str, change: C) -> asyncio.Task[None] | None:
        """``change`` to the handlers: None if they all handled it in line, else
        the delivery in flight that goes on with it."""
        tail = self._tails.get(key)
        handlers = list(self._handlers)  # a handler may remove itself meanwhile
        if tail is not None:
            return self._start(key, self._rest(key, change, handlers, 0, None, None, tail), None)
        for at, handler in enumerate(handlers):
            try:
                result = handler(change)
            except Exception as exc:
                if is_connection_error(exc):
                    rest = self._rest(key, change, handlers, at, None, exc, None)
                    return self._start(key, rest, None)
                _log_failure(handler, key, exc)
                continue
            if result is not None and inspect.isawaitable(result):
                rest = self._rest(key, change, handlers, at, result, None, None)
                return self._start(key, rest, result)
        return None

    async def join(self) -> None:
        """Wait until nothing is in flight."""
        while self._flight:
            await asyncio.wait(list(self._flight))

    async def close(self) -> int:
        """Cancel every delivery in flight; how many changes were not fully handled.

        Logs a warning naming the count when there were any.
        """
        flight = dict(self._flight)
        for task in flight:
            task.cancel()
        if flight:
            await asyncio.wait(flight)
        for began in flight.values():
            # A task cancelled before its first step never awaited what it was given.
            if inspect.iscoroutine(began) and inspect.getcoroutinestate(began) == "CORO_CREATED":
                began.close()
        if flight:
            logger.warning(
                "informer stopped: %d change(s) not handled by every handler (%s)",
                len(flight),
                ", ".join(sorted({k for k, t in self._tails.items() if t in flight})[:5])
                or "in flight",
            )
        self._tails.clear()
        self._flight.clear()
        return len(flight)

    # -- in flight ---------------------------------------------------------------------

    def _start(
        self, key: str, rest: Awaitable[None], began: Awaitable[None] | None
    ) -> asyncio.Task[None]:
        task = asyncio.ensure_future(rest)
        self._flight[task] = began
        self._tails[key] = task
        self.peak = max(self.peak, len(self._flight))
        task.add_done_callback(functools.partial(self._ended, key))
        return task

    def _ended(self, key: str, task: asyncio.Task[None]) -> None:
        self._flight.pop(task, None)
        if self._tails.get(key) is task:
            del self._tails[key]
        if self._room is not None:
            self._room.set()

    async def _rest(
        self,
        key: str,
        change: C,
        handlers: Sequence[Callable[[C], Awaitable[None] | None]],
        at: int,
        pending: Awaitable[None] | None,
        error: Exception | None,
        after: asyncio.Task[None] | None,
    ) -> None:
        """``handlers[at:]`` on ``change``, after ``after`` (the key's previous change).

        ``handlers[at]`` was called already if ``pending`` (what it returned)
        or ``error`` (what it raised) is given.
        """
        if after is not None:
            await asyncio.wait((after,))
        for handler in handlers[at:]:
            await self._handle(handler, change, key, pending, error)
            pending = error = None

    async def _handle(
        self,
        handler: Callable[[C], Awaitable[None] | None],
        change: C,
        key: str,
        pending: Awaitable[None] | None,
        error: Exception | None,
    ) -> None:
        """``handler`` on ``change`` to its end, calling it again after a connection error."""
        attempt = 0
        while True:
            if error is None:
                try:
                    if pending is None:
                        result = handler(change)
                        if result is None or not inspect.isawaitable(result):
                            return
                        pending = result
                    await pending
                    return
                except Exception as exc:
                    if not is_connection_error(exc):
                        _log_failure(handler, key, exc)
                        return
                    error = exc
            delay = retry_delay(attempt)
            attempt += 1
            self.retries += 1
            logger.warning(
                "informer handler %r could not connect for %s (%s); calling it again in %.2fs",
                handler,
                key,
                error,
                delay,
            )
            pending = error = None
            await self._sleep(delay)


def _log_failure(handler: object, key: str, exc: Exception) -> None:
    logger.error("informer handler %r raised for %s", handler, key, exc_info=exc)
