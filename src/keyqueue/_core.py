"""The pure state machine every front runs.

Theory of operation
-------------------
A key is in one of four states, told apart by two maps:

    absent       not dirty, not processing
    waiting      dirty, not processing, in the FIFO exactly once
    processing   processing, not dirty
    pending      processing and dirty: owned, and changed again meanwhile

``add`` marks a key dirty and pushes it only if nobody holds it; ``done`` pushes
it back if it was marked meanwhile. So a key is in the FIFO at most once, held by
at most one worker, and every add that arrives after the last ``get`` leads to
one more ``get``. Delayed keys sit in a heap with lazy deletion: ``delayed``
holds each key's one entry (the earliest ready time asked for); replaced
entries are skipped when they surface.

The core never locks, waits or reads a clock: each call gets ``now`` and returns
what the front must do (wake one getter, wake them all, re-arm the timer). The
threading front, the asyncio front and the Redis scripts all host this one set
of rules. Nothing here allocates on a coalesced add; an observer is called only
if one was set.

A replaced heap entry (an earlier time was asked) stays in the heap with its key
slot cleared, so it keeps no key alive; the heap is compacted when such entries
outnumber live ones.

Priorities (docs/fairness.md)
-----------------------------
A core starts as a FIFO: a deque, exactly the path of a queue that never heard
of priorities. The first add (or due delayed key) with a non-zero priority turns
it, once and for good, into a ranked core (``is_ranked``; the same object, so
fronts and timers keep their reference): from then on the ``_*_ranked``
methods handle what touches the waiting set. The FIFO path pays one
``if priority or self.is_ranked`` in ``add`` for priorities it never uses;
``get`` and ``done`` look at ``is_ranked`` only where the FIFO path branches
anyway (an empty FIFO, a redelivery).

Ranked, the waiting keys sit in a heap ordered by a static score and then by
arrival. A key's wait starts when it enters the waiting set (its add, or the
``done`` that pushes it back). With ``aging=None`` the score is ``-priority``:
strict priorities. With ``aging=a`` the effective priority of a key that
arrived at ``t`` is ``priority + (now - t) / a`` (continuous aging); every
waiting key ages at the same rate, so ranking by it at any ``now`` is ranking
by ``t - priority * a``, which never changes while the key waits: the score.
A key is ranked ahead of every key that arrives more than
``(P_max - priority) * a`` seconds after it, so no stream of higher-priority
keys holds it back longer than that, plus the time to serve what was ahead.
A key keeps the highest priority it was added with (as controller-runtime):
raising a waiting key's priority pushes a new entry with its old arrival and
marks the old one replaced (skipped when it surfaces, as in the delay heap).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Collection, Mapping
from operator import itemgetter
from typing import Any, Final, Generic, TypeVar

from ._checks import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    check_add_after,
    check_aging,
    check_flag,
    check_keys,
    check_max_retries,
    check_number,
    check_priority,
)
from ._errors import Empty, ShutDown
from ._events import EventKind, Observer
from ._stats import PriorityCounts, Stats

# Only ``Core`` is this module's own. The other names are re-exported for the
# modules that still import them from here (keyqueue.redis, _runner,
# informer); their home is ``_checks`` and ``_stats``.
__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "Core",
    "PriorityCounts",
    "Stats",
    "check_aging",
    "check_flag",
    "check_keys",
    "check_number",
    "check_priority",
]

K = TypeVar("K")

# Final: compiled, these are C statics rather than module-dict lookups.
_ENQUEUE: Final = EventKind.ENQUEUE
_COALESCE: Final = EventKind.COALESCE
_MARK: Final = EventKind.MARK_WHILE_PROCESSING
_REDELIVER: Final = EventKind.REDELIVER
_GET: Final = EventKind.GET
_DONE: Final = EventKind.DONE
_DELAY: Final = EventKind.DELAY
_RATE_LIMIT: Final = EventKind.RATE_LIMIT
_REMOVED: Final[Any] = object()  # the key slot of a replaced heap entry
_PRIORITY: Final = itemgetter(3)  # the priority slot of a ranked entry


class Core(Generic[K]):
    """Dirty/processing/FIFO/delay/shutdown rules, with time passed in.

    Not thread-safe: a front serializes every call (one lock per queue).
    Compiled, a ``Core`` is a native class: never take a weak reference to one
    (``Generic`` gives it a weakref slot that mypyc's deallocator does not
    clear, mypyc/mypyc#1102), and do not subclass it in Python.
    """

    __slots__ = (
        "_counter",
        "_rank_stale",
        "_stale",
        "aging",
        "coalesced",
        "delayed",
        "dirty",
        "failures",
        "fifo",
        "gets",
        "heap",
        "is_ranked",
        "marked",
        "max_depth",
        "max_retries",
        "observer",
        "pending_priority",
        "processing",
        "rank_heap",
        "ranked",
        "rate_limited",
        "redeliveries",
        "repushed",
        "retries",
        "shutting_down",
        "wait_total",
        "waiting",
        "work_total",
    )

    def __init__(self, max_retries: Any = None, aging: Any = None) -> None:
        # ``Any``: checked here, so a compiled build raises the same errors.
        self.max_retries = check_max_retries(max_retries)
        # Seconds a waiting key takes to gain one priority step; None: strict.
        self.aging = check_aging(aging)
        # key -> time the add that made it dirty happened. A key is dirty iff it
        # is waiting (then it is in ``fifo`` exactly once) or pending redelivery.
        self.dirty: dict[K, float] = {}
        # key -> time of its ``get``. A processing key is never in ``fifo``.
        self.processing: dict[K, float] = {}
        # Waiting keys, oldest first. Invariant: every key here is dirty and not
        # processing, and appears once. Empty (and unused) once ranked.
        self.fifo: deque[K] = deque()
        # (push ordinal, time) of each key ``done`` pushed back, oldest first: when
        # it entered the waiting set (its dirty time is the add while it was
        # held). The head of ``fifo`` is push number ``gets``; entries below
        # that are dropped at the next push back, so this holds no key and no
        # more entries than ``fifo``. Read by ``oldest_wait`` only.
        self.repushed: deque[tuple[int, float]] = deque()
        # Ranked (after the first priority): waiting key -> its live heap entry
        # [score, seq, key, priority, arrival], in arrival order; a replaced
        # entry stays in ``rank_heap`` with its key slot set to ``_REMOVED``
        # (``_rank_stale`` counts them). Invariant: ``ranked`` holds exactly the
        # waiting keys, and each one's entry in ``rank_heap`` once.
        self.is_ranked = False
        self.ranked: dict[K, list[Any]] = {}
        self.rank_heap: list[list[Any]] = []
        self._rank_stale = 0
        # key -> priority of a key pending redelivery, when not 0.
        self.pending_priority: dict[K, int] = {}
        # What holds the waiting keys (``fifo``, or ``ranked`` once ranked): its
        # truth and length are the fronts' "is a key waiting" and ``len()``.
        self.waiting: Collection[K] = self.fifo
        # key -> its one heap entry [ready, seq, key, priority] (the earliest
        # ready time asked; the highest priority asked). A replaced entry stays in
        # ``heap`` with its key slot set to ``_REMOVED`` (so it keeps nothing
        # alive) and is skipped when it surfaces; ``_stale`` counts them.
        self.delayed: dict[K, list[Any]] = {}
        self.heap: list[list[Any]] = []
        self._counter = itertools.count()
        self._stale = 0
        # key -> failures recorded by ``record_failure`` (only with max_retries).
        self.failures: dict[K, int] = {}
        self.shutting_down = False
        self.observer: Observer | None = None
        # Counters. ``enqueued`` is derived: every push is an enqueue or a
        # redelivery, every get pops one, so enqueued = gets + depth - redeliveries.
        self.coalesced = self.marked = self.redeliveries = 0
        self.gets = self.retries = self.rate_limited = self.max_depth = 0
        self.wait_total = self.work_total = 0.0

    # -- the add rule -----------------------------------------------------------

    def add(self, key: K, now: float, priority: Any = 0) -> bool:
        """Mark ``key`` dirty. True if it was pushed (the front wakes one getter).

        Higher ``priority`` is handed out first; a key keeps the highest it was
        added with until its ``get``. A bad priority raises (``check_priority``)
        and changes nothing.
        """
        if priority or self.is_ranked:
            return self._add_ranked(key, now, priority)
        if self.shutting_down:
            return False
        dirty = self.dirty
        if key in dirty:
            self.coalesced += 1
            if self.observer is not None:
                self.observer(_COALESCE, key, now, None)
            return False
        dirty[key] = now
        if key in self.processing:
            self.marked += 1
            if self.observer is not None:
                self.observer(_MARK, key, now, None)
            return False
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
        ``now``; how many were pushed (the front wakes that many getters)."""
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
        """
        return self.shutting_down and not self.dirty

    @property
    def idle(self) -> bool:
        """Nothing waiting, pending or processing (what a drain waits for)."""
        return not self.dirty and not self.processing

    def get(self, now: float) -> K:
        """Hand out the oldest waiting key. Raises Empty, or ShutDown if exhausted."""
        fifo = self.fifo
        if not fifo:
            if self.ranked:
                return self._get_ranked(now)
            if self.shutting_down and not self.dirty:
                raise ShutDown("queue is shut down")
            raise Empty
        key = fifo.popleft()
        waited = now - self.dirty.pop(key)
        self.processing[key] = now
        self.gets += 1
        self.wait_total += waited
        if self.observer is not None:
            self.observer(_GET, key, now, waited)
        return key

    def done(self, key: K, now: float) -> bool:
        """End processing of ``key``. True if it was pushed again (wake one getter).

        Raises ValueError if ``key`` is not being processed: a caller bug that
        would otherwise corrupt the queue.
        """
        try:
            started = self.processing.pop(key)
        except KeyError:
            raise ValueError(f"done({key!r}): key is not being processed") from None
        worked = now - started
        self.work_total += worked
        redeliver = key in self.dirty
        if redeliver and self.is_ranked:
            self._push_ranked(key, self.pending_priority.pop(key, 0), now)
            self.redeliveries += 1
        elif redeliver:
            fifo = self.fifo
            fifo.append(key)
            self.redeliveries += 1
            depth = len(fifo)
            if depth > self.max_depth:
                self.max_depth = depth
            repushed, gets = self.repushed, self.gets
            while repushed and repushed[0][0] < gets:
                repushed.popleft()
            repushed.append((gets + depth - 1, now))
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
        priority is still checked here (it is the rare path), before any change.
        """
        if priority:
            self.rank(priority)  # a priority was seen: ranked from now on
        else:
            priority = 0  # a false value (None, 0.0) is 0
        if self.shutting_down:
            return False
        self.retries += 1
        if kind is _RATE_LIMIT:
            self.rate_limited += 1
        if self.observer is not None:
            self.observer(kind, key, now, delay)
        ready = now + delay
        if ready <= now:
            return self.add(key, now, priority)
        current = self.delayed.get(key)
        if current is not None:
            if priority < current[3]:
                priority = current[3]
            if current[0] <= ready:
                current[3] = priority
                return False
            current[2] = _REMOVED
            self._stale += 1
        entry = [ready, next(self._counter), key, priority]
        self.delayed[key] = entry
        heapq.heappush(self.heap, entry)
        if self._stale > 64 and self._stale > len(self.delayed):
            self._compact()
        return False

    @property
    def next_ready(self) -> float | None:
        """The earliest time a delayed key (or a stale entry) comes due."""
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now: float) -> int:
        """Apply the add rule to every delayed key ready at ``now``.

        Returns how many keys were pushed (the front wakes that many getters).
        """
        heap, delayed = self.heap, self.delayed
        pushed = 0
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            key = entry[2]
            if key is _REMOVED:
                self._stale -= 1
                continue
            del delayed[key]
            if self.add(key, now, entry[3]):
                pushed += 1
        return pushed

    def _compact(self) -> None:
        self.heap = [entry for entry in self.heap if entry[2] is not _REMOVED]
        heapq.heapify(self.heap)
        self._stale = 0

    # -- failures ---------------------------------------------------------------

    def retry(self, key: K, delay: float, now: float) -> bool | None:
        """A held ``key`` failed: count it, decide, and schedule its re-add, in one step.

        Returns None to give up (the caller forgets the key): this was its
        ``max_retries``-th failure, or the queue is shutting down and nothing
        will hand the key out again. Otherwise the key comes back, and the
        result is what ``add_after`` returns (True: pushed now, wake a getter).
        On a live queue it comes back after ``delay``, the rate limiter's answer
        (checked as ``check_add_after`` does): a rate-limited ``add_after``.
        While shutting down, a key added again while held comes back anyway (its
        ``done`` pushes it): the failure is counted, nothing is scheduled.
        """
        if self.shutting_down:
            if key not in self.dirty:
                return None
            self.record_failure(key)
            return False
        if not self.record_failure(key):
            return None
        return self.add_after_unchecked(key, delay, now, _RATE_LIMIT)

    def retry_backs_off(self, key: K) -> bool:
        """Whether ``retry(key, ...)`` would now re-add ``key`` after a delay.

        True on a live queue when this failure would not be the key's
        ``max_retries``-th. A front asks its rate limiter for the delay only
        then, so a key that is given up, or comes back anyway at shutdown,
        spends no backoff and no token of a shared bucket. Read without the
        lock it is a hint, and ``retry`` decides: if a concurrent ``forget``
        makes ``retry`` re-add a key this said no to, the delay it gets is 0.
        """
        if self.shutting_down:
            return False
        max_retries = self.max_retries
        return max_retries is None or self.failures.get(key, 0) + 1 < max_retries

    def record_failure(self, key: K) -> bool:
        """Count a failure of ``key``; False once it has failed ``max_retries`` times.

        The counting half of ``retry`` (the Redis scripts transcribe it).
        """
        if self.max_retries is None:
            return True
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        return failures < self.max_retries

    def forget(self, key: K) -> None:
        """Drop ``key``'s failure count."""
        self.failures.pop(key, None)

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, now: float) -> bool:
        """Stop accepting adds and drop delayed keys. False if already shut down.

        Keys waiting, and keys pending redelivery, are still handed out.
        """
        if self.shutting_down:
            return False
        self.shutting_down = True
        self.delayed.clear()
        self.heap.clear()
        self._stale = 0
        if self.observer is not None:
            self.observer(EventKind.SHUTDOWN, None, now, None)
        return True

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

    def waiting_by_priority(self) -> Mapping[int, int]:
        """Waiting keys by priority, highest first (read-only): ``{0: depth}`` until ranked."""
        if self.is_ranked:
            counts = Counter(map(_PRIORITY, list(self.ranked.values())))  # a copy: scrape-safe
            return PriorityCounts(sorted(counts.items(), reverse=True))
        depth = len(self.fifo)
        return PriorityCounts({0: depth} if depth else ())

    def oldest_wait(self, now: float) -> float:
        """Seconds the waiting key that arrived first has waited (0.0 if none).

        Safe from a scrape thread: a change meanwhile reads as nothing waiting.
        """
        if self.is_ranked:
            # ``ranked`` is in arrival order (a promotion keeps a key's place).
            first = next(iter(self.ranked.values()), None)  # one C call: scrape-safe
            return 0.0 if first is None else now - float(first[4])
        try:
            since = self.dirty[self.fifo[0]]
        except (IndexError, KeyError):
            return 0.0
        gets = self.gets
        for ordinal, at in tuple(self.repushed):  # a copy: safe from a scrape thread
            if ordinal >= gets:
                if ordinal == gets:  # the head was pushed back by done
                    since = at
                break
        return now - since

    # -- priorities ---------------------------------------------------------------

    def rank(self, priority: Any = 1) -> None:
        """Check ``priority`` (raises, changing nothing); then, once, become ranked.

        The waiting keys keep their order and their arrival times.
        """
        check_priority(priority)
        if self.is_ranked:
            return
        gets, dirty, aging, counter = self.gets, self.dirty, self.aging, self._counter
        pushed_back = dict(self.repushed)
        for ordinal, key in enumerate(self.fifo, gets):
            since = pushed_back.get(ordinal)
            if since is None:
                since = dirty[key]
            entry = [0 if aging is None else since, next(counter), key, 0, since]
            self.ranked[key] = entry
            self.rank_heap.append(entry)
        heapq.heapify(self.rank_heap)  # already in order: arrivals only grow
        self.fifo.clear()
        self.repushed.clear()
        self.waiting = self.ranked
        self.is_ranked = True

    # -- ranked: the waiting set is a heap (see the module's theory of operation) --

    def _add_ranked(self, key: K, now: float, priority: Any) -> bool:
        if priority:
            self.rank(priority)  # checks it; ranked from now on
        else:
            priority = 0  # a false value (None, 0.0) is 0
        if self.shutting_down:
            return False
        dirty = self.dirty
        if key in dirty:
            self.coalesced += 1
            entry = self.ranked.get(key)
            if entry is not None:  # waiting
                if priority > entry[3]:
                    self._promote(entry, priority)
            else:  # pending redelivery
                pending = self.pending_priority
                if priority > pending.get(key, 0):
                    if priority:
                        pending[key] = priority
                    else:
                        del pending[key]  # it was below 0
            if self.observer is not None:
                self.observer(_COALESCE, key, now, None)
            return False
        dirty[key] = now
        if key in self.processing:
            self.marked += 1
            if priority:
                self.pending_priority[key] = priority
            if self.observer is not None:
                self.observer(_MARK, key, now, None)
            return False
        self._push_ranked(key, priority, now)
        if self.observer is not None:
            self.observer(_ENQUEUE, key, now, None)
        return True

    def _get_ranked(self, now: float) -> K:
        """Hand out the waiting key of highest effective priority (the earliest
        arrival among equals); ``get`` calls it when a key waits in ``ranked``."""
        ranked = self.ranked
        heap = self.rank_heap
        entry = heapq.heappop(heap)
        while entry[2] is _REMOVED:
            self._rank_stale -= 1
            entry = heapq.heappop(heap)
        key: K = entry[2]
        del ranked[key]
        waited = now - self.dirty.pop(key)
        self.processing[key] = now
        self.gets += 1
        self.wait_total += waited
        if self.observer is not None:
            self.observer(_GET, key, now, waited)
        return key

    def _push_ranked(self, key: K, priority: int, now: float) -> None:
        """``key`` enters the waiting set at ``now`` with ``priority``."""
        aging = self.aging
        score = -priority if aging is None else now - priority * aging
        entry = [score, next(self._counter), key, priority, now]
        ranked = self.ranked
        ranked[key] = entry
        heapq.heappush(self.rank_heap, entry)
        depth = len(ranked)
        if depth > self.max_depth:
            self.max_depth = depth

    def _promote(self, entry: list[Any], priority: int) -> None:
        """Raise a waiting key's priority; it keeps its arrival (and its place
        among keys that arrived at the same score)."""
        aging = self.aging
        score = -priority if aging is None else entry[4] - priority * aging
        if not score < entry[0]:  # the same rank in floating point: no move needed
            entry[3] = priority
            return
        key = entry[2]
        entry[2] = _REMOVED
        self._rank_stale += 1
        moved = [score, entry[1], key, priority, entry[4]]
        self.ranked[key] = moved
        heapq.heappush(self.rank_heap, moved)
        if self._rank_stale > 64 and self._rank_stale > len(self.ranked):
            self.rank_heap = [e for e in self.rank_heap if e[2] is not _REMOVED]
            heapq.heapify(self.rank_heap)
            self._rank_stale = 0

    def unfinished(self, now: float) -> tuple[float, float]:
        """(total, longest) seconds that keys now processing have been held."""
        total = longest = 0.0
        for started in tuple(self.processing.values()):  # a copy: safe from a scrape thread
            held = now - started
            total += held
            if held > longest:
                longest = held
        return total, longest
