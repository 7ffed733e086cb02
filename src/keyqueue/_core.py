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
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ._errors import Empty, ShutDown
from ._events import EventKind, Observer

__all__ = ["Core", "Stats"]

K = TypeVar("K")

_ENQUEUE = EventKind.ENQUEUE
_COALESCE = EventKind.COALESCE
_MARK = EventKind.MARK_WHILE_PROCESSING
_REDELIVER = EventKind.REDELIVER
_GET = EventKind.GET
_DONE = EventKind.DONE
_DELAY = EventKind.DELAY
_REMOVED: Any = object()  # the key slot of a replaced heap entry


@dataclass(frozen=True, slots=True)
class Stats:
    """A frozen snapshot of one queue's counters and sizes.

    ``adds == enqueued + coalesced + marked_while_processing`` always holds:
    every accepted add (including a delayed key coming due) is exactly one of
    those. Adds after shutdown are not accepted and not counted.
    """

    adds: int
    """Accepted add calls (explicit, ``add_after(<=0)``, and delayed keys coming due)."""
    enqueued: int
    """Adds that pushed a key onto the FIFO (absent → waiting)."""
    coalesced: int
    """Adds absorbed by a key already dirty (waiting, or pending redelivery)."""
    marked_while_processing: int
    """Adds that marked a held key for one redelivery."""
    redeliveries: int
    """Keys pushed again by ``done``."""
    gets: int
    dones: int
    retries: int
    """``add_after`` and ``add_rate_limited`` calls on a live queue."""
    rate_limited: int
    """``add_rate_limited`` calls on a live queue."""
    depth: int
    """Keys waiting in the FIFO now."""
    max_depth: int
    processing: int
    """Keys held by workers now."""
    delayed: int
    """Keys waiting for their ready time now."""
    queue_wait_seconds: float
    """Total time keys spent dirty before their ``get``."""
    work_seconds: float
    """Total time keys were held, over finished ``done`` calls."""
    shutting_down: bool


class Core(Generic[K]):
    """Dirty/processing/FIFO/delay/shutdown rules, with time passed in.

    Not thread-safe: a front serializes every call (one lock per queue).
    """

    __slots__ = (
        "_counter",
        "_stale",
        "coalesced",
        "delayed",
        "dirty",
        "failures",
        "fifo",
        "gets",
        "heap",
        "marked",
        "max_depth",
        "max_retries",
        "observer",
        "processing",
        "rate_limited",
        "redeliveries",
        "retries",
        "shutting_down",
        "wait_total",
        "work_total",
    )

    def __init__(self, max_retries: int | None = None) -> None:
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1
        ):
            raise ValueError(f"max_retries must be None or an int >= 1, got {max_retries!r}")
        self.max_retries = max_retries
        # key -> time the add that made it dirty happened. A key is dirty iff it
        # is waiting (then it is in ``fifo`` exactly once) or pending redelivery.
        self.dirty: dict[K, float] = {}
        # key -> time of its ``get``. A processing key is never in ``fifo``.
        self.processing: dict[K, float] = {}
        # Waiting keys, oldest first. Invariant: every key here is dirty and not
        # processing, and appears once.
        self.fifo: deque[K] = deque()
        # key -> its one heap entry [ready, seq, key] (the earliest ready time
        # asked). A replaced entry stays in ``heap`` with its key slot set to
        # ``_REMOVED`` (so it keeps nothing alive) and is skipped when it surfaces;
        # ``_stale`` counts them.
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

    def add(self, key: K, now: float) -> bool:
        """Mark ``key`` dirty. True if it was pushed (the front wakes one getter)."""
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
        if redeliver:
            fifo = self.fifo
            fifo.append(key)
            self.redeliveries += 1
            depth = len(fifo)
            if depth > self.max_depth:
                self.max_depth = depth
        observer = self.observer
        if observer is not None:
            observer(_DONE, key, now, worked)
            if redeliver:
                observer(_REDELIVER, key, now, None)
        return redeliver

    # -- delays -----------------------------------------------------------------

    @staticmethod
    def check_add_after(key: object, delay: object) -> float:
        """Validate an ``add_after`` request; return the delay as a float.

        Raises ``TypeError`` for an unhashable key or a delay that is not an int
        or float (``True`` included), ``ValueError`` for a NaN delay. Fronts call
        it before anything else (a foreign thread's call raises in that thread).
        """
        hash(key)  # an unhashable key fails here, before anything is counted
        if not isinstance(delay, float):
            if isinstance(delay, bool) or not isinstance(delay, int):
                raise TypeError(f"add_after: delay must be an int or float, got {delay!r}")
            try:
                delay = float(delay)
            except OverflowError:  # an int beyond float range: as good as infinite
                delay = math.inf if delay > 0 else -math.inf
        if math.isnan(delay):
            raise ValueError("add_after: delay must be a number of seconds, got nan")
        return delay

    def add_after(self, key: K, delay: float, now: float, kind: EventKind = _DELAY) -> bool:
        """Make ``key`` ready at ``now + delay``; the earliest ready time wins.

        If that is not later than ``now`` (``delay <= 0``, or a delay too small
        to move ``now`` in floating point) the add rule applies now. Returns what
        ``add`` returns (True: pushed now). A no-op after shutdown. ``kind`` is
        DELAY or RATE_LIMIT, for counting and for the observer. Bad input raises
        (see ``check_add_after``) and changes nothing.
        """
        delay = self.check_add_after(key, delay)
        if self.shutting_down:
            return False
        self.retries += 1
        if kind is EventKind.RATE_LIMIT:
            self.rate_limited += 1
        if self.observer is not None:
            self.observer(kind, key, now, delay)
        ready = now + delay
        if ready <= now:
            return self.add(key, now)
        current = self.delayed.get(key)
        if current is not None:
            if current[0] <= ready:
                return False
            current[2] = _REMOVED
            self._stale += 1
        entry = [ready, next(self._counter), key]
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
            key = heapq.heappop(heap)[2]
            if key is _REMOVED:
                self._stale -= 1
                continue
            del delayed[key]
            if self.add(key, now):
                pushed += 1
        return pushed

    def _compact(self) -> None:
        self.heap = [entry for entry in self.heap if entry[2] is not _REMOVED]
        heapq.heapify(self.heap)
        self._stale = 0

    # -- failures ---------------------------------------------------------------

    def record_failure(self, key: K) -> bool:
        """Count a failure of ``key``; False if it will not be retried.

        That is once it has failed ``max_retries`` times, or at once while the
        queue is shutting down (its re-add would be a no-op; nothing is counted).
        """
        if self.shutting_down:
            return False
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

    def stats(self) -> Stats:
        enqueued = self.gets + len(self.fifo) - self.redeliveries
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
            depth=len(self.fifo),
            max_depth=self.max_depth,
            processing=len(self.processing),
            delayed=len(self.delayed),
            queue_wait_seconds=self.wait_total,
            work_seconds=self.work_total,
            shutting_down=self.shutting_down,
        )

    def unfinished(self, now: float) -> tuple[float, float]:
        """(total, longest) seconds that keys now processing have been held."""
        total = longest = 0.0
        for started in tuple(self.processing.values()):  # a copy: safe from a scrape thread
            held = now - started
            total += held
            if held > longest:
                longest = held
        return total, longest
