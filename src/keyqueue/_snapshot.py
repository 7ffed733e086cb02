"""What a queue holds right now: ``Snapshot`` and its kinds of rows.

A snapshot is the read side of a queue (trio's ``statistics()`` grown to the
keys): its ``Stats`` and the first ``limit`` keys of each of the five lists
an operator asks about (which keys wait, who holds what, what is delayed,
what keys are failing, which were given up), all taken in one step: under
the queue's lock in memory, in one script on Redis. Frozen values, never live internals. Public
types, re-exported by ``keyqueue``; nothing here knows how a queue works.

Times in a row are seconds relative to ``taken_at``; the JSON form is
``Snapshot.as_dict``'s (both documented on ``Snapshot``, the public type).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from ._dead import DeadKey
from ._stats import Stats

__all__ = ["SNAPSHOT_VERSION", "DelayedKey", "FailingKey", "HeldKey", "Snapshot", "WaitingKey"]

K = TypeVar("K")

SNAPSHOT_VERSION: Final = 1
"""The version of the JSON shape ``Snapshot.as_dict`` writes (its ``version`` field)."""


@dataclass(frozen=True, slots=True)
class WaitingKey(Generic[K]):
    """A waiting key, in hand-out order."""

    key: K
    """The key."""
    priority: int
    """The priority it will be handed out with (0 on a queue that never saw one)."""
    waited: float
    """Seconds since it entered the waiting set (an add, or the ``done`` that pushed it back)."""


@dataclass(frozen=True, slots=True)
class HeldKey(Generic[K]):
    """A key a worker holds (between its ``get`` and its ``done``)."""

    key: K
    """The key."""
    holder: str | None
    """Who took it. Redis: the identity of the client that holds it (its
    ``holder=``, ``hostname:pid`` by default). In memory: the name of the
    thread (``WorkQueue``) or the asyncio task (``AsyncWorkQueue``; the
    thread, for a ``get_nowait`` outside a task) whose ``get`` took it, as
    ``threading.Thread.name`` and ``asyncio.Task.get_name()`` give it
    (``run_workers`` and ``arun_workers`` name theirs
    ``keyqueue-worker-<queue>-<n>``); ``thread <ident> (ended)`` for a thread
    that ended while holding it."""
    token: int | None
    """Redis: the hold's fencing token. None in memory."""
    held: float
    """Seconds since its ``get``."""
    lease_left: float | None
    """Redis: seconds until its lease runs out unless renewed (negative: ran
    out, not taken back yet). None in memory (no leases)."""


@dataclass(frozen=True, slots=True)
class DelayedKey(Generic[K]):
    """A key waiting for its ready time (``add_after``, a backoff), soonest first."""

    key: K
    """The key."""
    due_in: float
    """Seconds until it is added (negative: due, not promoted yet)."""
    priority: int
    """The priority it will be added with."""


@dataclass(frozen=True, slots=True)
class FailingKey(Generic[K]):
    """A key with failures recorded since its last ``forget``, most first."""

    key: K
    """The key."""
    failures: int
    """``retry`` calls for it since its last ``forget`` (counted with or
    without ``max_retries``)."""
    comes_back_in: float | None
    """Seconds until it is added again, when it is delayed (its backoff);
    None when it is not delayed (waiting, held, or given up)."""


