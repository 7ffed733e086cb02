"""One lazy-deletion heap: the delayed keys by ready time, the ranked ones by score.

Theory of operation
-------------------
An entry is a list ``[order, seq, key, ...]``: ``order`` is what the heap
sorts by (a ready time, a rank score), ``seq`` (from ``next_seq``) breaks
ties by arrival, so the key itself is never compared, and the caller keeps
what else it needs after the key. A heap cannot drop an entry from its middle
cheaply, so a key that moves (an earlier ready time, a higher priority) gets
a new entry and ``replace`` (or ``remove``, for a key that leaves from the
middle) clears the old one's key slot to ``REMOVED``: it keeps no key alive,
and ``pop`` skips it when it surfaces. ``replaced`` counts
those entries; once they are more than 64 and outnumber the live ones, the
heap is rebuilt without them (so it never holds more than about twice the
live entries, plus 64). Whoever owns the heap keeps its own map of each key's
live entry: ``len()`` counts both kinds.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Final

__all__ = ["REMOVED", "LazyHeap", "smallest"]

REMOVED: Final[Any] = object()
"""The key slot of a replaced entry."""

_COMPACT_AFTER: Final = 64


class LazyHeap:
    """A min-heap of ``[order, seq, key, ...]`` entries with lazy deletion.

    Not thread-safe (the core's caller serializes). Invariant: ``entries`` is
    a heap holding every live entry once, and ``replaced`` entries whose key
    slot is ``REMOVED``.
    """

    __slots__ = ("_seq", "entries", "replaced")

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self.replaced = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self.entries)

    def next_seq(self) -> int:
        """The tie-breaker for a new entry: larger than every one before."""
        return next(self._seq)

    def push(self, entry: list[Any]) -> None:
        heapq.heappush(self.entries, entry)

    def replace(self, old: list[Any], new: list[Any]) -> None:
        """Push ``new`` in place of the live entry ``old`` (which is skipped from now on)."""
        heapq.heappush(self.entries, new)
        self.remove(old)

    def remove(self, old: list[Any]) -> None:
        """Drop the live entry ``old`` from wherever it sits (it is skipped from now on)."""
        old[2] = REMOVED
        self.replaced += 1
        if self.replaced > _COMPACT_AFTER and self.replaced > len(self.entries) - self.replaced:
            self.entries = [entry for entry in self.entries if entry[2] is not REMOVED]
            heapq.heapify(self.entries)
            self.replaced = 0

    def first(self) -> float | None:
        """The least ``order`` in the heap (a replaced entry's too), or None when empty."""
        entries = self.entries
        return float(entries[0][0]) if entries else None

    def peek(self) -> list[Any]:
        """The least live entry, left in the heap (``IndexError`` if there is none)."""
        entries = self.entries
        while entries[0][2] is REMOVED:
            heapq.heappop(entries)
            self.replaced -= 1
        return entries[0]

    def pop(self) -> list[Any]:
        """Remove and return the least live entry (``IndexError`` if there is none)."""
        entries = self.entries
        entry = heapq.heappop(entries)
        while entry[2] is REMOVED:
            self.replaced -= 1
            entry = heapq.heappop(entries)
        return entry

    def pop_until(self, bound: float) -> list[Any] | None:
        """Remove and return the least live entry if its ``order`` is <= ``bound``, else None."""
        entries = self.entries
        while entries and entries[0][0] <= bound:
            entry = heapq.heappop(entries)
            if entry[2] is not REMOVED:
                return entry
            self.replaced -= 1
        return None

    def smallest(self, limit: int) -> list[list[Any]]:
        """The least ``limit`` live entries, least first, leaving the heap as it is
        (``smallest``, on this heap)."""
        return smallest(self.entries, limit)

    def clear(self) -> None:
        self.entries.clear()
        self.replaced = 0


def smallest(entries: list[list[Any]], limit: int) -> list[list[Any]]:
    """The least ``limit`` live entries of the heap ``entries``, least first,
    leaving it as it is.

    A best-first walk from the root (a child is never less than its
    parent): O(limit log limit), plus the replaced entries met on the way.
    """
    found: list[list[Any]] = []
    if not entries or limit <= 0:
        return found
    size = len(entries)
    frontier = [(entries[0][0], entries[0][1], 0)]  # (order, seq, index): seq is unique
    while frontier and len(found) < limit:
        index = heapq.heappop(frontier)[2]
        entry = entries[index]
        if entry[2] is not REMOVED:
            found.append(entry)
        for child in (2 * index + 1, 2 * index + 2):
            if child < size:
                below = entries[child]
                heapq.heappush(frontier, (below[0], below[1], child))
    return found
