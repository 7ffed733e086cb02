"""The waiting set: keys that are dirty and held by nobody, in hand-out order.

Theory of operation
-------------------
The core decides *whether* a key waits (the dirty/processing rules); the
waiting set decides only *in what order* waiting keys are handed out, and
when each one arrived. That is client-go's ``Queue[T]`` (Push, Pop, Touch,
Len) and CPython's ``_put``/``_get``: storage behind a small interface, one
set of rules above it.

``Waiting`` is that interface: ``push`` (a key enters, at ``now``), ``pop``
(the next key out), ``touch`` (a waiting key is added again, maybe with a
higher priority), ``len``, ``oldest`` (how long the first arrival has
waited) and ``by_priority``. Each keeps its keys in a plain container
(``FifoWaiting.keys``, a deque; ``RankedWaiting.entries``, a dict in arrival
order), which the core hands the fronts: its truth and length are "a key
waits" and ``len()``, read at C speed.

- ``FifoWaiting``: arrival order, a deque; no priorities. A queue starts with
  it, and the core inlines its ``push`` and ``pop`` on the hot path (an
  ``append`` in ``add``, a ``popleft`` in ``get``). A key's arrival is its
  dirty time, except for a key ``done`` pushed back (its dirty time is the
  add made while it was held): ``push`` records those in ``repushed`` as
  (push ordinal, time), where the head of ``keys`` has ordinal ``popped``
  (the keys handed out so far); entries below that are dropped at the next
  push, so ``repushed`` never outgrows ``keys``.
- ``RankedWaiting``: the first non-zero priority makes the core swap to it,
  for good (``Core.rank``). Keys sit in a ``LazyHeap`` ordered by a static
  score, then arrival. With ``aging=None`` the score is ``-priority``
  (strict priorities); with ``aging=a`` the effective priority of a key that
  arrived at ``t`` is ``priority + (now - t) / a``, and every waiting key ages
  at the same rate, so ranking by it at any ``now`` is ranking by
  ``t - priority * a``, which never changes while the key waits: the score.
  A key is ranked ahead of every key that arrives more than
  ``(P_max - priority) * a`` seconds after it, so no stream of higher
  priorities holds it back longer than that, plus the time to serve what was
  ahead. ``touch`` with a higher priority moves a key up (it keeps its
  arrival): ``promote_priority`` replaces its heap entry.
- ``FairWaiting``: a ``RankedWaiting`` whose ``pop`` is fair across groups
  (``fair_by(key)``, a str). The ranked heap still decides the *priority*
  a key is handed out from: that of the first key by rank (its level). Within
  that priority the groups with keys waiting take turns: ``levels[p]`` is
  the rotation, a dict of group -> that group's keys at ``p`` (a ``_Turn``:
  a heap of the same entries, so FIFO by arrival), in turn order; ``pop``
  takes the first group's first key, and the group goes to the back of the
  rotation while it has keys left there (a group that starts waiting joins at the back). The
  key handed out leaves the ranked heap from wherever it sits (``remove``);
  the first key by rank stays until its group's turn, so its priority keeps
  winning while it waits, and its aging bound holds with the rotation's
  added to it (docs/fairness.md). A key moved up by ``touch`` leaves a
  replaced entry in its old group's heap, skipped when it surfaces; its
  group leaves that priority's rotation when no live key of it is left there.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Mapping
from itertools import islice
from operator import itemgetter
from typing import Any, Final, Generic, TypeVar

from ._heap import REMOVED, LazyHeap, smallest
from ._stats import PriorityCounts

__all__ = ["FairWaiting", "FifoWaiting", "RankedWaiting", "Waiting", "group_of"]

K = TypeVar("K")

_PRIORITY: Final = itemgetter(3)  # the priority slot of a ranked entry


def group_of(fair_by: Callable[[Any], object], key: Any) -> str:
    """``fair_by(key)``, checked: a str, or ``TypeError`` (its exceptions
    propagate). Every queue's one check, in memory and on Redis."""
    group = fair_by(key)
    if not isinstance(group, str):
        raise TypeError(f"fair_by must return a str, got {group!r} for {key!r}")
    return group


