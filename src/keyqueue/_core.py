"""The pure state machine every front runs: the dirty/processing rules.

Theory of operation
-------------------
A key is in one of four states, told apart by two maps:

    absent       not dirty, not processing
    waiting      dirty, not processing, in the waiting set exactly once
    processing   processing, not dirty
    pending      processing and dirty: owned, and changed again meanwhile

``TRANSITIONS`` below is that machine as data: what ``add``, ``get`` and
``done`` do to a key in each state, and the event each one reports (the
tests walk it against the core). ``add`` marks a key dirty and pushes it only
if nobody holds it; ``done`` pushes it back if it was marked meanwhile. So a
key waits at most once, is held by at most one worker, and every add that
arrives after the last ``get`` leads to one more ``get``.

Around that machine: delayed keys sit in a ``LazyHeap`` by ready time
(``delayed`` holds each key's one live entry: the earliest ready time asked,
the highest priority), and ``promote`` applies the add rule to those that
are due; failures are counted for ``max_retries``; a key given up is kept
in ``dead`` (bounded, oldest dropped first) until replayed; ``shutdown``
refuses adds and drops delays. ``shutdown(drain=True)`` keeps the keys
backing off (entries made by a rate-limited add: a retry,
``add_rate_limited``) and, while the
queue drains, takes the backoffs of held keys as a live queue does, so a key
that fails during a drain comes back rather than being given up
(``draining``); ``idle`` (nothing dirty, held or delayed) is what ``join``
and a drain wait for. The waiting set's order is not decided here
(``_waiting``): ``FifoWaiting`` until the first non-zero priority, then
``RankedWaiting`` for good (``rank``); with ``fair_by``, a ``FairWaiting``
from the start (round-robin across groups within a priority). The FIFO's push and pop are inlined
in ``add`` and ``get`` (the hot path: a queue that never sees a priority pays
one ``if priority`` in ``add`` for them).

The core never locks, waits or reads a clock: each call gets ``now`` and
returns what the front must do (wake one getter, wake them all, re-arm the
timer). The threading front, the asyncio front and the Redis scripts (one per
transition, named after these methods) all host this one set of rules.
Nothing here allocates on a coalesced add; an observer is called only if one
was set.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Mapping
from itertools import islice
from operator import itemgetter
from typing import Any, Final, Generic, TypeVar

from ._checks import (
    check_add_after,
    check_aging,
    check_max_retries,
    check_priority,
)
from ._dead import DEAD_LIMIT, DeadKey
from ._errors import Empty, ShutDown
from ._events import EventKind, Observer
from ._heap import LazyHeap
from ._snapshot import DelayedKey, FailingKey, HeldKey, Snapshot, WaitingKey
from ._stats import Stats
from ._waiting import FairWaiting, FifoWaiting, RankedWaiting, Waiting, group_of

__all__ = ["ABSENT", "PENDING", "PROCESSING", "TRANSITIONS", "WAITING", "Core"]

K = TypeVar("K")

# -- the key's transitions ----------------------------------------------------------

ABSENT: Final = "absent"
WAITING: Final = "waiting"
PROCESSING: Final = "processing"
PENDING: Final = "pending"

TRANSITIONS: Final[dict[str, dict[str, tuple[str, tuple[EventKind, ...]]]]] = {
    # state: {call: (next state, events reported)}, on a live queue. A call
    # missing from a state's row is refused for that key: ``get`` hands out
    # only a waiting key; ``done`` of a key not processing raises ValueError.
    # After shutdown ``add`` changes nothing (and reports nothing); ``get`` and
    # ``done`` go on as here until nothing is dirty.
    ABSENT: {
        "add": (WAITING, (EventKind.ENQUEUE,)),
    },
    WAITING: {
        "add": (WAITING, (EventKind.COALESCE,)),
        "get": (PROCESSING, (EventKind.GET,)),
    },
    PROCESSING: {
        "add": (PENDING, (EventKind.MARK_WHILE_PROCESSING,)),
        "done": (ABSENT, (EventKind.DONE,)),
    },
    PENDING: {
        "add": (PENDING, (EventKind.COALESCE,)),
        "done": (WAITING, (EventKind.DONE, EventKind.REDELIVER)),
    },
}

# Final: compiled, these are C statics rather than module-dict lookups.
_ENQUEUE: Final = EventKind.ENQUEUE
_COALESCE: Final = EventKind.COALESCE
_MARK: Final = EventKind.MARK_WHILE_PROCESSING
_REDELIVER: Final = EventKind.REDELIVER
_GET: Final = EventKind.GET
_DONE: Final = EventKind.DONE
_DELAY: Final = EventKind.DELAY
_RATE_LIMIT: Final = EventKind.RATE_LIMIT
_COUNT: Final = itemgetter(1)


def _due_in(entry: list[Any] | None, now: float) -> float | None:
    """Seconds until a delayed entry is due (None: not delayed)."""
    return None if entry is None else float(entry[0]) - now


class Core(Generic[K]):
    """The dirty/processing rules, delays, failures and shutdown, with time passed in.

    Not thread-safe: a front serializes every call (one lock per queue).
    Compiled, a ``Core`` is a native class: never take a weak reference to one
    (``Generic`` gives it a weakref slot that mypyc's deallocator does not
    clear, mypyc/mypyc#1102), and do not subclass it in Python.
    """

    __slots__ = (
        "aging",
        "backoff_total",
        "coalesced",
        "dead",
        "delayed",
        "dirty",
        "draining",
        "failing",
        "failures",
        "fair_by",
        "fifo",
        "gets",
        "heap",
        "is_ranked",
        "marked",
        "max_backoff",
        "max_depth",
        "max_retries",
        "observer",
        "pending_priority",
        "processing",
        "ranked",
        "rate_limited",
        "redeliveries",
        "retries",
        "shutting_down",
        "wait_total",
        "waiting",
        "waiting_set",
        "work_total",
    )

    def __init__(
        self,
        max_retries: Any = None,
        aging: Any = None,
        fair_by: Callable[[Any], str] | None = None,
    ) -> None:
        # ``Any``: checked here, so a compiled build raises the same errors.
        self.max_retries = check_max_retries(max_retries)
        # Seconds a waiting key takes to gain one priority step; None: strict.
        self.aging = check_aging(aging)
        # key -> time the add that made it dirty happened. A key is dirty iff it
        # is waiting (then it is in the waiting set exactly once) or pending.
        self.dirty: dict[K, float] = {}
        # key -> (time of its ``get``, who took it: the front's token, a thread
        # ident or a task, named only by ``snapshot``). A processing key never waits.
        self.processing: dict[K, tuple[float, Any]] = {}
        # The waiting set (``_waiting``): FifoWaiting, then RankedWaiting once
        # ranked (``is_ranked``). Invariant: it holds exactly the keys that are
        # dirty and not processing, each once.
        fifo: FifoWaiting[K] = FifoWaiting()
        self.waiting_set: Waiting[K] = fifo
        self.is_ranked = False
        # The FIFO's deque, pushed and popped here inline (empty once ranked).
        self.fifo: deque[K] = fifo.keys
        # The ranked set's entries by key (empty until ranked).
        self.ranked: dict[K, list[Any]] = {}
        # The waiting set's container, ``fifo`` or ``ranked``: its truth and
        # length are the fronts' "is a key waiting" and ``len()``.
        self.waiting: Collection[K] = self.fifo
        # With ``fair_by`` the queue is ranked from its start, on a FairWaiting.
        self.fair_by = fair_by
        if fair_by is not None:
            fair: FairWaiting[K] = FairWaiting(self.aging, fair_by)
            self.waiting_set = fair
            self.ranked = fair.entries
            self.waiting = fair.entries
            self.is_ranked = True
        # key -> priority of a key pending redelivery, when not 0.
        self.pending_priority: dict[K, int] = {}
        # key -> its live entry [ready, seq, key, priority, backoff] in ``heap``;
        # backoff: a rate-limited add asked for it (a drain keeps those).
        self.delayed: dict[K, list[Any]] = {}
        self.heap = LazyHeap()
        # key -> failures recorded by ``record_failure`` (only with max_retries).
        self.failures: dict[K, int] = {}
        # key -> failures recorded by ``record_failure``, with or without
        # max_retries, until ``forget``: what a snapshot's ``failing`` shows.
        self.failing: dict[K, int] = {}
        # key -> (reason, error type, error message, failures, wall time): the
        # keys given up (``give_up``), oldest first, at most DEAD_LIMIT. Touched
        # only by give_up and the calls that read or replay it.
        self.dead: dict[K, tuple[str, str | None, str | None, int, float]] = {}
        self.shutting_down = False
        # Set by shutdown(drain=True), for good: held keys' backoffs are still
        # taken (retry, add_rate_limited of a key being processed), the keys
        # backing off are kept and come due, and get waits until the queue is
        # idle, not only until nothing is dirty (``exhausted``).
        self.draining = False
        self.observer: Observer | None = None
        # Counters. ``enqueued`` is derived: every push is an enqueue or a
        # redelivery, every get pops one, so enqueued = gets + depth - redeliveries.
        self.coalesced = self.marked = self.redeliveries = 0
        self.gets = self.retries = self.rate_limited = self.max_depth = 0
        self.wait_total = self.work_total = 0.0
        # Seconds of the backoffs the rate limiter handed out (``rate_limited``
        # of them), and the longest of them.
        self.backoff_total = self.max_backoff = 0.0

    # -- the add rule -----------------------------------------------------------

    def add(self, key: K, now: float, priority: Any = 0) -> bool:
        """Mark ``key`` dirty. True if it was pushed (the front wakes one getter).

        Higher ``priority`` is handed out first; a key keeps the highest it was
        added with until its ``get``. A bad priority raises (``check_priority``)
        and changes nothing; so does an exception from ``fair_by``.
        """
        if priority:
            self.rank(priority)  # checks it; ranked from now on
        else:
            priority = 0  # a false value (None, 0.0) is 0
        if self.shutting_down:
            return False
        return self.add_now(key, now, priority)

    def add_now(self, key: K, now: float, priority: Any) -> bool:
        """The add rule itself, for a checked ``priority`` and whether or not
        the queue is shutting down (``add`` refuses adds after shutdown; a
        drain's backoffs coming due, and a held key's re-add at once, land here)."""
        dirty = self.dirty
        if key in dirty:  # waiting or pending: coalesced
            self.coalesced += 1
            if self.is_ranked and not self.waiting_set.touch(key, priority):
                pending = self.pending_priority  # pending: keep the highest priority
                if priority > pending.get(key, 0):
                    if priority:
                        pending[key] = priority
                    else:
                        del pending[key]  # it was below 0
            if self.observer is not None:
                self.observer(_COALESCE, key, now, None)
            return False
        if key in self.processing:  # processing -> pending
            if self.fair_by is not None:
                self.check_group(key)  # its done pushes it: a raise now changes nothing
            dirty[key] = now
            self.marked += 1
            if priority:
                self.pending_priority[key] = priority
            if self.observer is not None:
                self.observer(_MARK, key, now, None)
            return False
        dirty[key] = now
        if self.is_ranked:  # absent -> waiting
            try:
                depth = self.waiting_set.push(key, priority, now, self.gets)
            except BaseException:  # fair_by raised: the key is not added
                del dirty[key]
                raise
        else:  # FifoWaiting.push, inlined (an add's arrival is its dirty time)
            fifo = self.fifo
            fifo.append(key)
            depth = len(fifo)
        if depth > self.max_depth:
            self.max_depth = depth
        if self.observer is not None:
            self.observer(_ENQUEUE, key, now, None)
        return True

    def add_many(self, keys: list[K], now: float, priority: Any = 0) -> int:
        """``add`` each of ``keys`` (checked by ``check_keys``), in order, at
        ``now``; how many were pushed (the front wakes that many getters).
        With ``fair_by``, every key's group is checked first: a raise adds none."""
        if self.fair_by is not None and not self.shutting_down:
            for key in keys:
                self.check_group(key)
        pushed = 0
        for key in keys:
            if self.add(key, now, priority):
                pushed += 1
        return pushed

    # -- get / done -------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """Shut down and nothing dirty: ``get`` raises ShutDown now and forever.

        A key pending redelivery keeps the queue open: its ``done`` pushes it.
        While draining, so does a held key (it may fail and back off) and a key
        backing off: then the queue is exhausted once it is ``idle``.
        """
        if not self.shutting_down or self.dirty:
            return False
        return not self.draining or (not self.processing and not self.delayed)

    @property
    def idle(self) -> bool:
        """Nothing waiting, pending, processing or delayed: what ``join`` and a
        drain wait for."""
        return not self.dirty and not self.processing and not self.delayed

    def get(self, now: float, holder: Any = None) -> K:
        """Hand out the next waiting key (waiting -> processing): the oldest, or
        once ranked the first by rank, held by ``holder`` (whatever the front
        names the taker by; ``snapshot`` shows it). Raises Empty, or ShutDown
        if exhausted."""
        fifo = self.fifo
        if fifo:
            key = fifo.popleft()  # FifoWaiting.pop, inlined
        elif self.ranked:
            key = self.waiting_set.pop()
        elif self.shutting_down and self.exhausted:
            raise ShutDown("queue is shut down")
        else:
            raise Empty
        waited = now - self.dirty.pop(key)
        self.processing[key] = (now, holder)
        self.gets += 1
        self.wait_total += waited
        if self.observer is not None:
            self.observer(_GET, key, now, waited)
        return key

    def done(self, key: K, now: float) -> bool:
        """End processing of ``key`` (processing -> absent, pending -> waiting).
        True if it was pushed again (the front wakes one getter).

        Raises ValueError if ``key`` is not being processed: a caller bug that
        would otherwise corrupt the queue.
        """
        try:
            started = self.processing.pop(key)[0]
        except KeyError:
            raise ValueError(f"done({key!r}): key is not being processed") from None
        worked = now - started
        self.work_total += worked
        redeliver = key in self.dirty
        if redeliver:  # it arrives in the waiting set now, not at its dirty time
            self.redeliveries += 1
            priority = self.pending_priority.pop(key, 0)
            try:
                depth = self.waiting_set.push(key, priority, now, self.gets)
            except BaseException:  # fair_by raised: the key is left absent
                del self.dirty[key]
                raise
            if depth > self.max_depth:
                self.max_depth = depth
        observer = self.observer
        if observer is not None:
            observer(_DONE, key, now, worked)
            if redeliver:
                observer(_REDELIVER, key, now, None)
        return redeliver

    # -- delays -----------------------------------------------------------------

    def add_after(
        self, key: K, delay: Any, now: float, kind: EventKind = _DELAY, priority: Any = 0
    ) -> bool:
        """Make ``key`` ready at ``now + delay``; the earliest ready time wins.

        If that is not later than ``now`` (``delay <= 0``, or a delay too small
        to move ``now`` in floating point) the add rule applies now. Returns what
        ``add`` returns (True: pushed now). A no-op after shutdown. ``kind`` is
        DELAY or RATE_LIMIT, for counting and for the observer. The delayed
        entry keeps the highest ``priority`` asked and is added with it. Bad
        input raises (see ``check_add_after``, ``check_priority``) and changes
        nothing.
        """
        return self.add_after_unchecked(key, check_add_after(key, delay), now, kind, priority)

    def add_after_unchecked(
        self, key: K, delay: float, now: float, kind: EventKind = _DELAY, priority: Any = 0
    ) -> bool:
        """``add_after`` for a key and delay already checked by ``check_add_after``.

        The fronts' entry, so that each call checks its input once. A non-zero
        priority is still checked here (it is the rare path), before any
        change; so is the group of a key not held (``check_group``: a held
        key's was, at its push), which its push needs when it comes due.
        """
        if priority:
            self.rank(priority)  # a priority was seen: ranked from now on
        else:
            priority = 0  # a false value (None, 0.0) is 0
        if self.shutting_down and not self.backs_off_draining(key, kind):
            return False
        if self.fair_by is not None and key not in self.processing:
            self.check_group(key)
        self.retries += 1
        if kind is _RATE_LIMIT:
            self.rate_limited += 1
            self.backoff_total += delay
            if delay > self.max_backoff:
                self.max_backoff = delay
        if self.observer is not None:
            self.observer(kind, key, now, delay)
        ready = now + delay
        if ready <= now:
            return self.add_now(key, now, priority)
        backoff = kind is _RATE_LIMIT
        delayed = self.delayed
        current = delayed.get(key)
        if current is not None:
            if priority < current[3]:
                priority = current[3]
            backoff = backoff or current[4]
            if current[0] <= ready:  # the earlier entry stands, with the higher priority
                current[3] = priority
                current[4] = backoff
                return False
        entry = [ready, self.heap.next_seq(), key, priority, backoff]
        delayed[key] = entry
        if current is None:
            self.heap.push(entry)
        else:
            self.heap.replace(current, entry)
        return False

    def backs_off_draining(self, key: K, kind: EventKind = _RATE_LIMIT) -> bool:
        """Whether a shut-down queue still takes this delayed add: a backoff
        (``kind`` RATE_LIMIT) of a key being processed, while draining."""
        return self.draining and kind is _RATE_LIMIT and key in self.processing

    @property
    def next_ready(self) -> float | None:
        """The earliest time a delayed key (or a replaced entry) comes due."""
        return self.heap.first()

    def promote(self, now: float) -> int:
        """Apply the add rule to every delayed key ready at ``now`` (Lua ``promote``).

        Returns how many keys were pushed (the front wakes that many getters).
        """
        heap, delayed = self.heap, self.delayed
        pushed = 0
        entry = heap.pop_until(now)
        while entry is not None:
            key = entry[2]
            del delayed[key]
            if self.add_now(key, now, entry[3]):
                pushed += 1
            entry = heap.pop_until(now)
        return pushed

    # -- failures ---------------------------------------------------------------

    def retry(self, key: K, delay: float, now: float) -> bool | None:
        """A held ``key`` failed: count it, decide, and schedule its re-add, in one step.

        Returns None to give up (the caller forgets the key): this was its
        ``max_retries``-th failure, or the queue is shut down without a drain
        and nothing will hand the key out again. Otherwise the key comes back,
        and the result is what ``add_after`` returns (True: pushed now, wake a
        getter). On a live queue, and on a draining one, it comes back after
        ``delay``, the rate limiter's answer (checked as ``check_add_after``
        does): a rate-limited ``add_after``. While shutting down, a key added
        again while held comes back anyway (its ``done`` pushes it): the
        failure is counted, nothing is scheduled.
        """
        if self.shutting_down and (key in self.dirty or not self.backs_off_draining(key)):
            if key not in self.dirty:
                return None
            self.record_failure(key)
            return False
        if not self.record_failure(key):
            return None
        return self.add_after_unchecked(key, delay, now, _RATE_LIMIT)

    def retry_backs_off(self, key: K) -> bool:
        """Whether ``retry(key, ...)`` would now re-add ``key`` after a delay.

        True on a live (or draining) queue when this failure would not be the
        key's ``max_retries``-th. A front asks its rate limiter for the delay only
        then, so a key that is given up, or comes back anyway at shutdown,
        spends no backoff and no token of a shared bucket. Read without the
        lock it is a hint, and ``retry`` decides: if a concurrent ``forget``
        makes ``retry`` re-add a key this said no to, the delay it gets is 0.
        """
        if self.shutting_down and (key in self.dirty or not self.backs_off_draining(key)):
            return False
        max_retries = self.max_retries
        return max_retries is None or self.failures.get(key, 0) + 1 < max_retries

    def record_failure(self, key: K) -> bool:
        """Count a failure of ``key``; False once it has failed ``max_retries`` times.

        The counting half of ``retry`` (the Redis scripts transcribe it).
        """
        failing = self.failing
        failing[key] = failing.get(key, 0) + 1
        if self.max_retries is None:
            return True
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        return failures < self.max_retries

    def forget(self, key: K) -> None:
        """Drop ``key``'s failure count."""
        self.failures.pop(key, None)
        self.failing.pop(key, None)

    # -- dead keys ----------------------------------------------------------------

    def give_up(
        self, key: K, reason: str, error_type: str | None, error: str | None, at: float
    ) -> None:
        """``forget`` ``key`` and keep it as dead (the newest; a key given up
        again replaces its entry), with the failures it had; the oldest is
        dropped beyond ``DEAD_LIMIT``. ``at`` is wall time (the front's)."""
        failures = self.failing.get(key, 0)
        self.forget(key)
        dead = self.dead
        dead.pop(key, None)
        dead[key] = (reason, error_type, error, failures, at)
        if len(dead) > DEAD_LIMIT:
            del dead[next(iter(dead))]

    def dead_keys(self, limit: int) -> tuple[DeadKey[K], ...]:
        """The first ``limit`` dead keys, newest first."""
        return tuple(
            DeadKey(key, *entry) for key, entry in islice(reversed(self.dead.items()), limit)
        )

    def replay(self, key: K, now: float) -> bool | None:
        """Add a dead ``key`` back: its entry dropped, its failures cleared,
        then the add rule (a key waiting or held meanwhile is coalesced or
        marked, as any add). None if it is not dead, or the queue is shut down
        (nothing changes); else what ``add`` returns (True: pushed, wake a getter)."""
        if self.shutting_down or key not in self.dead:
            return None
        if self.fair_by is not None:
            self.check_group(key)  # a raise leaves it dead
        del self.dead[key]
        self.forget(key)
        return self.add_now(key, now, 0)

    def replay_all(self, now: float) -> tuple[list[K], int]:
        """``replay`` every dead key, oldest first: the keys replayed (none
        once shut down) and how many were pushed."""
        if self.shutting_down:
            return [], 0
        keys = list(self.dead)
        if self.fair_by is not None:
            for key in keys:
                self.check_group(key)  # a raise replays none
        pushed = 0
        for key in keys:
            if self.replay(key, now):
                pushed += 1
        return keys, pushed

    def check_group(self, key: K) -> None:
        """``fair_by(key)`` checked now (a str, else ``TypeError``; its
        exceptions propagate), for a ``fair_by`` queue: the calls that push
        a key later (an add of a held key, a delayed add) or push several
        (``add_many``, ``replay``, ``replay_all``) check first, so that a
        bad group fails the call and changes nothing. Its push checks again."""
        fair_by = self.fair_by
        if fair_by is not None:
            group_of(fair_by, key)

    def forget_dead(self, key: K) -> bool:
        """Drop ``key``'s dead entry; False if it had none."""
        return self.dead.pop(key, None) is not None

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, now: float, drain: bool = False) -> bool:
        """Stop accepting adds and drop delayed keys. False if already shut down.

        Keys waiting, and keys pending redelivery, are still handed out. With
        ``drain`` the queue drains (``draining``, for good): the keys backing
        off are kept (if this is the first shutdown) and come due, held keys
        that fail back off and come back, and ``get`` goes on until ``idle``.
        """
        if drain:
            self.draining = True
        if self.shutting_down:
            return False
        self.shutting_down = True
        backing_off = [entry for entry in self.delayed.values() if entry[4]] if drain else []
        self.delayed.clear()
        self.heap.clear()
        for entry in backing_off:
            self.delayed[entry[2]] = entry
            self.heap.push(entry)
        if self.observer is not None:
            self.observer(EventKind.SHUTDOWN, None, now, None)
        return True

    # -- priorities ---------------------------------------------------------------

    def rank(self, priority: Any = 1) -> None:
        """Check ``priority`` (raises, changing nothing); then, once, become ranked.

        The waiting keys keep their order and their arrival times.
        """
        check_priority(priority)
        if self.is_ranked:
            return
        fifo = self.waiting_set
        assert isinstance(fifo, FifoWaiting)
        ranked = RankedWaiting(self.aging, fifo, self.dirty, self.gets)
        fifo.keys.clear()
        fifo.repushed.clear()
        self.waiting_set = ranked
        self.ranked = ranked.entries
        self.waiting = ranked.entries
        self.is_ranked = True

    # -- introspection ----------------------------------------------------------

    def stats(self, now: float | None = None) -> Stats:
        """A frozen snapshot; ``now`` dates ``oldest_wait_seconds`` (0.0 without it)."""
        depth = len(self.waiting)
        enqueued = self.gets + depth - self.redeliveries
        return Stats(
            adds=enqueued + self.coalesced + self.marked,
            enqueued=enqueued,
            coalesced=self.coalesced,
            marked_while_processing=self.marked,
            redeliveries=self.redeliveries,
            gets=self.gets,
            dones=self.gets - len(self.processing),
            retries=self.retries,
            rate_limited=self.rate_limited,
            rate_limit_delay_seconds=self.backoff_total,
            max_rate_limit_delay_seconds=self.max_backoff,
            depth=depth,
            max_depth=self.max_depth,
            processing=len(self.processing),
            delayed=len(self.delayed),
            queue_wait_seconds=self.wait_total,
            work_seconds=self.work_total,
            shutting_down=self.shutting_down,
            waiting_by_priority=self.waiting_by_priority(),
            oldest_wait_seconds=0.0 if now is None else self.oldest_wait(now),
        )

    def snapshot(
        self, now: float, limit: int, holder_name: Callable[[Any], str | None] | None = None
    ) -> Snapshot[K]:
        """``stats(now)`` and the first ``limit`` keys of each list (``Snapshot``).

        A held key's ``holder`` is ``holder_name(holder)`` of what its ``get``
        was given (None without ``holder_name``). Costs O(limit log limit),
        plus O(n log limit) over the failing keys.
        """
        delayed = self.delayed
        held = islice(self.processing.items(), limit)  # get order: longest held first
        failing = heapq.nlargest(limit, self.failing.items(), key=_COUNT)
        return Snapshot(
            self.stats(now),
            tuple(
                WaitingKey(key, priority, waited)
                for key, priority, waited in self.waiting_set.first(
                    limit, now, self.dirty, self.gets
                )
            ),
            tuple(
                HeldKey(
                    key,
                    None if holder_name is None else holder_name(holder),
                    None,
                    now - started,
                    None,
                )
                for key, (started, holder) in held
            ),
            tuple(
                DelayedKey(entry[2], entry[0] - now, entry[3])
                for entry in self.heap.smallest(limit)
            ),
            tuple(
                FailingKey(key, failures, _due_in(delayed.get(key), now))
                for key, failures in failing
            ),
            now,
            limit,
            len(self.failing),
            self.dead_keys(limit),
        )

    def waiting_by_priority(self) -> Mapping[int, int]:
        """Waiting keys by priority, highest first (read-only): ``{0: depth}`` until ranked."""
        return self.waiting_set.by_priority()

    def oldest_wait(self, now: float) -> float:
        """Seconds the waiting key that arrived first has waited (0.0 if none).

        Safe from a scrape thread: a change meanwhile reads as nothing waiting.
        """
        return self.waiting_set.oldest(now, self.dirty, self.gets)

    def unfinished(self, now: float) -> tuple[float, float]:
        """(total, longest) seconds that keys now processing have been held."""
        total = longest = 0.0
        for started, _ in tuple(self.processing.values()):  # a copy: safe from a scrape thread
            held = now - started
            total += held
            if held > longest:
                longest = held
        return total, longest