@dataclass(frozen=True, slots=True)
class Snapshot(Generic[K]):
    """One queue's counters and the first keys of its lists, taken in one step.

    Each list holds at most ``limit`` rows; ``stats`` has the full sizes
    (``depth``, ``processing``, ``delayed``). Order: ``waiting`` in hand-out
    order; ``processing`` longest held first in memory, soonest lease expiry
    first on Redis; ``delayed`` soonest due first (ties in the order the
    delays were asked); ``failing`` most failures first (ties in no promised
    order); ``dead`` newest first. Keys failing under the rate limiter alone
    (``add_rate_limited``) are not failures; see ``num_requeues``.

    Times in a row are seconds relative to ``taken_at`` (the queue clock's
    reading when the snapshot was taken): ``waited`` and ``held`` look back from
    it, ``due_in``, ``lease_left`` and ``comes_back_in`` look ahead (a negative
    one is overdue: a due key the server has not promoted yet, a lease that ran
    out and was not reaped yet). A dead key's ``at`` is wall time instead.
    """

    stats: Stats
    """The queue's counters and full sizes (a ``RedisStats`` on Redis)."""
    waiting: tuple[WaitingKey[K], ...]
    """The first ``limit`` waiting keys, in hand-out order."""
    processing: tuple[HeldKey[K], ...]
    """The first ``limit`` held keys: longest held first in memory, soonest
    lease expiry first on Redis."""
    delayed: tuple[DelayedKey[K], ...]
    """The first ``limit`` delayed keys, soonest due first."""
    failing: tuple[FailingKey[K], ...]
    """The first ``limit`` keys with failures recorded, most failures first."""
    taken_at: float
    """The queue clock's reading when it was taken (the server's time on Redis)."""
    limit: int
    """The most rows each list was allowed."""
    failing_keys: int
    """How many keys have failures recorded (``failing`` holds the first
    ``limit``; the other lists' full sizes are in ``stats``)."""
    dead: tuple[DeadKey[K], ...] = ()
    """The first ``limit`` keys the queue gave up and keeps (``dead()``),
    newest first."""

    def as_dict(self) -> dict[str, Any]:
        """This snapshot as plain dicts, lists and values, ready for ``json``.

        A stable shape, version 1 (its ``version`` field): fields are only
        ever added to it, never renamed, removed or changed in meaning, within
        one version::

            {"version": 1, "taken_at": 1764608400.25, "limit": 100,
             "stats": {"adds": 3, ..., "waiting_by_priority": {"0": 2}, ...},
             "waiting": [{"key": "a", "priority": 0, "waited": 1.5}],
             "processing": [{"key": "b", "holder": "web-1:4242", "token": 17,
                             "held": 0.5, "lease_left": 29.5}],
             "delayed": [{"key": "c", "due_in": 4.0, "priority": 0}],
             "failing": [{"key": "c", "failures": 2, "comes_back_in": 4.0}],
             "failing_keys": 1,
             "dead": [{"key": "d", "reason": "retries", "error_type": "OSError",
                       "error": "timed out", "failures": 5, "at": 1764608390.5}]}

        ``stats`` is every field of the queue's ``Stats`` (a ``RedisStats`` adds
        ``leases_expired``, ``leases_lost``, ``stalls``, ``given_up_retries`` and
        ``given_up_stalls``); JSON object keys are strings, so
        ``waiting_by_priority``'s priorities are too. A key that is not a JSON value
        (str, int, float, bool, None) is written as its ``repr``.
        """
        return {
            "version": SNAPSHOT_VERSION,
            "taken_at": self.taken_at,
            "limit": self.limit,
            "stats": _stats_dict(self.stats),
            "waiting": [_row(row) for row in self.waiting],
            "processing": [_row(row) for row in self.processing],
            "delayed": [_row(row) for row in self.delayed],
            "failing": [_row(row) for row in self.failing],
            "failing_keys": self.failing_keys,
            "dead": [_row(row) for row in self.dead],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """``as_dict`` as JSON text."""
        return json.dumps(self.as_dict(), indent=indent, allow_nan=False)


def check_limit(limit: Any) -> int:
    """``snapshot``'s ``limit``: an int >= 0 (bool refused)."""
    if type(limit) is not int:
        raise TypeError(f"limit must be an int, got {limit!r}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit!r}")
    return limit


def _json_key(key: Any) -> Any:
    if key is None or type(key) in (str, int, float, bool):
        return key
    return repr(key)


def _row(row: Any) -> dict[str, Any]:
    fields = {field.name: getattr(row, field.name) for field in dataclasses.fields(row)}
    fields["key"] = _json_key(fields["key"])
    return fields


def _stats_dict(stats: Stats) -> dict[str, Any]:
    fields = {field.name: getattr(stats, field.name) for field in dataclasses.fields(stats)}
    fields["waiting_by_priority"] = {
        str(priority): count for priority, count in stats.waiting_by_priority.items()
    }
    return fields