class Waiting(Generic[K]):
    """The waiting set's interface (see the module docstring). Not thread-safe."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def push(self, key: K, priority: int, now: float, popped: int) -> int:
        """``key`` (not waiting) enters at ``now`` with ``priority``; ``popped``:
        keys handed out so far. Returns how many keys wait now."""
        raise NotImplementedError

    def pop(self) -> K:
        """Remove and return the next key out (the set is not empty)."""
        raise NotImplementedError

    def touch(self, key: K, priority: int) -> bool:
        """``key`` was added again with ``priority``: True if it waits here (it
        keeps the higher priority), False if it does not wait."""
        raise NotImplementedError

    def oldest(self, now: float, dirty: Mapping[K, float], popped: int) -> float:
        """Seconds the key that arrived first has waited at ``now`` (0.0 if none).

        Safe from a scrape thread: a change meanwhile reads as nothing waiting.
        """
        raise NotImplementedError

    def by_priority(self) -> PriorityCounts:
        """Waiting keys by priority, highest first (a read-only snapshot)."""
        raise NotImplementedError

    def first(
        self, limit: int, now: float, dirty: Mapping[K, float], popped: int
    ) -> list[tuple[K, int, float]]:
        """The next ``limit`` keys out, in hand-out order: (key, priority,
        seconds waited at ``now``). Changes nothing."""
        raise NotImplementedError


class FifoWaiting(Waiting[K]):
    """Arrival order; every key has priority 0."""

    __slots__ = ("keys", "repushed")

    def __init__(self) -> None:
        # Invariant: every key here is dirty and not processing, and appears once.
        self.keys: deque[K] = deque()
        # (push ordinal, time) of each key ``done`` pushed back, oldest first.
        self.repushed: deque[tuple[int, float]] = deque()

    def __len__(self) -> int:
        return len(self.keys)

    def push(self, key: K, priority: int, now: float, popped: int) -> int:
        """Append ``key``, recording ``now`` as its arrival (the core's inlined
        push, for an add, records nothing: there the dirty time is the arrival)."""
        keys, repushed = self.keys, self.repushed
        keys.append(key)
        depth = len(keys)
        while repushed and repushed[0][0] < popped:
            repushed.popleft()
        repushed.append((popped + depth - 1, now))
        return depth

    def pop(self) -> K:
        return self.keys.popleft()

    def touch(self, key: K, priority: int) -> bool:
        return key in self.keys  # no priorities: nothing moves

    def oldest(self, now: float, dirty: Mapping[K, float], popped: int) -> float:
        try:
            since = dirty[self.keys[0]]
        except (IndexError, KeyError):
            return 0.0
        for ordinal, at in tuple(self.repushed):  # a copy: safe from a scrape thread
            if ordinal >= popped:
                if ordinal == popped:  # the head was pushed back by done
                    since = at
                break
        return now - since

    def by_priority(self) -> PriorityCounts:
        depth = len(self.keys)
        return PriorityCounts({0: depth} if depth else ())

    def first(
        self, limit: int, now: float, dirty: Mapping[K, float], popped: int
    ) -> list[tuple[K, int, float]]:
        end = popped + limit
        pushed_back: dict[int, float] = {}
        for ordinal, at in self.repushed:  # ordinals only grow
            if ordinal >= end:
                break
            pushed_back[ordinal] = at
        rows: list[tuple[K, int, float]] = []
        for ordinal, key in enumerate(islice(self.keys, limit), popped):
            since = pushed_back.get(ordinal)
            if since is None:
                since = dirty[key]
            rows.append((key, 0, now - since))
        return rows


class RankedWaiting(Waiting[K]):
    """Highest effective priority first, earliest arrival among equals."""

    __slots__ = ("aging", "entries", "heap")

    def __init__(
        self, aging: float | None, fifo: FifoWaiting[K], dirty: Mapping[K, float], popped: int
    ) -> None:
        """Take over ``fifo``'s keys (priority 0, their order and arrivals kept)."""
        self.aging = aging
        # key -> its live heap entry [score, seq, key, priority, arrival], in
        # arrival order (a promotion keeps a key's place). Invariant: exactly
        # the waiting keys, each one's entry in ``heap`` once.
        self.entries: dict[K, list[Any]] = {}
        self.heap = LazyHeap()
        pushed_back = dict(fifo.repushed)
        for ordinal, key in enumerate(fifo.keys, popped):
            since = pushed_back.get(ordinal)
            if since is None:
                since = dirty[key]
            entry = [0 if aging is None else since, self.heap.next_seq(), key, 0, since]
            self.entries[key] = entry
            self.heap.push(entry)  # already in heap order: arrivals only grow

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, key: K, priority: int, now: float, popped: int) -> int:
        aging = self.aging
        score = -priority if aging is None else now - priority * aging
        entry = [score, self.heap.next_seq(), key, priority, now]
        entries = self.entries
        entries[key] = entry
        self.heap.push(entry)
        return len(entries)

    def pop(self) -> K:
        key: K = self.heap.pop()[2]
        del self.entries[key]
        return key

    def touch(self, key: K, priority: int) -> bool:
        entry = self.entries.get(key)
        if entry is None:
            return False
        if priority > entry[3]:
            self.promote_priority(entry, priority)
        return True

    def promote_priority(self, entry: list[Any], priority: int) -> None:
        """Raise a waiting key's priority; it keeps its arrival (and its place
        among keys that arrived at the same score)."""
        aging = self.aging
        score = -priority if aging is None else entry[4] - priority * aging
        if not score < entry[0]:  # the same rank in floating point: no move needed
            entry[3] = priority
            return
        key = entry[2]
        moved = [score, entry[1], key, priority, entry[4]]
        self.entries[key] = moved
        self.heap.replace(entry, moved)

    def oldest(self, now: float, dirty: Mapping[K, float], popped: int) -> float:
        first = next(iter(self.entries.values()), None)  # one C call: scrape-safe
        return 0.0 if first is None else now - float(first[4])

    def by_priority(self) -> PriorityCounts:
        counts = Counter(map(_PRIORITY, list(self.entries.values())))  # a copy: scrape-safe
        return PriorityCounts(sorted(counts.items(), reverse=True))

    def first(
        self, limit: int, now: float, dirty: Mapping[K, float], popped: int
    ) -> list[tuple[K, int, float]]:
        return [(entry[2], entry[3], now - entry[4]) for entry in self.heap.smallest(limit)]


