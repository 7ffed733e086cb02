"""What a Redis queue client runs on its own: the lease renewal loop and the reap timer.

The renewal loop renews every lease the client holds in one call, every third
of a lease (sooner to reach a hold's local deadline, in the replicated mode:
``Holds.next_wake``), while it holds any (``Holds`` starts it when the first hold is
taken; it ends when a renewal finds none, or at close). The thread or task
holds its renewer, and so the queue, only weakly (strongly only while it
renews), so a queue that is dropped while holding keys is collected and its
leases run out; so does the threading driver's reap timer. The reap timer
runs the queue's ``reap`` when something comes due that a getter waits for
(``Getters`` arms it: ``BLPOP``'s timeout is coarser). On threads: a daemon
thread and a ``threading.Timer`` (``Renewer``, ``ReapTimer``); on asyncio: a
task and a loop timer (``AsyncRenewer``, ``AsyncReapTimer``, which also reaps
when a virtual clock moves).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ._config import QueueConfig
from ._durability import NotReplicated
from ._holds import Holds
from ._replies import Reports

__all__ = ["AsyncReapTimer", "AsyncRenewer", "ReapTimer", "Renewer", "on_loop"]

logger = logging.getLogger("keyqueue")


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the calling thread is running ``loop``."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


class _Renewal:
    """What both renewal loops know: the holds, the renewal, when and how to
    report a failed one. The loop holds its renewer (and so the queue) only
    weakly, and strongly only while it renews."""

    def __init__(
        self, cfg: QueueConfig, holds: Holds, reports: Reports, renew: Callable[[], Any]
    ) -> None:
        self.holds = holds
        self.renew = renew  # the driver's: renew every live hold; False when none is left
        self.interval = cfg.lease / 3
        self.name = cfg.name
        self.reports = reports
        self.unsent = cfg.unsent  # whether nothing was sent

    def failed(self, exc: Exception) -> None:
        """A renewal raised (the client still open): one warning, unless
        the client said it already (no free connection; replicas behind)."""
        said = self.unsent(exc) or isinstance(exc, NotReplicated)
        self.reports.renewal_failed(self.wake(), said)

    def wake(self) -> float:
        """Seconds until the next renewal (``Holds.next_wake``)."""
        return self.holds.next_wake(self.interval)


class Renewer(_Renewal):
    """The threading driver's renewal loop: a daemon thread, ended by ``stop``
    (``close`` sets it; tests set it to play a process that stalls)."""

    def __init__(
        self,
        cfg: QueueConfig,
        holds: Holds,
        reports: Reports,
        renew: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        super().__init__(cfg, holds, reports, renew)
        self.stop = stop

    def start(self) -> None:
        """Start the loop unless one runs (or the client is closed)."""
        holds = self.holds
        with holds.lock:
            if holds.renewer is not None or self.stop.is_set():
                return
            renewer = threading.Thread(
                target=_renew_thread,
                args=(weakref.ref(self), self.interval, self.stop),
                name=f"keyqueue-renew-{self.name}",
                daemon=True,
            )
            holds.renewer = renewer
            renewer.start()


def _renew_thread(ref: weakref.ref[Renewer], interval: float, stop: threading.Event) -> None:
    """Every ``interval`` (or sooner: ``wake``), renew the client's leases in
    one call. Ends when the client holds nothing, is closed (``stop``), or
    was dropped."""
    wait = interval
    while not stop.wait(wait):
        renewer = ref()
        if renewer is None:
            return
        try:
            if not renewer.renew():
                return
        except Exception as exc:
            if stop.is_set():  # closed meanwhile
                return
            renewer.failed(exc)
        finally:
            wait = renewer.wake()
            del renewer


class AsyncRenewer(_Renewal):
    """The asyncio driver's renewal loop: a task on the queue's loop."""

    def __init__(
        self, cfg: QueueConfig, holds: Holds, reports: Reports, renew: Callable[[], Awaitable[bool]]
    ) -> None:
        super().__init__(cfg, holds, reports, renew)
        self.closed = False

    def start(self) -> None:
        """Start the loop unless one runs (or the client is closed)."""
        if self.holds.renewer is None and not self.closed:
            self.holds.renewer = asyncio.get_running_loop().create_task(
                _renew_task(weakref.ref(self), self.interval), name=f"keyqueue-renew-{self.name}"
            )

    def close(self) -> None:
        """Stop renewing (the client closes)."""
        self.closed = True
        renewer, self.holds.renewer = self.holds.renewer, None
        if isinstance(renewer, asyncio.Task):
            renewer.cancel()


async def _renew_task(ref: weakref.ref[AsyncRenewer], interval: float) -> None:
    """Every ``interval``, renew the client's leases in one call.

    Ends at ``close`` even if the cancellation it sends is lost (Python
    3.11's asyncio.wait_for inside redis.asyncio can swallow one): renewing
    after the close would keep a dead client's keys held.
    """
    wait = interval
    while True:
        await asyncio.sleep(wait)
        renewer = ref()
        if renewer is None or renewer.closed:
            return
        try:
            if not await renewer.renew():
                return
        except Exception as exc:
            if renewer.closed:
                return
            renewer.failed(exc)
        finally:
            wait = renewer.wake()
            del renewer


class ReapTimer:
    """The threading driver's reap timer: a ``threading.Timer`` at the earliest
    due time asked for, which runs ``reap`` (held weakly) and so rings the
    doorbell for the getters."""

    def __init__(
        self,
        lock: threading.Lock,
        reap: Callable[[], object],
        closed: Callable[[], bool],
        name: str,
    ) -> None:
        self._lock = lock  # the holds' lock: guards _timer and _at
        self._reap = weakref.WeakMethod(reap)
        self._closed = closed
        self._name = name
        self._timer: threading.Timer | None = None
        self._at = 0.0  # monotonic time the timer fires

    def arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds, unless the timer fires sooner already."""
        at = time.monotonic() + due
        with self._lock:
            if self._timer is not None and self._at <= at:
                return
            if self._timer is not None:
                self._timer.cancel()
            timer = self._timer = threading.Timer(due, self._tick)
            self._at = at
        timer.daemon = True
        timer.start()

    def cancel(self) -> None:
        """The client closes: the timer, if armed, does not fire."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
        reap = self._reap()
        if reap is None:
            return
        try:
            reap()
        except NotReplicated:
            pass  # said once per episode; any later script reaps again
        except Exception:
            if not self._closed():
                logger.warning("keyqueue %r: releasing due keys failed", self._name, exc_info=True)


class AsyncReapTimer:
    """The asyncio driver's reap timer: a loop timer that starts ``reap`` as a
    task of the queue's (``spawn``)."""

    def __init__(
        self,
        reap: Callable[[], Coroutine[Any, Any, None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        closed: Callable[[], bool],
        name: str,
    ) -> None:
        self._reap = reap
        self._spawn = spawn
        self._closed = closed
        self._name = name
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds, unless the timer fires sooner already."""
        loop = asyncio.get_running_loop()
        at = loop.time() + due
        if self._timer is not None and self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._fire)

    def cancel(self) -> None:
        """The client closes: the timer, if armed, does not fire."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def step(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """A virtual clock moved: run ``reap`` on ``loop`` (the queue's; None:
        none yet). From another thread, before ``step`` returns; on the
        loop's own thread, on the loop's next turn (a step cannot wait for
        the loop it runs on)."""
        if loop is None or loop.is_closed():
            return
        if on_loop(loop):
            self._spawn(self._reap())
        else:
            asyncio.run_coroutine_threadsafe(self._reap(), loop).result()

    def _fire(self) -> None:
        self._timer = None
        self._spawn(self._tick())

    async def _tick(self) -> None:
        try:
            await self._reap()
        except NotReplicated:
            pass  # said once per episode; any later script reaps again
        except Exception:
            if not self._closed():
                logger.warning("keyqueue %r: releasing due keys failed", self._name, exc_info=True)
