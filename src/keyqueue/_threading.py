"""The threading front: one lock, two conditions, one timer thread.

Every public call takes ``_lock``, reads the clock under it (so times are in
the order the transitions happened, and a virtual clock's step cannot slip
between the read and the change), calls the core once, and wakes
whoever the core's answer says: one getter per pushed key, every getter at
shutdown or once nothing dirty is left (a draining queue: once it is idle),
``join`` and drain callers when the queue goes idle, the timer when an
earlier ready time arrives. Waiters are counted, so ``add``,
``get`` and ``done`` with nobody waiting never touch a condition (the timer
thread and ``shutdown`` notify regardless: they are off the hot path).

Delayed keys: with a real clock one daemon timer thread per queue sleeps until
the earliest ready time; it starts on the first delay and exits when none is
left, at shutdown, or once the queue is garbage collected. The thread holds the
queue's lock, condition and core and only a weak reference to the queue, so a
queue dropped with a key delayed for ever (``add_after(k, 1e300)``) is still
collected. The thread sleeps on a ``SimpleQueue`` rather than a condition: the
weak reference's callback, which wakes it to exit, may run on any thread at any
allocation (on the timer thread too, while it holds the lock), so it must not
take the lock, and ``SimpleQueue.put`` takes none.

Busy producers: a consumer needs the GIL to go on, whether a getter woken
for a key or a worker back from its handler (it blocked on I/O, slept, or
was switched off) to call ``done``. CPython hands the GIL over only when its
holder blocks, or when a thread has waited a whole switch interval (5 ms) and
asks for it, and then to any thread that waits, another producer as likely as
a consumer. A producer spinning on ``add`` never blocks: the lock is free
whenever it holds the GIL (``add`` is one C call, compiled; pure, a producer
switched off inside ``add`` may hold the lock, and the threads that call the
queue then block on it and pass the GIL on: the compiled build never does).
Left there, a consumer waits 5 ms or more per turn, and with handlers that
block every key waits for several turns. The rule: while a consumer may be
waiting for the GIL (a key is held, or a getter is blocked while a key waits
for it), ``add`` counts its adds, and every ``_YIELD_EVERY`` of them yields
the GIL (``time.sleep(0)``, after the lock is released). With no key held and
no getter blocked, ``add`` returns before counting, so the uncontended paths
pay one test; a held key whose holder does not want the GIL (a long handler)
costs a producer one ``sleep(0)`` per 1,000 adds. The trade: producers make
fewer adds (beside workers, most of them are absorbed anyway) and workers
reconcile more (``benchmarks/contention.py``, docs/benchmarks.md).
``add_many`` counts each of its keys.

With a virtual clock (``FakeClock``) there is no thread: the clock calls the
queue when it steps (holding it weakly), so due keys are in the FIFO by the
time ``step`` returns.

This module is compiled (``keyqueue._build``); ``ThreadingFront`` is the whole
queue, and ``keyqueue.WorkQueue`` (``_queues``) is it, made generic.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from ._build import mypyc_attr
from ._checks import check_add_after, check_flag, check_keys, check_priority, check_timeout
from ._clock import VirtualClock
from ._core import Core
from ._dead import DeadKey, check_reason, describe
from ._errors import Empty
from ._events import EventKind, reentered
from ._front import QueueBase, drain_timed_out, dropped_at_shutdown, unfinished
from ._metrics import QueueGauges
from ._options import options_for
from ._snapshot import Snapshot, check_limit
from ._stats import Stats

# The thread a get hands its key to, by ident (a C call; a snapshot names it:
# ``HeldKey.holder``).
_current_thread: Final = threading.get_ident

__all__ = ["ThreadingFront"]

_DELAY: Final = EventKind.DELAY
_RATE_LIMIT: Final = EventKind.RATE_LIMIT
# Adds made while a consumer may wait for the GIL, between two yields: about
# 0.2 ms of adds compiled, 1 ms pure (see the module docstring).
_YIELD_EVERY: Final = 1000


@mypyc_attr(allow_interpreted_subclasses=True)
class ThreadingFront(QueueBase):
    """The threading front: ``keyqueue.WorkQueue`` without its key type.

    Keys and checked arguments are ``Any`` (see ``_front``); the contract is
    written on each method, and the signatures users see on ``WorkQueue``.
    """

    def __init__(self, *args: Any, **options: Any) -> None:
        self._lock = threading.Lock()
        # Notified when a key is pushed (add, done, timer: one per key) and, to
        # all, at shutdown and when the last dirty key leaves a shut-down queue.
        self._not_empty = threading.Condition(self._lock)
        # Notified (all) when the queue goes idle (done, shutdown) while
        # someone waits in join or in shutdown(drain=True): counted in _joiners.
        self._idle = threading.Condition(self._lock)
        self._getters = 0  # threads blocked in get
        self._interrupts = 0  # interrupt() calls: a get blocked across one raises Empty
        self._joiners = 0  # threads blocked in join or shutdown(drain=True)
        # Adds made since the last yield while a consumer may have waited for
        # the GIL (counted by _yield_due, under the lock; the module docstring).
        self._unyielded = 0
        self._timer = _Timer()
        super().__init__(options_for(self, args, options))
        self._virtual = isinstance(self._clock, VirtualClock)
        if self._virtual:
            self._clock.subscribe(self._on_clock_step)  # type: ignore[attr-defined]

    # -- adding ------------------------------------------------------------------

    def add(self, key: Any, priority: Any = 0) -> None:
        """Mark ``key`` for processing. Never blocks; a no-op after shutdown.

        Higher ``priority`` (an int, 32-bit) is handed out first; a waiting key
        added again keeps the higher of its priorities. A bad priority raises
        ``TypeError``/``ValueError`` and changes nothing. While a key is held,
        or a woken ``get`` has not taken its key yet, every so many adds yield
        the GIL, so the consumers are not starved by a producer in a loop.
        """
        if self._emitting:
            reentered(self, "add")
        with self._lock:
            core = self._core
            pushed = core.add(key, self._now(), priority)
            if self._getters:
                if pushed:
                    self._not_empty.notify()
            elif not core.processing:
                return
            if not self._yield_due(1):
                return
        time.sleep(0)

    def add_many(self, keys: Any, priority: Any = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order, in one hold of
        the lock: no other call lands between two of them.

        Every key and the priority are checked before any key is added: an
        unhashable key, or a ``str`` passed as ``keys``, raises ``TypeError``
        (a bad priority as ``add``) and nothing is added.
        """
        if self._emitting:
            reentered(self, "add_many")
        checked = check_keys(keys)
        if priority:
            check_priority(priority)
        with self._lock:
            core = self._core
            pushed = core.add_many(checked, self._now(), priority)
            if self._getters:
                if pushed:
                    self._not_empty.notify(pushed)
            elif not core.processing:
                return
            if not self._yield_due(len(checked)):
                return
        time.sleep(0)

    def _yield_due(self, adds: int) -> bool:
        """Under the lock, after ``adds`` adds with a key held or a getter
        blocked: True when the caller should yield the GIL, once per
        ``_YIELD_EVERY`` adds made while a consumer may wait for it (a key is
        held, or a key waits for a blocked getter; the module docstring)."""
        core = self._core
        if not core.processing and not core.waiting:
            return False  # only getters with nothing to take: none of them runs
        self._unyielded += adds
        if self._unyielded < _YIELD_EVERY:
            return False
        self._unyielded = 0
        return True

    def add_after(self, key: Any, seconds: Any, priority: Any = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the queue's clock.

        One delayed entry per key: the earliest ready time wins. ``seconds <= 0``
        (or too small to move the clock's ``now``) adds now. An ``add`` meanwhile
        does not cancel the delayed entry. The key is added with the highest
        ``priority`` asked for it. A no-op after shutdown; delayed keys are
        dropped at shutdown. An unhashable key or a ``seconds`` that is not an
        int or float raises ``TypeError``, NaN ``ValueError`` (and a bad priority
        as ``add``); nothing changes.
        """
        if self._emitting:
            reentered(self, "add_after")
        seconds = check_add_after(key, seconds)
        if priority:
            check_priority(priority)
        self._add_after(key, seconds, _DELAY, priority)

    def add_rate_limited(self, key: Any, priority: Any = 0) -> None:
        """``add_after(key, rate_limiter.when(key), priority)``: record a failure and back off.

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
        """A delayed add of checked input (``Core.add_after_unchecked``)."""
        with self._lock:
            self._delayed(self._core.add_after_unchecked(key, seconds, self._now(), kind, priority))

    def _delayed(self, pushed: bool) -> None:
        """Under the lock, after a delayed add (or a retry's): wake a getter for a
        key pushed now, or make sure the timer wakes by the earliest ready time."""
        if pushed:
            if self._getters:
                self._not_empty.notify()
        elif not self._virtual:
            ready = self._core.next_ready
            if ready is not None:
                self._timer.arm(self, ready)

    def forget(self, key: Any) -> None:
        """``key`` succeeded: clear its backoff and failure count."""
        if self._emitting:
            reentered(self, "forget")
        self._rate_limiter.forget(key)
        with self._lock:
            self._core.forget(key)

    def retry(self, key: Any) -> bool:
        """Record a failure of ``key`` and decide, in one step under the lock.

        True: the key comes back, after the rate limiter's delay (a rate-limited
        re-add), or, while the queue is shutting down, because it was added again
        while held (its ``done`` hands it out again; the failure still counts).
        False: give up (the caller should ``forget`` it): it has failed
        ``max_retries`` times, or the queue is shutting down and nothing brings
        it back. The limiter is asked (outside the lock) only when the key will
        back off. Call it while holding the key, before ``done``.
        """
        if self._emitting:
            reentered(self, "retry")
        seconds = self._retry_delay(key)
        with self._lock:
            pushed = self._core.retry(key, seconds, self._now())
            if pushed is None:
                return False
            self._delayed(pushed)
            return True

    def give_up(self, key: Any, reason: Any, error: Any = None) -> None:
        """``forget`` ``key`` and keep it as a dead key (``dead()``): ``reason``
        (a str: the runners pass ``"retries"``, ``"permanent"`` or
        ``"shutdown"``), ``error``'s type and message, its failures, the wall
        time. The runners call it instead of ``forget`` when they give a key up.
        A bad ``reason`` raises ``TypeError``/``ValueError`` and changes nothing.
        """
        if self._emitting:
            reentered(self, "give_up")
        reason = check_reason(reason)
        error_type, message = describe(error)
        self._rate_limiter.forget(key)
        with self._lock:
            self._core.give_up(key, reason, error_type, message, time.time())

    def dead(self, limit: Any = 100) -> tuple[DeadKey[Any], ...]:
        """The first ``limit`` dead keys, newest first (at most 1,000 are
        kept, the oldest dropped first). A bad ``limit`` raises."""
        if self._emitting:
            reentered(self, "dead")
        limit = check_limit(limit)
        with self._lock:
            return self._core.dead_keys(limit)

    def replay(self, key: Any) -> bool:
        """Add a dead ``key`` back, its failures and backoff cleared; False if
        it is not dead, or after shutdown (then nothing changes). A key
        waiting or held meanwhile keeps its place: the add is coalesced, or
        marks it for one redelivery, as ``add``."""
        if self._emitting:
            reentered(self, "replay")
        with self._lock:
            pushed = self._core.replay(key, self._now())
            if pushed is None:
                return False
            if pushed and self._getters:
                self._not_empty.notify()
        self._rate_limiter.forget(key)
        return True

    def replay_all(self) -> int:
        """``replay`` every dead key, oldest first, in one hold of the lock;
        how many (0 after shutdown)."""
        if self._emitting:
            reentered(self, "replay_all")
        with self._lock:
            keys, pushed = self._core.replay_all(self._now())
            if pushed and self._getters:
                self._not_empty.notify(pushed)
        for key in keys:
            self._rate_limiter.forget(key)
        return len(keys)

    def forget_dead(self, key: Any) -> bool:
        """Drop ``key``'s dead entry without adding it; False if it had none."""
        if self._emitting:
            reentered(self, "forget_dead")
        with self._lock:
            return self._core.forget_dead(key)

    # -- getting -----------------------------------------------------------------

    def get_nowait(self) -> Any:
        """The next waiting key (the oldest, or by priority), now held by the caller until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once the queue is shut
        down and nothing is left to hand out.
        """
        if self._emitting:
            reentered(self, "get_nowait")
        with self._lock:
            core = self._core
            key = core.get(self._now(), _current_thread())
            if self._getters and core.exhausted:
                self._not_empty.notify_all()
            return key

    def get(self, timeout: Any = None) -> Any:
        """Like ``get_nowait``, but blocks until a key is waiting.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once the queue is shut down and nothing waiting or
        pending redelivery is left; a blocked ``get`` is released by shutdown.
        """
        if self._emitting:
            reentered(self, "get")
        if timeout is not None:
            timeout = check_timeout(timeout)
        with self._lock:
            core = self._core
            if not core.waiting and not core.exhausted:
                deadline = None if timeout is None else time.monotonic() + timeout
                seen = self._interrupts
                self._getters += 1
                try:
                    while not core.waiting and not core.exhausted:
                        if deadline is None:
                            self._not_empty.wait()
                        else:
                            remaining = deadline - time.monotonic()
                            if remaining <= 0:
                                raise Empty
                            self._not_empty.wait(min(remaining, threading.TIMEOUT_MAX))
                        if self._interrupts != seen:
                            raise Empty
                except BaseException:
                    # We may have consumed a wake-up meant for a key: pass it on.
                    if core.waiting and self._getters > 1:
                        self._not_empty.notify()
                    raise
                finally:
                    self._getters -= 1
            key = core.get(self._now(), _current_thread())
            if self._getters and core.exhausted:
                self._not_empty.notify_all()
            return key

    def interrupt(self) -> None:
        """Wake every ``get`` blocked now: each raises ``Empty`` at once, as if
        its timeout had passed. A ``get`` that starts later waits as usual; the
        queue is untouched. ``run_workers`` calls it when its ``stop`` is set,
        so its workers wait in ``get`` without polling.
        """
        if self._emitting:
            reentered(self, "interrupt")
        with self._lock:
            if self._getters:
                self._interrupts += 1
                self._not_empty.notify_all()

    def done(self, key: Any) -> None:
        """Release ``key``; if it was added meanwhile, it is queued again (once).

        Raises ``ValueError`` if ``key`` is not being processed.
        """
        if self._emitting:
            reentered(self, "done")
        with self._lock:
            core = self._core
            if core.done(key, self._now()):
                if self._getters:
                    self._not_empty.notify()
            elif (self._joiners or core.draining) and core.idle:
                self._went_idle()

    def _went_idle(self) -> None:
        """Under the lock, once the queue is idle: wake the joiners, and the
        getters of a drained queue (``get`` raises ``ShutDown`` now)."""
        if self._joiners:
            self._idle.notify_all()
        if self._getters and self._core.exhausted:
            self._not_empty.notify_all()

    # -- shutdown ----------------------------------------------------------------

    def shutdown(self, drain: Any = False, timeout: Any = None) -> bool:
        """Stop accepting adds; waiting keys are still handed out, delayed ones dropped.

        Keys marked while processing are still redelivered. Blocked ``get``
        calls raise ``ShutDown`` once nothing is left for them. Safe to call
        more than once; do not drain from a thread that holds a key.

        With ``drain=True``, block until the queue is idle (as ``join``) or
        ``timeout`` (wall seconds) passes, while the workers finish what is
        queued. A drain loses no key: keys backing off (a failure's
        ``retry``, ``add_rate_limited``) are kept, and a held key that fails
        during the drain comes back after its backoff, as on a live queue
        (``max_retries`` still gives up); the drain waits for them. Keys
        delayed by ``add_after`` (a look scheduled for later) are dropped, and
        new adds are no-ops, drain or not. Returns False only when a drain
        timed out: then a WARNING counts the keys left, which stay queued
        (``snapshot()`` lists them) and the workers go on with them until the
        queue is idle or they are stopped.
        """
        if self._emitting:
            reentered(self, "shutdown")
        check_flag(drain, "drain")
        timeout = check_timeout(timeout)
        with self._lock:
            core = self._core
            delayed = len(core.delayed)
            core.shutdown(self._now(), drain)
            dropped = delayed - len(core.delayed)
            self._not_empty.notify_all()
            if self._timer.running:
                self._timer.wake_up()
            elif core.delayed and not self._virtual:  # a drain kept keys backing off
                ready = core.next_ready
                if ready is not None:
                    self._timer.arm(self, ready)
            if core.idle and self._joiners:
                self._idle.notify_all()
        if dropped:
            dropped_at_shutdown(self.name, dropped, drain)
        if not drain:
            return True
        with self._lock:
            if self._wait_idle(timeout):
                return True
            left = unfinished(core)
        drain_timed_out(self.name, timeout, left)
        return False

    def join(self, timeout: Any = None) -> bool:
        """Block until the queue is idle: nothing waits, is held (pending
        redeliveries included) or is delayed; True then, False if ``timeout``
        (wall seconds) passed first. ``queue.Queue.join``'s counterpart, with
        a timeout; it does not shut the queue down (adds go on; it returns at
        the first moment the queue is idle).

        It does not poll: the ``done`` (or ``shutdown``) that leaves the queue
        idle wakes it. Costs nothing when nobody joins. Do not join from a
        thread that holds a key (it would wait for itself).
        """
        if self._emitting:
            reentered(self, "join")
        timeout = check_timeout(timeout)
        with self._lock:
            return self._wait_idle(timeout)

    def _wait_idle(self, timeout: float | None) -> bool:
        """Under the lock: wait until the core is idle (True) or ``timeout``
        (wall seconds) passes (False)."""
        core = self._core
        if core.idle:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        self._joiners += 1
        try:
            while not core.idle:
                if deadline is None:
                    self._idle.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._idle.wait(min(remaining, threading.TIMEOUT_MAX))
            return True
        finally:
            self._joiners -= 1

    # -- time --------------------------------------------------------------------

    def _on_clock_step(self) -> None:
        """A virtual clock moved: release what is due now."""
        with self._lock:
            pushed = self._core.promote(self._now())
            if pushed and self._getters:
                self._not_empty.notify(pushed)

    # -- introspection -----------------------------------------------------------

    def stats(self) -> Stats:
        """A frozen snapshot of counters and sizes."""
        if self._emitting:
            reentered(self, "stats")
        with self._lock:
            return self._core.stats(self._now())

    def snapshot(self, limit: Any = 100) -> Snapshot[Any]:
        """Stats and the first ``limit`` keys of each list, taken under the lock.

        See ``Snapshot``: waiting keys in hand-out order, held keys, delayed
        keys, failing keys, each list at most ``limit`` long. A bad ``limit``
        (not an int >= 0) raises. It holds the lock for O(limit log limit),
        plus O(n log limit) over the keys with failures recorded.
        """
        if self._emitting:
            reentered(self, "snapshot")
        limit = check_limit(limit)
        with self._lock:
            return self._core.snapshot(self._now(), limit, _thread_names())

    def _gauges(self) -> QueueGauges:
        with self._lock:
            return super()._gauges()

    def subscribe(self, callback: Any) -> Callable[[], None]:
        """Call ``callback(event)`` on every transition; returns an unsubscribe function.

        Callbacks run under the queue's lock, in transition order: keep them
        short. Calling the queue from one raises ``RuntimeError`` (it would
        deadlock on the lock); unsubscribing is fine. An
        exception in a callback is logged and does not affect the queue. Costs
        nothing when nobody subscribed.
        """
        return self._subscribers.subscribe(callback, self)


class _Timer:
    """A queue's timer thread, as shared by the queue and the thread.

    ``running`` and ``armed`` are guarded by the queue's lock. ``running`` is
    True from the thread's start until it decides, under that lock, to exit;
    ``armed`` is the ready time it last decided to sleep toward, set under the
    lock before each sleep and kept while it works after waking (so ``arm``
    wakes it only for an earlier time); None before its first look and once it
    exits. ``wake_up`` may be called from anywhere, with or without the lock.
    """

    __slots__ = ("armed", "running", "wakeups")

    def __init__(self) -> None:
        self.running = False
        self.armed: float | None = None
        self.wakeups: queue.SimpleQueue[None] = queue.SimpleQueue()

    def wake_up(self, _collected: object = None) -> None:
        """Make the thread look again (also the queue's weakref callback)."""
        self.wakeups.put(None)

    def arm(self, owner: ThreadingFront, ready: float) -> None:
        """Under ``owner``'s lock: make sure the thread wakes by ``ready``."""
        if not self.running:
            threading.Thread(
                target=_run_timer,
                args=(
                    self,
                    weakref.ref(owner, self.wake_up),
                    owner._lock,
                    owner._not_empty,
                    owner._core,
                    owner._now,
                ),
                name=f"keyqueue-timer-{owner.name}",
                daemon=True,
            ).start()
            self.running = True
        elif self.armed is not None and ready < self.armed:
            self.wake_up()


def _run_timer(
    timer: _Timer,
    owner: weakref.ref[ThreadingFront],
    lock: threading.Lock,
    not_empty: threading.Condition,
    core: Core[Any],
    now: Callable[[], float],
) -> None:
    """The timer thread: release due keys, sleep until the next ready time.

    Holds no strong reference to its queue between looks. Exits when nothing is
    delayed, at shutdown, or once the queue was collected.
    """
    while True:
        with lock:
            sleep = None
            try:
                # A shut-down queue has no delayed keys, unless it drains: its
                # keys backing off still come due.
                if owner() is not None and (not core.shutting_down or core.draining):
                    t = now()
                    pushed = core.promote(t)
                    if pushed:
                        not_empty.notify(pushed)
                    ready = core.next_ready
                    if ready is not None:
                        sleep = min(max(ready - t, 0.0), threading.TIMEOUT_MAX)
                        timer.armed = ready
            finally:
                if sleep is None:  # decided under the lock, so arm() starts a new thread
                    timer.armed = None
                    timer.running = False
        if sleep is None:
            return
        try:
            timer.wakeups.get(timeout=sleep)
        except queue.Empty:
            pass


def _thread_names() -> Callable[[Any], str | None]:
    """A held key's ``holder`` in a snapshot, from the ident its get recorded:
    the name of that thread, or ``thread <ident> (ended)`` once it is gone."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}

    def name(ident: Any) -> str | None:
        if ident is None:
            return None
        found = names.get(ident)
        return f"thread {ident} (ended)" if found is None else found

    return name
