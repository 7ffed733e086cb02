"""The asyncio front: the same core, waited on with futures instead of a lock.

All state changes happen on the queue's event loop, one call at a time, so no
lock is needed. Getters wait on futures in FIFO order (as ``asyncio.Queue``);
a pushed key wakes one, shutdown and exhaustion wake all. A cancelled ``get``
passes on a wake-up it may have consumed, so no key sits unclaimed while
another getter waits.

Which loop: the queue binds to the event loop running when it is created; if
none is, to the loop of the first call made from inside a running loop (an
``await`` on it, or a plain method called from a coroutine). After that, ``get``
or ``shutdown`` from any other loop raises ``RuntimeError``. Before the queue is
bound, use it from one thread only.

Other threads: every plain method is safe from any thread. A call made off the
loop's thread goes into an inbox, which the loop applies in order. The inbox
takes no lock: any thread appends to a deque, and the one whose append finds
no turn of the loop scheduled (``_posted``) schedules one with
``call_soon_threadsafe``; on the loop, ``_apply_inbox`` first clears
``_posted``, then takes what is there. So a signal handler, ``__del__`` or
weakref callback that adds while its thread is itself inside an add cannot
deadlock. ``add``, ``add_after`` and ``add_rate_limited`` are fire and forget:
they check their arguments in the caller (so bad input raises there), post
the call and return. ``shutdown`` applies the inbox before it shuts the core
down, so an add that returned before ``shutdown`` was called is accepted (and
drained), as on ``WorkQueue``. ``done``, ``get_nowait``, ``retry``, ``forget``
and ``stats`` post the call, then block the caller until the loop has run it,
and return its result or raise its exception (``ValueError``, ``Empty``,
``ShutDown``) in the caller. If the loop is not running, or stops before it
takes the call, they raise ``RuntimeError`` and change nothing (rather than
hang). Every post checks that the loop is not closed: an add to a closed loop
raises ``RuntimeError`` too (nothing would ever take it), except after
shutdown, when adds are silent no-ops. ``len()``, ``shutting_down``,
``num_requeues`` and ``subscribe`` run in the caller (the first two are
informational). A blocking call from a thread the loop is itself blocked on
deadlocks, as any cross-thread wait does.

Delays: one ``loop.call_at`` timer per queue, armed for the earliest ready time.
The loop holds the timer, the timer only a weak reference to the queue, and
that reference's callback cancels the timer: a dropped queue is collected, and
leaves nothing in the loop's schedule. From another thread, a delay runs from
the call; an add now (``seconds <= 0``) takes its time on the loop, as ``add``
does. With a virtual clock (``FakeClock``) there is no timer: the clock calls
the queue when it steps, and due keys are released before ``step`` returns
(or, if stepped from another thread, on the loop's next turn).

This module is compiled (``keyqueue._build``); ``AsyncioFront`` is the whole
queue, and ``keyqueue.AsyncWorkQueue`` (``_queues``) is it, made generic.
Waking getters is done by module functions, not methods: a method called on
``self`` from compiled code is looked up by name when ``self`` is an instance
of an interpreted subclass (so that overrides work), which the hot path avoids.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from threading import Thread, current_thread, get_ident
from typing import Any, Final, TypeVar

from ._build import mypyc_attr
from ._checks import check_add_after, check_flag, check_keys, check_priority, check_timeout
from ._clock import VirtualClock
from ._dead import DeadKey, check_reason, describe
from ._errors import Empty
from ._events import EventKind, reentered
from ._front import QueueBase, drain_timed_out, dropped_at_shutdown, logger, unfinished
from ._options import options_for
from ._snapshot import Snapshot, check_limit
from ._stats import Stats

__all__ = ["AsyncioFront"]

T = TypeVar("T")


def _task_lookup() -> Callable[[Any], Any]:
    """``asyncio.current_task(loop)`` at C speed: it is a C function from
    Python 3.12; on 3.11 a Python one, so the C dict it reads (the task
    running, by loop) is looked up directly."""
    if sys.version_info < (3, 12):
        current = vars(asyncio.tasks).get("_current_tasks")
        if isinstance(current, dict):
            return current.get
    return asyncio.current_task


_DELAY: Final = EventKind.DELAY
_RATE_LIMIT: Final = EventKind.RATE_LIMIT
# Where this call runs, as cheaply as it can be told: every plain method
# compares it first with ``_loop_where``, what it was on the loop's thread
# with the loop running. Equal: on the loop, at once; otherwise ``_off_loop``
# decides (the loop's thread with its loop stopped counts as on the loop).
# From Python 3.12 the running loop (asyncio's C lookup, about 12 ns compiled;
# a loop has no ``__eq__``, so ``!=`` is identity); on 3.11 that lookup makes a
# getpid() system call (about 70 ns), so the thread's ident (about 20 ns).
# Typed ``object`` so that, compiled, either is compared as it comes.
_where: Final[Callable[[], object]] = (
    asyncio._get_running_loop if sys.version_info >= (3, 12) else get_ident
)
# The running loop of this thread, or None (asyncio's C-level lookup): ``get``
# checks it, since another loop may run later on the same thread.
_loop_here: Final = asyncio._get_running_loop
# The task a get hands its key to, named by a snapshot (``HeldKey.holder``).
_current_task: Final = _task_lookup()
_CALL_POLL: Final = 0.1  # wall seconds: how often a blocked foreign call checks the loop still runs


def _wake_one(getters: deque[asyncio.Future[None]]) -> None:
    """Resolve the oldest getter's future that is still pending."""
    while getters:
        getter = getters.popleft()
        if not getter.done():
            getter.set_result(None)
            return


