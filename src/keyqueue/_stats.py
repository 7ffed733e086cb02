"""What a queue reports about itself: ``Stats`` and ``PriorityCounts``.

Both are frozen snapshots (trio's ``statistics()``), never live internals:
``Core.stats`` builds them in memory, ``RedisStats`` (which extends ``Stats``)
from a script's reply. Public types, re-exported by ``keyqueue``; nothing here
knows how a queue works.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

__all__ = ["PriorityCounts", "Stats"]


def _read_only(*args: object, **kwargs: object) -> NoReturn:
    raise TypeError("waiting_by_priority is a read-only snapshot")


class PriorityCounts(dict[int, int]):
    """Waiting keys by priority, highest first: a read-only snapshot.

    A dict, so ``dataclasses.asdict``, ``json`` and pickle take it like one;
    every method that would change it raises ``TypeError``.
    """

    __slots__ = ()

    __setitem__ = _read_only
    __delitem__ = _read_only
    __ior__ = _read_only
    clear = _read_only
    pop = _read_only
    popitem = _read_only
    setdefault = _read_only
    update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (PriorityCounts, (dict(self),))


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
    """Keys handed out to a worker (``get``, ``get_nowait``, a claim on Redis)."""
    dones: int
    """``done`` calls that released a held key."""
    retries: int
    """``add_after`` and ``add_rate_limited`` calls on a live queue."""
    rate_limited: int
    """``add_rate_limited`` calls on a live queue (each ``retry`` that backs off
    among them): the backoffs the rate limiter handed out."""
    rate_limit_delay_seconds: float
    """Total seconds of those ``rate_limited`` backoffs (the mean backoff is
    ``rate_limit_delay_seconds / rate_limited``)."""
    max_rate_limit_delay_seconds: float
    """The longest of those backoffs (0.0 before the first)."""
    depth: int
    """Keys waiting in the FIFO now."""
    max_depth: int
    """The most keys that waited in the FIFO at once, since the queue was made."""
    processing: int
    """Keys held by workers now."""
    delayed: int
    """Keys waiting for their ready time now."""
    queue_wait_seconds: float
    """Total time keys spent dirty before their ``get``."""
    work_seconds: float
    """Total time keys were held, over finished ``done`` calls."""
    shutting_down: bool
    """True once ``shutdown`` was called: adds are refused from then on."""
    waiting_by_priority: Mapping[int, int]
    """Keys waiting now, by priority (only priorities with a waiting key; a key
    counts under the highest priority it was added with). ``{0: depth}`` on a
    queue that never saw a priority. Read-only."""
    oldest_wait_seconds: float
    """How long the waiting key that arrived first has waited (0.0 when none
    waits): what aging bounds. A key's wait starts when it enters the waiting
    set: at the add that made it dirty, or, for a key added while it was held,
    at the ``done`` that pushed it back."""
