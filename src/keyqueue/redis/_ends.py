"""Shutting a client down, and waiting for its holds to end: a drain, and ``join``'s looks.

``shut`` sets the shutdown flag (the getters refuse from then on).

A drain (``shutdown(drain=True)``) waits until this client holds no key:
no live hold, and none lost whose end is not known yet. ``Holds`` calls
``nothing_held`` when the last one ends, which wakes the drains and the
joiners. ``join`` waits for the whole queue instead, on the server: it looks
(the ``idle`` script) at once, again at once whenever this client lets go of
its last hold (its own ``done`` may have left the queue idle), otherwise
after ``JOIN_FIRST`` seconds, doubling to ``JOIN_MAX`` while the queue stays
busy. On threads: a condition of the client's lock and a count of the
moments the last hold ended, so a joiner misses none between its look and its
wait (``HoldEnds``); on asyncio: an event and the joiners' futures
(``AsyncHoldEnds``).

An asyncio client's close waits for the calls it made on its own (a doorbell
passed on, a reap, a put-back of a cancelled get's key: ``end_calls``), for
``CLOSE_WAIT`` seconds at most: a server that stops answering, on a client
without a socket timeout, would hold them, and so the close, for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable

from .._checks import check_flag, check_timeout
from .._events import EventKind
from ._bell import wait_until
from ._config import QueueConfig
from ._getters import Getters
from ._holds import Holds
from ._replies import Reports

__all__ = [
    "CLOSE_WAIT",
    "JOIN_FIRST",
    "JOIN_MAX",
    "AsyncHoldEnds",
    "HoldEnds",
    "drain_timeout",
    "end_calls",
    "join_pause",
    "shut",
]

logger = logging.getLogger("keyqueue")

CLOSE_WAIT = 5.0
"""Seconds ``AsyncRedisWorkQueue.aclose`` waits for the calls the queue made on
its own before it cancels those still running (``end_calls``)."""
JOIN_FIRST = 0.05  # seconds: join's first look again, after a look that found work
JOIN_MAX = 1.0  # join's looks slow down to one a second while the queue stays busy


def join_pause(previous: float) -> float:
    """How long ``join`` waits before it looks again unless this client
    lets go of its last hold first: ``JOIN_FIRST`` after a look that
    follows such a release (``previous`` 0), doubling to ``JOIN_MAX``."""
    return JOIN_FIRST if previous <= 0 else min(previous * 2, JOIN_MAX)


def shut(getters: Getters, reports: Reports, cfg: QueueConfig, wall: float) -> int:
    """Set this client's shutdown flag (emitting SHUTDOWN the first time,
    at ``wall``, the driver's ``time.time()``, or the virtual clock's now).

    Wakes the waiting getters that are not in ``BLPOP`` and returns how
    many are (0 or 1: the leader): each must be woken through the wake-up
    list. A getter checks the flag under the same lock before it waits, so
    none can block unseen after this.
    """
    first, leading = getters.shut()
    if first:
        reports.report(EventKind.SHUTDOWN, None, cfg.local(wall))
    return leading


def drain_timeout(drain: bool, timeout: float | None) -> float | None:
    """``shutdown``'s arguments, checked: its drain's ``timeout``."""
    check_flag(drain, "drain")
    return check_timeout(timeout)


def _holding(holds: Holds) -> bool:
    """Whether this client holds a key (the lock held): live, or lost and not ended."""
    return bool(holds.live or holds.lost)


class HoldEnds:
    """The threading driver's drains and joiners."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        # Notified (all) when this client's last hold ends; drainers and
        # joiners wait. ``ends`` counts those moments (under the lock), so a
        # joiner misses none between its look and its wait.
        self.changed = threading.Condition(holds.lock)
        self.ends = 0

    def nothing_held(self) -> None:
        """This client's last hold ended (``Holds``): wake the drains and joiners."""
        with self.holds.lock:
            self.ends += 1
            self.changed.notify_all()

    def drain(self, deadline: float | None) -> bool:
        """Wait until this client holds no key (True), or ``deadline``
        (monotonic; None: for ever) passes (False)."""
        with self.holds.lock:
            while _holding(self.holds):
                if not wait_until(self.changed, deadline):
                    return False
        return True

    def join(self, idle: Callable[[], bool], timeout: float | None) -> bool:
        """Look (``idle()``) until the queue is idle (True) or ``timeout``
        (wall seconds; None: for ever) passes (False), paced as the module says."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0
        while True:
            with self.holds.lock:
                seen = self.ends
            if idle():
                return True
            pause = join_pause(pause)
            wait = pause if deadline is None else min(pause, deadline - time.monotonic())
            if wait <= 0:
                return False
            with self.holds.lock:
                if self.ends == seen:
                    self.changed.wait(wait)
                if self.ends != seen:
                    pause = 0.0  # this client let go of its last hold: look now


class AsyncHoldEnds:
    """The asyncio driver's drains and joiners, on the queue's loop."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        self.no_holds: asyncio.Event | None = None  # made on the loop, set when nothing is held
        # Futures of join callers, resolved when this client's last hold ends.
        self.joiners: list[asyncio.Future[None]] = []

    def holds_taken(self) -> None:
        """This client took keys: a drain waits for them."""
        if self.no_holds is not None:
            self.no_holds.clear()

    def nothing_held(self) -> None:
        """This client's last hold ended (``Holds``): wake the drains and joiners."""
        if self.no_holds is not None:
            self.no_holds.set()
        joiners, self.joiners = self.joiners, []
        for joiner in joiners:
            if not joiner.done():
                joiner.set_result(None)

    async def drain(self, timeout: float | None) -> bool:
        """Wait until this client holds no key (True), or ``timeout`` (wall
        seconds; None: for ever) passes (False)."""
        holds = self.holds
        if self.no_holds is None:
            self.no_holds = asyncio.Event()
        with holds.lock:
            if not _holding(holds):
                return True
        self.no_holds.clear()
        try:
            async with asyncio.timeout(None if timeout == math.inf else timeout):
                while True:
                    with holds.lock:
                        if not _holding(holds):
                            return True
                    await self.no_holds.wait()
                    self.no_holds.clear()
        except TimeoutError:
            return False

    async def join(self, idle: Callable[[], Awaitable[bool]], timeout: float | None) -> bool:
        """As ``HoldEnds.join``, on the loop."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0
        while True:
            joiner = loop.create_future()  # before the look: a release meanwhile resolves it
            self.joiners.append(joiner)
            try:
                if await idle():
                    return True
                pause = join_pause(pause)
                wait = pause if deadline is None else min(pause, deadline - time.monotonic())
                if wait <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(joiner), wait)
                if joiner.done():
                    pause = 0.0  # this client let go of its last hold: look now
            finally:
                joiner.cancel()
                with contextlib.suppress(ValueError):
                    self.joiners.remove(joiner)


async def end_calls(calls: set[asyncio.Task[None]], name: str, within: float) -> None:
    """Wait until every task of ``calls`` (those added meanwhile too) has ended,
    for ``within`` seconds at most; cancel those still running then, with one
    WARNING naming them, and wait as long again for them to end. Returns
    within ``2 * within`` seconds whatever the tasks do.

    A task leaves ``calls`` by its done callback, on a later turn of the loop
    than the one it ended on, so the wait is for the tasks not done yet: it
    always yields to the loop. Awaiting tasks that are all done does not
    (``asyncio.gather`` of done tasks, on Python 3.12 and later, returns a
    future already done), so a wait on ``calls`` as they stand would spin
    without letting their callbacks run.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        running = [task for task in calls if not task.done()]
        if not running:
            return
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await asyncio.wait(running, timeout=remaining)
    logger.warning(
        "keyqueue %r: %d call(s) of the client's own still running %.3g s into its close "
        "(%s; the server does not answer?): cancelled. A key one would have put back "
        "comes back when its lease runs out",
        name,
        len(running),
        within,
        ", ".join(sorted(_call_name(task) for task in running)),
    )
    for task in running:
        task.cancel()
    await asyncio.wait(running, timeout=within)


def _call_name(task: asyncio.Task[None]) -> str:
    """What ``task`` runs (its coroutine's qualified name), for a log line."""
    return str(getattr(task.get_coro(), "__qualname__", task.get_name()))