def _wake_all(waiters: deque[asyncio.Future[None]] | list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)
    waiters.clear()


def _fire_timer(queue: weakref.ref[AsyncioFront]) -> None:
    """The loop timer's callback: release due keys if the queue still exists."""
    alive = queue()
    if alive is not None:
        alive._on_timer()


class _LoopTimer:
    """A queue's one loop timer: the handle, and the ready time (queue clock) it
    is armed for.

    Apart from the queue, so that the weak reference the handle holds can cancel
    it from its callback once the queue is collected: the loop would otherwise
    keep the handle in its schedule until it fires (for ever, for
    ``add_after(k, 1e300)``). That callback runs on whichever thread drops the
    queue; ``TimerHandle.cancel`` only marks the handle, and the loop drops it
    when it reaches it (or sweeps marked handles once they are many).
    """

    __slots__ = ("armed", "handle")

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None
        self.armed: float | None = None

    def cancel(self, _collected: object = None) -> None:
        """Disarm (also the queue's weakref callback)."""
        handle = self.handle
        self.handle = None
        self.armed = None
        if handle is not None:
            handle.cancel()


@mypyc_attr(allow_interpreted_subclasses=True)
class AsyncioFront(QueueBase):
    """The asyncio front: ``keyqueue.AsyncWorkQueue`` without its key type.

    Keys and checked arguments are ``Any`` (see ``_front``); the contract is
    written on each method, and the signatures users see on ``AsyncWorkQueue``.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # Ident of the loop's thread once bound. (Not ``_thread``: mypyc would
        # name its C field ``__thread``, a keyword of GCC's.)
        self._loop_thread: object = None
        # ``_where()`` on the loop's thread, its loop running (set by ``_bind``,
        # which runs there): the loop, or that thread's ident. None until bound.
        self._loop_where: object = None
        # Futures of coroutines blocked in get, oldest first; one is resolved
        # per pushed key, all at shutdown and when a shut-down queue runs dry.
        self._getters: deque[asyncio.Future[None]] = deque()
        # Futures of join and shutdown(drain=True) callers; resolved when the
        # queue goes idle (done, shutdown).
        self._joiners: list[asyncio.Future[None]] = []
        self._timer = _LoopTimer()
        # Calls from other threads, oldest first, as (function, args): any thread
        # appends, only _apply_inbox (on the loop) takes, and no lock is taken.
        # _posted is True from when a post decides to schedule _apply_inbox until
        # that call starts; a post that finds it True leaves its call to that
        # turn. Invariant: every call in the inbox is taken by a turn of
        # _apply_inbox that is scheduled or running (or by shutdown's).
        self._inbox: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._posted = False
        super().__init__(options_for(self, args, options))
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
            self._loop, self._loop_thread = loop, get_ident()
            self._loop_where = _where()  # every caller binds to the loop running here
            self._arm()
        elif loop is not self._loop:
            raise RuntimeError(f"AsyncWorkQueue {self.name!r} is bound to a different event loop")

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self._bind(loop)
        return loop

    # -- calls from other threads --------------------------------------------------

    def _off_loop(self) -> bool:
        """Called outside the queue's running loop: True if the call must go to it.

        False on the loop's own thread (its loop not running now, or a later
        loop there: nothing else can run the core meanwhile). An unbound queue
        binds to a loop running in this thread (then the call runs here, on it),
        or, with no loop anywhere yet, runs the call here.
        """
        if self._loop is not None:
            return self._loop_thread != get_ident()
        loop = _loop_here()  # None rather than an exception: an unbound queue asks every call
        if loop is not None:
            self._bind(loop)
        return False

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Put ``fn(*args)`` in the inbox; the loop applies it on its next turn.

        Takes no lock (see ``_inbox``). Raises ``RuntimeError`` if the loop is
        closed (nothing would ever take the call); an error scheduling the turn
        propagates as it is, and the call is withdrawn.
        """
        loop = self._loop
        assert loop is not None
        inbox = self._inbox
        if loop.is_closed():
            inbox.clear()  # calls posted before it closed: never to be taken
            raise RuntimeError(f"AsyncWorkQueue {self.name!r}: its event loop is closed")
        call = (fn, args)
        inbox.append(call)
        if self._posted:
            return  # a turn is scheduled and has not started: it takes this call
        self._posted = True
        try:
            loop.call_soon_threadsafe(self._apply_inbox)
        except BaseException as exc:
            self._posted = False  # no turn was scheduled: the next post schedules one
            with contextlib.suppress(ValueError, RuntimeError):
                inbox.remove(call)  # unless the loop took it meanwhile
            if type(exc) is RuntimeError and loop.is_closed():  # it closed since the check
                inbox.clear()
                raise RuntimeError(
                    f"AsyncWorkQueue {self.name!r}: its event loop is closed"
                ) from None
            raise

    def _apply_inbox(self) -> None:
        """On the loop: apply what other threads posted, oldest first."""
        self._posted = False  # first: a call posted from now on schedules another turn
        inbox = self._inbox
        for _ in range(len(inbox)):  # what is there now; later calls get a turn of their own
            try:
                fn, args = inbox.popleft()
            except IndexError:  # a failed post withdrew its call meanwhile
                return
            try:
                fn(*args)
            except Exception:  # arguments were checked in the caller: not expected
                logger.exception("keyqueue %r: a call from another thread raised", self.name)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """For another thread: run ``fn(*args)`` on the loop, wait, return or raise.

        Raises ``RuntimeError`` and changes nothing if the loop is not running,
        or stops before it takes the call (the wait wakes now and then to check).
        """
        loop = self._loop
        assert loop is not None
        stopped = f"AsyncWorkQueue {self.name!r}: called from another thread, but its event loop "
        if not loop.is_running():
            raise RuntimeError(stopped + ("is closed" if loop.is_closed() else "is not running"))
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._post(_run_into, future, fn, args)
        while not future.done():
            concurrent.futures.wait((future,), _CALL_POLL)
            if not loop.is_running() and future.cancel():
                raise RuntimeError(stopped + "stopped before running the call")
        return future.result()

    # -- adding --------------------------------------------------------------------

    def add(self, key: Any, priority: Any = 0) -> None:
        """Mark ``key`` for processing. Never blocks; safe from any thread.

        Higher ``priority`` is handed out first (see ``WorkQueue.add``). From
        another thread: an unhashable key or a bad priority raises there; the
        add lands on the loop on its next turn (its time is read there, so times
        follow the order of transitions), and before any later ``shutdown``.
        """
        if self._emitting:
            reentered(self, "add")
        if _where() != self._loop_where and self._off_loop():
            if not self._core.shutting_down:  # a no-op after shutdown, even once the loop closed
                hash(key)
                if priority:
                    check_priority(priority)
                self._core.check_group(key)  # fair_by's error here, in the calling thread
                self._post(self.add, key, priority)
            return
        if self._core.add(key, self._now(), priority) and self._getters:
            _wake_one(self._getters)

    def add_many(self, keys: Any, priority: Any = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order, in one turn of
        the loop: no other call lands between two of them. Safe from any thread.

        Every key and the priority are checked first, in the calling thread: an
        unhashable key, or a ``str`` passed as ``keys``, raises ``TypeError``
        (a bad priority as ``add``) and nothing is added. From another thread
        the adds land on the loop together, as ``add``.
        """
        if self._emitting:
            reentered(self, "add_many")
        checked = check_keys(keys)
        if priority:
            check_priority(priority)
        if _where() != self._loop_where and self._off_loop():
            if not self._core.shutting_down:  # a no-op after shutdown, as add
                if self._core.fair_by is not None:
                    for key in checked:  # fair_by's error here: none added
                        self._core.check_group(key)
                self._post(self.add_many, checked, priority)
            return
        pushed = self._core.add_many(checked, self._now(), priority)
        while pushed and self._getters:
            _wake_one(self._getters)
            pushed -= 1

    def add_after(self, key: Any, seconds: Any, priority: Any = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the queue's clock (safe from any thread).

        One delayed entry per key, the earliest ready time wins; ``seconds <= 0``
        (or too small to move the clock's ``now``) adds now. A no-op after
        shutdown. The key is added with the highest ``priority`` asked for it.
        An unhashable key or a ``seconds`` that is not an int or float raises
        ``TypeError``, NaN ``ValueError`` (a bad priority as ``add``), in the
        calling thread; nothing changes. From another thread the delay runs
        from the call, and an add now takes its time on the loop, as ``add``.
        """
        if self._emitting:
            reentered(self, "add_after")
        seconds = check_add_after(key, seconds)  # here, in the calling thread
        if priority:
            check_priority(priority)
        self._add_after(key, seconds, _DELAY, priority)

    def add_rate_limited(self, key: Any, priority: Any = 0) -> None:
        """``add_after(key, rate_limiter.when(key), priority)`` (safe from any thread).

        A no-op after shutdown (the limiter records nothing either). An
        unhashable key or a bad priority raises before the limiter records
        anything; a delay from the limiter that is not a number, after.
        """
        if self._emitting:
            reentered(self, "add_rate_limited")
        seconds = self._rate_limited_delay(key, priority)
        if seconds is not None:
            self._add_after(key, seconds, _RATE_LIMIT, priority)

    def _add_after(self, key: Any, seconds: float, kind: EventKind, priority: Any) -> None:
        """A delayed add of checked input, posted to the loop from another thread."""
        now = self._now()  # the delay runs from the call, also when it hops threads
        if _where() != self._loop_where and self._off_loop():
            core = self._core
            if not core.shutting_down or core.backs_off_draining(key, kind):
                core.check_group(key)
                # An add now (no delay) is timed on the loop, as add is: None.
                later = now + seconds > now
                self._post(
                    self._add_after_now, key, seconds, now if later else None, kind, priority
                )
            return
        self._add_after_now(key, seconds, now, kind, priority)

    def _add_after_now(
        self, key: Any, seconds: float, now: float | None, kind: EventKind, priority: Any
    ) -> None:
        if now is None:
            now = self._now()
        self._delayed(self._core.add_after_unchecked(key, seconds, now, kind, priority))

    def _delayed(self, pushed: bool) -> None:
        """After a delayed add (or a retry's): wake a getter for a key pushed now,
        or make sure the loop timer fires by the earliest ready time."""
        if pushed:
            if self._getters:
                _wake_one(self._getters)
        else:
            self._arm()

    def forget(self, key: Any) -> None:
        """``key`` succeeded: clear its backoff and failure count."""
        if self._emitting:
            reentered(self, "forget")
        if _where() != self._loop_where and self._off_loop():
            self._call(self.forget, key)
            return
        self._rate_limiter.forget(key)
        self._core.forget(key)

    def retry(self, key: Any) -> bool:
        """Record a failure of ``key`` and decide, in one step (``WorkQueue.retry``).

        True: it comes back, after the rate limiter's delay, or, while shutting
        down, because it was added again while held. False: give up (then
        ``forget`` it): ``max_retries`` failures, or shutting down with nothing
        to bring it back.
        """
        if self._emitting:
            reentered(self, "retry")
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.retry, key)
        pushed = self._core.retry(key, self._retry_delay(key), self._now())
        if pushed is None:
            return False
        self._delayed(pushed)
        return True

    def give_up(self, key: Any, reason: Any, error: Any = None) -> None:
        """``forget`` ``key`` and keep it as a dead key (``WorkQueue.give_up``)."""
        if self._emitting:
            reentered(self, "give_up")
        if _where() != self._loop_where and self._off_loop():
            self._call(self.give_up, key, reason, error)
            return
        reason = check_reason(reason)
        error_type, message = describe(error)
        self._rate_limiter.forget(key)
        self._core.give_up(key, reason, error_type, message, time.time())

    def dead(self, limit: Any = 100) -> tuple[DeadKey[Any], ...]:
        """The first ``limit`` dead keys, newest first (``WorkQueue.dead``)."""
        if self._emitting:
            reentered(self, "dead")
        limit = check_limit(limit)
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.dead, limit)
        return self._core.dead_keys(limit)

    def replay(self, key: Any) -> bool:
        """Add a dead ``key`` back, its failures and backoff cleared
        (``WorkQueue.replay``); False if it is not dead, or after shutdown."""
        if self._emitting:
            reentered(self, "replay")
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.replay, key)
        pushed = self._core.replay(key, self._now())
        if pushed is None:
            return False
        self._rate_limiter.forget(key)
        if pushed and self._getters:
            _wake_one(self._getters)
        return True

    def replay_all(self) -> int:
        """``replay`` every dead key, oldest first; how many (0 after shutdown)."""
        if self._emitting:
            reentered(self, "replay_all")
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.replay_all)
        keys, pushed = self._core.replay_all(self._now())
        for key in keys:
            self._rate_limiter.forget(key)
        for _ in range(pushed):
            if self._getters:
                _wake_one(self._getters)
        return len(keys)

    def forget_dead(self, key: Any) -> bool:
        """Drop ``key``'s dead entry without adding it; False if it had none."""
        if self._emitting:
            reentered(self, "forget_dead")
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.forget_dead, key)
        return self._core.forget_dead(key)

    # -- getting -------------------------------------------------------------------

    def get_nowait(self) -> Any:
        """The next waiting key (the oldest, or by priority), now held until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once the queue is shut
        down and nothing is left to hand out.
        """
        if self._emitting:
            reentered(self, "get_nowait")
        if _where() != self._loop_where and self._off_loop():
            return self._call(_take, self, current_thread())
        loop = self._loop
        task = None if loop is None else _current_task(loop)
        return _take(self, current_thread() if task is None else task)

    async def get(self, timeout: Any = None) -> Any:
        """Wait for a key and hold it until ``done``.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once the queue is shut down and nothing waiting or
        pending redelivery is left. Cancelling a waiting ``get`` loses no key.
        From a loop other than the queue's: ``RuntimeError``.
        """
        if timeout is not None:
            return await self._get_within(timeout)
        loop = self._loop
        # The task taking the key (a snapshot names it) is also the check that
        # this is the queue's loop: a task runs on it now, in this thread.
        task = None if loop is None else _current_task(loop)
        if loop is None or task is None or _where() != self._loop_where:
            loop = self._running_loop()  # the first use binds; another loop raises
            task = _current_task(loop)
        core = self._core
        while not core.waiting and not core.exhausted:
            getter = loop.create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()  # in case it was not done yet
                try:
                    self._getters.remove(getter)
                except ValueError:
                    pass
                if core.waiting and not getter.cancelled():
                    _wake_one(self._getters)  # pass on the wake-up we were given
                raise
        key = core.get(self._now(), task)  # _take, inlined: a hot path, pure too
        if self._getters and core.exhausted:
            _wake_all(self._getters)
        return key

    async def _get_within(self, timeout: Any) -> Any:
        timeout = check_timeout(timeout)
        try:
            async with asyncio.timeout(None if timeout == math.inf else timeout):
                return await self.get()
        except TimeoutError:
            raise Empty from None

    def interrupt(self) -> None:
        """Wake every ``get`` waiting now: each raises ``Empty`` at once, as if
        its timeout had passed. A ``get`` that starts later waits as usual; the
        queue is untouched. Safe from any thread (as ``done``). Cancelling a
        ``get`` does the same for one (``arun_workers``' ``stop`` does that).
        """
        if self._emitting:
            reentered(self, "interrupt")
        if _where() != self._loop_where and self._off_loop():
            self._call(self.interrupt)
            return
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_exception(Empty())

    def done(self, key: Any) -> None:
        """Release ``key``; if it was added meanwhile it is queued again, once.

        Raises ``ValueError`` if ``key`` is not being processed (in the calling
        thread, when called from another one).
        """
        if self._emitting:
            reentered(self, "done")
        if _where() != self._loop_where and self._off_loop():
            self._call(self.done, key)
            return
        core = self._core
        if core.done(key, self._now()):
            if self._getters:
                _wake_one(self._getters)
        elif (self._joiners or core.draining) and core.idle:
            _wake_all(self._joiners)  # and the getters of a drained queue: ShutDown
            if self._getters and core.exhausted:
                _wake_all(self._getters)

    # -- shutdown ------------------------------------------------------------------

    async def shutdown(self, drain: Any = False, timeout: Any = None) -> bool:
        """Stop accepting adds; waiting keys are still handed out, delayed ones dropped.

        Calls that other threads made before this one (adds included) are
        applied first. Keys marked while processing are still redelivered;
        waiting ``get`` calls raise ``ShutDown`` once nothing is left for them.
        With ``drain=True``, wait until the queue is idle (as ``join``) or
        ``timeout`` (wall seconds) passes: keys backing off are kept, and a
        held key that fails during the drain comes back after its backoff and
        is waited for (see ``WorkQueue.shutdown``). Returns False only when a
        drain timed out: then a WARNING counts the keys left, which stay
        queued. Do not drain from a task that holds a key.
        """
        check_flag(drain, "drain")
        timeout = check_timeout(timeout)
        self._running_loop()
        self._apply_inbox()
        core = self._core
        delayed = len(core.delayed)
        core.shutdown(self._now(), drain)
        self._timer.cancel()
        self._arm()  # a drain kept keys backing off: they still come due
        _wake_all(self._getters)
        if delayed > len(core.delayed):
            dropped_at_shutdown(self.name, delayed - len(core.delayed), drain)
        if core.idle:
            _wake_all(self._joiners)
            return True
        if not drain:
            return True
        if await self._wait_idle(timeout):
            return True
        drain_timed_out(self.name, timeout, unfinished(core))
        return False

    async def join(self, timeout: Any = None) -> bool:
        """Wait until the queue is idle: nothing waits, is held (pending
        redeliveries included) or is delayed; True then, False if ``timeout``
        (wall seconds) passed first. ``asyncio.Queue.join``'s counterpart, with
        a timeout; it does not shut the queue down.

        It does not poll: the ``done`` (or ``shutdown``) that leaves the queue
        idle wakes it; nothing is spent while nobody joins. From a loop other
        than the queue's: ``RuntimeError``. Do not join from a task that holds
        a key.
        """
        timeout = check_timeout(timeout)
        self._running_loop()
        self._apply_inbox()
        return await self._wait_idle(timeout)

    async def _wait_idle(self, timeout: float | None) -> bool:
        loop = self._running_loop()
        core = self._core
        try:
            async with asyncio.timeout(None if timeout == math.inf else timeout):
                while not core.idle:
                    joiner = loop.create_future()
                    self._joiners.append(joiner)
                    try:
                        await joiner
                    except BaseException:
                        joiner.cancel()
                        with contextlib.suppress(ValueError):
                            self._joiners.remove(joiner)
                        raise
        except TimeoutError:
            return False
        return True

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
        timer = self._timer
        if timer.armed is not None and timer.armed <= ready:
            return
        if timer.handle is not None:
            timer.handle.cancel()
        timer.armed = ready
        # The loop holds the handle, the handle only a weak reference to the
        # queue, and its callback cancels the handle once the queue is gone.
        timer.handle = loop.call_at(
            loop.time() + max(0.0, ready - self._now()),
            _fire_timer,
            weakref.ref(self, timer.cancel),
        )

    def _on_timer(self) -> None:
        self._timer.handle = None
        self._timer.armed = None
        self._release_due()
        self._arm()

    def _release_due(self) -> None:
        for _ in range(self._core.promote(self._now())):
            if not self._getters:
                break
            _wake_one(self._getters)

    def _on_clock_step(self) -> None:
        """A virtual clock moved: release what is due, on the loop's thread."""
        loop = self._loop
        if loop is None or self._loop_thread == get_ident():
            self._release_due()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._release_due)

    # -- introspection -------------------------------------------------------------

    def stats(self) -> Stats:
        """A frozen snapshot of counters and sizes (taken on the loop, from any thread)."""
        if self._emitting:
            reentered(self, "stats")
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.stats)
        return self._core.stats(self._now())

    def snapshot(self, limit: Any = 100) -> Snapshot[Any]:
        """Stats and the first ``limit`` keys of each list, taken on the loop in one step.

        See ``Snapshot`` and ``WorkQueue.snapshot``; from another thread it
        blocks until the loop has taken it, as ``stats``.
        """
        if self._emitting:
            reentered(self, "snapshot")
        limit = check_limit(limit)
        if _where() != self._loop_where and self._off_loop():
            return self._call(self.snapshot, limit)
        return self._core.snapshot(self._now(), limit, _holder_name)

    # -- events --------------------------------------------------------------------

    def subscribe(self, callback: Any) -> Callable[[], None]:
        """Call ``callback(event)`` on every transition; returns an unsubscribe function.

        Callbacks run on the queue's loop, in transition order; keep them short.
        Calling the queue from one raises ``RuntimeError`` (it would re-enter a
        transition); unsubscribing is fine. A raising callback is logged.
        """
        return self._subscribers.subscribe(callback, self)


def _take(queue: AsyncioFront, holder: object) -> Any:
    """``get_nowait`` on the loop, the key held by ``holder`` (a task, or the
    thread that called when no task did). A module function, so that compiled
    callers reach it without a look-up by name (see the module's docstring)."""
    core = queue._core
    key = core.get(queue._now(), holder)
    if queue._getters and core.exhausted:
        _wake_all(queue._getters)
    return key


def _run_into(future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: Any) -> None:
    """On the loop: run a call another thread waits for, its outcome into ``future``."""
    if not future.set_running_or_notify_cancel():
        return  # the caller gave up waiting: change nothing
    try:
        future.set_result(fn(*args))
    except BaseException as exc:
        future.set_exception(exc)
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt, SystemExit: the loop sees them too


def _holder_name(holder: Any) -> str | None:
    """A held key's ``holder`` in a snapshot: the name of the task that took it
    (``Task.get_name``), or of the thread, for a ``get_nowait`` outside a task."""
    if isinstance(holder, asyncio.Task):
        return holder.get_name()
    return holder.name if isinstance(holder, Thread) else None
