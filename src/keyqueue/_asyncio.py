"""The asyncio front: the same core, waited on with futures instead of a lock.

All state changes happen on the queue's event loop, one call at a time, so no
lock is needed. Getters wait on futures in FIFO order (as ``asyncio.Queue``);
a pushed key wakes one, shutdown and exhaustion wake all. A cancelled ``get``
passes on a wake-up it may have consumed, so no key sits unclaimed while
another getter waits.

Which loop: the queue binds to the event loop running when it is created; if
none is, to the loop of the first call made from inside a running loop (an
``await`` on it, or an ``add`` from a coroutine). After that, a ``get`` that has to
wait, or a ``shutdown``, from another loop raises ``RuntimeError``. ``add``, ``add_after`` and
``add_rate_limited`` are safe from any thread: off the loop's thread they hop
onto it with ``call_soon_threadsafe`` (so the add lands a moment later). Before
the queue is bound, use it from one thread only.

Delays: one ``loop.call_at`` timer per queue, armed for the earliest ready time.
With a virtual clock (``FakeClock``) there is no timer: the clock calls the
queue when it steps, and due keys are released before ``step`` returns (or, if
stepped from another thread, on the loop's next turn).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from threading import get_ident
from typing import Any, TypeVar

from ._clock import Clock, VirtualClock
from ._errors import ShutDown
from ._events import Event, EventKind
from ._front import QueueBase, check_timeout
from ._metrics import MetricsProvider
from ._ratelimit import RateLimiter
from ._runner import Requeue, RunStats, check_handler, logger, release, run_stats, settle

__all__ = ["AsyncWorkQueue", "arun_workers"]

K = TypeVar("K")

_DELAY = EventKind.DELAY
_RATE_LIMIT = EventKind.RATE_LIMIT


class AsyncWorkQueue(QueueBase[K]):
    """An asyncio work queue with client-go's semantics (see DESIGN.md).

    The same rules as ``WorkQueue``, on the same core: coalescing, one
    redelivery, per-key exclusion, delays, rate limiting, retries, stats,
    events and metrics. ``get`` and ``shutdown`` are coroutines; everything
    else is a plain method that never blocks.

    From another thread, shut down with
    ``asyncio.run_coroutine_threadsafe(q.shutdown(drain=True), loop).result()``.
    """

    def __init__(
        self,
        name: str = "",
        *,
        rate_limiter: RateLimiter | None = None,
        max_retries: int | None = None,
        clock: Clock | None = None,
        metrics: MetricsProvider | None = None,
    ) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None  # ident of the loop's thread once bound
        # Futures of coroutines blocked in get, oldest first; one is resolved
        # per pushed key, all at shutdown and when a shut-down queue runs dry.
        self._getters: deque[asyncio.Future[None]] = deque()
        # Futures of shutdown(drain=True) callers; resolved when the queue is idle.
        self._drainers: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed: float | None = None  # ready time (queue clock) the timer is set for
        super().__init__(
            name, rate_limiter=rate_limiter, max_retries=max_retries, clock=clock, metrics=metrics
        )
        self._virtual = isinstance(self._clock, VirtualClock)
        if self._virtual:
            self._clock.subscribe(self._on_clock_step)  # type: ignore[attr-defined]
        try:
            self._bind(asyncio.get_running_loop())
        except RuntimeError:
            pass

    # -- loop binding --------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is None:
            self._loop, self._thread = loop, get_ident()
            self._arm()
        elif loop is not self._loop:
            raise RuntimeError(f"AsyncWorkQueue {self.name!r} is bound to a different event loop")

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self._bind(loop)
        return loop

    def _off_loop(self, fn: Callable[..., None], *args: Any) -> bool:
        """Called off the loop's thread (or unbound): hop, bind, or run here.

        Returns True if the call was handled (handed to the loop, or dropped
        because the queue is shut down: adds after shutdown are no-ops, even
        once the loop is closed).
        """
        if self._core.shutting_down:
            return True
        loop = self._loop
        if loop is None:
            try:
                self._bind(asyncio.get_running_loop())
            except RuntimeError:
                pass  # no loop anywhere yet: apply directly, single-threaded
            return False
        loop.call_soon_threadsafe(fn, *args)
        return True

    # -- adding --------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Mark ``key`` for processing. Never blocks; safe from any thread.

        From another thread the add lands on the loop a moment later; its time
        is read there, so times follow the order in which transitions happen.
        """
        if self._thread != get_ident() and self._off_loop(self._add, key):
            return
        if self._core.add(key, self._now()) and self._getters:
            self._wake_one()

    def _add(self, key: K) -> None:  # add, on the loop's thread
        if self._core.add(key, self._now()) and self._getters:
            self._wake_one()

    def add_after(self, key: K, seconds: float) -> None:
        """Add ``key`` once ``seconds`` have passed on the queue's clock (safe from any thread).

        One delayed entry per key, the earliest ready time wins; ``seconds <= 0``
        adds now. A no-op after shutdown.
        """
        self._add_after(key, seconds, _DELAY)

    def add_rate_limited(self, key: K) -> None:
        """``add_after(key, rate_limiter.when(key))`` (safe from any thread).

        A no-op after shutdown (the limiter records nothing either).
        """
        if not self._core.shutting_down:
            self._add_after(key, self._rate_limiter.when(key), _RATE_LIMIT)

    def _add_after(self, key: K, seconds: float, kind: EventKind) -> None:
        if math.isnan(seconds):  # raise here, in the caller's thread
            raise ValueError("add_after: delay must be a number of seconds, got nan")
        now = self._now()  # the delay runs from the call, also when it hops threads
        if self._thread != get_ident() and self._off_loop(
            self._add_after_now, key, seconds, now, kind
        ):
            return
        self._add_after_now(key, seconds, now, kind)

    def _add_after_now(self, key: K, seconds: float, now: float, kind: EventKind) -> None:
        if self._core.add_after(key, seconds, now, kind):
            if self._getters:
                self._wake_one()
        else:
            self._arm()

    def forget(self, key: K) -> None:
        """``key`` succeeded: clear its backoff and failure count."""
        self._rate_limiter.forget(key)
        self._core.forget(key)

    def retry(self, key: K) -> bool:
        """Record a failure of ``key``: False once it failed ``max_retries`` times or
        while shutting down (give up, then ``forget`` it), else ``add_rate_limited``."""
        again = self._core.record_failure(key)
        if again:
            self.add_rate_limited(key)
        return again

    # -- getting -------------------------------------------------------------------

    def get_nowait(self) -> K:
        """The oldest waiting key, now held until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once the queue is shut
        down and nothing is left to hand out.
        """
        core = self._core
        key = core.get(self._now())
        if self._getters and core.exhausted:
            self._wake_all(self._getters)
        return key

    async def get(self) -> K:
        """Wait for a key and hold it until ``done``.

        Raises ``ShutDown`` once the queue is shut down and nothing waiting or
        pending redelivery is left. Cancelling a waiting ``get`` loses no key.
        """
        core = self._core
        while not core.fifo and not core.exhausted:
            getter = self._running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()  # in case it was not done yet
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if core.fifo and not getter.cancelled():
                    self._wake_one()  # pass on the wake-up we were given
                raise
        key = core.get(self._now())  # as get_nowait, inlined: this is the hot path
        if self._getters and core.exhausted:
            self._wake_all(self._getters)
        return key

    def done(self, key: K) -> None:
        """Release ``key``; if it was added meanwhile it is queued again, once.

        Raises ``ValueError`` if ``key`` is not being processed. Call it on the
        queue's loop.
        """
        core = self._core
        if core.done(key, self._now()):
            if self._getters:
                self._wake_one()
        elif self._drainers and core.idle:
            self._wake_all(self._drainers)

    # -- shutdown ------------------------------------------------------------------

    async def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        """Stop accepting adds; waiting keys are still handed out, delayed ones dropped.

        Keys marked while processing are still redelivered; waiting ``get``
        calls raise ``ShutDown`` once nothing is left for them. With
        ``drain=True``, wait until nothing waits, is pending or is processing,
        or ``timeout`` (wall seconds) passes. Returns False only when a drain
        timed out. Do not drain from a task that holds a key.
        """
        check_timeout(timeout)
        loop = self._running_loop()
        core = self._core
        core.shutdown(self._now())
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._armed = None
        self._wake_all(self._getters)
        if not drain:
            return True
        try:
            async with asyncio.timeout(None if timeout == math.inf else timeout):
                while not core.idle:
                    drainer = loop.create_future()
                    self._drainers.append(drainer)
                    await drainer
        except TimeoutError:
            return False
        return True

    # -- waking --------------------------------------------------------------------

    def _wake_one(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    @staticmethod
    def _wake_all(waiters: deque[asyncio.Future[None]] | list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()

    # -- time ----------------------------------------------------------------------

    def _arm(self) -> None:
        """Make sure the loop timer fires by the earliest ready time.

        On a virtual clock there is no timer, but an entry that hopped threads
        may already be due (the clock stepped meanwhile): release it now.
        """
        ready, loop = self._core.next_ready, self._loop
        if ready is None:
            return
        if self._virtual:
            if ready <= self._now():
                self._release_due()
            return
        if loop is None:
            return
        if self._armed is not None and self._armed <= ready:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._armed = ready
        self._timer = loop.call_at(loop.time() + max(0.0, ready - self._now()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._armed = None
        self._release_due()
        self._arm()

    def _release_due(self) -> None:
        for _ in range(self._core.pop_due(self._now())):
            if not self._getters:
                break
            self._wake_one()

    def _on_clock_step(self) -> None:
        """A virtual clock moved: release what is due, on the loop's thread."""
        loop = self._loop
        if loop is None or self._thread == get_ident():
            self._release_due()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._release_due)

    # -- events --------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Event[K]], None]) -> Callable[[], None]:
        """Call ``callback(event)`` on every transition; returns an unsubscribe function.

        Callbacks run on the queue's loop, in transition order; keep them short
        and do not call the queue from one. A raising callback is logged.
        """
        return self._add_subscriber(callback)


async def _give_up(
    on_give_up: Callable[[Any, BaseException], object] | None, key: Any, error: BaseException
) -> None:
    if on_give_up is None:
        return
    try:
        result = on_give_up(key, error)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("on_give_up(%r) raised", key)


async def arun_workers(
    queue: AsyncWorkQueue[K],
    handler: Callable[[K], Awaitable[Requeue | None]],
    workers: int = 1,
    stop: asyncio.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> RunStats:
    """Process keys from ``queue`` with the async ``handler``, at most ``workers`` at once.

    Returns what was done, as ``RunStats``, when the queue is shut down and
    drained, or once ``stop`` is set and every in-flight handler has finished.
    Outcome rules as ``run_workers``: ``None`` → forget; ``Requeue()`` →
    ``add_rate_limited`` (not a failure); ``Requeue(after=s)`` → forget and
    ``add_after``; ``PermanentError`` → forget; other exceptions → ``retry``, and
    on give-up forget and ``on_give_up(key, exc)`` (sync or async). ``done`` is
    always called; an exception while applying the outcome is logged with the
    key and counted in ``RunStats.errors``, and the workers go on.

    Raises ``TypeError`` at once, before taking a key, if ``handler`` is not an
    ``async def`` (or an object whose ``__call__`` is one); a handler that
    returns something not awaitable fails that key with a ``TypeError``. If
    ``arun_workers`` is cancelled, each in-flight handler is cancelled, its key
    re-added (the change it was handling was not finished; a no-op after
    shutdown) and released with ``done``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    check_handler(handler, "arun_workers", want_async=True)
    idle: set[asyncio.Task[None]] = set()  # workers waiting in get: safe to cancel
    tally: Counter[str] = Counter()  # shared by the workers: they run on one loop
    stopping = False

    def stopped() -> bool:
        return stopping or (stop is not None and stop.is_set())

    async def work() -> None:
        me = asyncio.current_task()
        assert me is not None
        while not stopped():
            idle.add(me)
            try:
                key = await queue.get()
            except ShutDown:
                return
            except asyncio.CancelledError:
                if stopped():
                    return
                raise
            finally:
                idle.discard(me)
            tally["processed"] += 1
            outcome = "errors"
            try:
                result: object = None
                error: BaseException | None = None
                try:
                    pending = handler(key)
                    if inspect.isawaitable(pending):
                        result = await pending
                    else:
                        error = TypeError(
                            f"handler returned {pending!r} for {key!r}, not an awaitable"
                        )
                except asyncio.CancelledError:
                    queue.add(key)  # unfinished: hand it out again after done
                    raise
                except Exception as exc:
                    error = exc
                outcome, gave_up = settle(queue, key, result, error)
                if gave_up is not None:
                    await _give_up(on_give_up, key, gave_up)
            finally:
                tally[release(queue, key, outcome)] += 1

    async def watch_stop(event: asyncio.Event) -> None:
        nonlocal stopping
        await event.wait()
        stopping = True
        for task in list(idle):
            task.cancel()

    tasks = [
        asyncio.create_task(work(), name=f"keyqueue-worker-{queue.name}-{i}")
        for i in range(workers)
    ]
    watcher = asyncio.create_task(watch_stop(stop)) if stop is not None else None
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
    return run_stats([tally])