class _Turn:
    """One group's keys at one priority: a heap of entries (by score, then
    seq: arrival order) and how many of them are live."""

    __slots__ = ("entries", "live")

    def __init__(self, entry: list[Any]) -> None:
        # Invariant: ``live`` >= 1 entries here are live (a key slot that is not
        # ``REMOVED``); the others are entries a promotion replaced.
        self.entries: list[list[Any]] = [entry]
        self.live = 1


class FairWaiting(RankedWaiting[K]):
    """``RankedWaiting``'s priorities, round-robin across groups within one
    (see the module docstring). Starts empty: a queue is fair from its start."""

    __slots__ = ("fair_by", "levels")

    def __init__(self, aging: float | None, fair_by: Callable[[K], object]) -> None:
        super().__init__(aging, FifoWaiting(), {}, 0)
        # Typed to return object: the check is ``group_of``'s, in both builds.
        self.fair_by: Callable[[K], object] = fair_by
        # priority -> group -> its ``_Turn``, groups in turn order. Invariant:
        # exactly the (priority, group) pairs with keys waiting, and every live
        # entry of ``entries`` is in the ``_Turn`` of its priority and group
        # (its slots 3 and 5) once.
        self.levels: dict[int, dict[str, _Turn]] = {}

    def push(self, key: K, priority: int, now: float, popped: int) -> int:
        group = group_of(self.fair_by, key)  # first: a raise changes nothing
        aging = self.aging
        score = -priority if aging is None else now - priority * aging
        entry = [score, self.heap.next_seq(), key, priority, now, group]
        self.join(entry)
        entries = self.entries
        entries[key] = entry
        self.heap.push(entry)
        return len(entries)

    def join(self, entry: list[Any]) -> None:
        """Put ``entry`` in its group's turn at its priority (a group that had
        no keys waiting there joins the rotation at the back)."""
        priority: int = entry[3]
        rotation = self.levels.get(priority)
        if rotation is None:
            rotation = self.levels[priority] = {}
        group: str = entry[5]
        turn = rotation.get(group)
        if turn is None:
            rotation[group] = _Turn(entry)
        else:
            heapq.heappush(turn.entries, entry)
            turn.live += 1

    def leave(self, rotation: dict[str, _Turn], priority: int, group: str) -> None:
        """Drop ``group``'s turn at ``priority`` (no key of it waits there now)."""
        del rotation[group]
        if not rotation:
            del self.levels[priority]

    def pop(self) -> K:
        priority: int = self.heap.peek()[3]  # the first key by rank names the priority
        rotation = self.levels[priority]
        group = next(iter(rotation))
        turn = rotation[group]
        entry = heapq.heappop(turn.entries)
        while entry[2] is REMOVED:
            entry = heapq.heappop(turn.entries)
        turn.live -= 1
        if turn.live:
            del rotation[group]
            rotation[group] = turn  # the back of the rotation
        else:
            self.leave(rotation, priority, group)
        key: K = entry[2]
        del self.entries[key]
        self.heap.remove(entry)
        return key

    def first(
        self, limit: int, now: float, dirty: Mapping[K, float], popped: int
    ) -> list[tuple[K, int, float]]:
        """``pop``'s next ``limit`` keys, played on copies of what they need:
        the first ``limit`` by rank (the first key by rank after ``i`` pops is
        among the first ``i + 1``), each rotation met, and the first keys of
        each group met. O(limit log limit) plus a copy of each rotation met."""
        by_rank = self.heap.smallest(limit)
        taken: set[int] = set()
        turns: dict[int, deque[str]] = {}
        queues: dict[tuple[int, str], deque[list[Any]]] = {}
        left: dict[tuple[int, str], int] = {}
        rows: list[tuple[K, int, float]] = []
        at = 0
        while len(rows) < limit and at < len(by_rank):
            top = by_rank[at]
            if id(top) in taken:
                at += 1
                continue
            priority: int = top[3]
            rotation = turns.get(priority)
            if rotation is None:
                rotation = turns[priority] = deque(self.levels[priority])
            group = rotation.popleft()
            pair = (priority, group)
            keys = queues.get(pair)
            if keys is None:
                turn = self.levels[priority][group]
                keys = queues[pair] = deque(smallest(turn.entries, limit))
                left[pair] = turn.live
            entry = keys.popleft()
            left[pair] -= 1
            if left[pair]:
                rotation.append(group)
            taken.add(id(entry))
            rows.append((entry[2], entry[3], now - entry[4]))
        return rows

    def promote_priority(self, entry: list[Any], priority: int) -> None:
        """Move a waiting key up to ``priority``; it keeps its arrival, and
        joins its group's keys at the new priority by it."""
        aging = self.aging
        score = -priority if aging is None else entry[4] - priority * aging
        key = entry[2]
        group: str = entry[5]
        moved = [score, entry[1], key, priority, entry[4], group]
        self.entries[key] = moved
        self.heap.replace(entry, moved)  # the old entry reads REMOVED in its turn too
        old: int = entry[3]
        rotation = self.levels[old]
        turn = rotation[group]
        turn.live -= 1
        if not turn.live:
            self.leave(rotation, old, group)
        self.join(moved)
