"""What the scripts answer, read: their events reported, stats and snapshots parsed.

A script's reply is lists of strings or bytes (clients may or may not decode
responses) and integers. Every script that changes the queue ends its reply
with its events, flat triples of kind, key and duration, which ``Reports``
hands to this client's observer in order. ``parse_stats`` and
``parse_snapshot`` turn the ``stats`` and ``snapshot`` replies into the
frozen ``RedisStats`` and ``Snapshot``. Nothing here sends or waits.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._dead import DeadKey
from .._events import EventKind, Subscribers
from .._snapshot import DelayedKey, FailingKey, HeldKey, Snapshot, WaitingKey
from .._stats import PriorityCounts, Stats

__all__ = [
    "EMPTY",
    "LOST",
    "RedisStats",
    "Reports",
    "parse_dead",
    "parse_snapshot",
    "parse_stats",
    "text",
]

logger = logging.getLogger("keyqueue")

EMPTY = ("", b"")
"""An empty reply element (a script's nil, as a string)."""
LOST = ("lost", b"lost")
"""A fenced script's status when the caller's lease was taken back."""
_KINDS: dict[str | bytes, EventKind] = {}
for _kind in EventKind:
    _KINDS[_kind.value] = _KINDS[_kind.value.encode()] = _kind
_POISON = EventKind.POISON
_POISON_NAMES = (_POISON.value, _POISON.value.encode())


def text(value: str | bytes) -> str:
    """A reply element as ``str`` (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class RedisStats(Stats):
    """``Stats`` of a queue on Redis: queue-wide counters, kept on the server.

    Every field but ``shutting_down`` and ``writes_not_replicated`` (this
    client's) counts all clients.
    ``adds == enqueued + coalesced + marked_while_processing`` holds, each
    counted on its own; ``dones`` counts ``done`` calls that released a key, so
    ``gets == dones + processing + leases_expired``. A key a reaped lease
    puts back to wait counts as an add (as a ``put_back``'s does).
    """

    leases_expired: int
    """Leases that ran out and were taken back by ``reap`` (none is a failure)."""
    leases_lost: int
    """Holders that learned their lease was taken back (late ``done`` or renewal)."""
    stalls: int = 0
    """Of ``leases_expired``: holds whose handler had started (the holder died,
    or stopped renewing, with its handler running). The rest had not started:
    their keys waited again at once, charged nothing."""
    given_up_retries: int = 0
    """Keys ``retry`` gave up: they failed ``max_retries`` times."""
    given_up_stalls: int = 0
    """Keys given up as poison: they stalled their holder more than
    ``max_stalls`` times in a row (``EventKind.POISON``)."""
    writes_not_replicated: int = 0
    """This client's: writes that fewer replicas acknowledged than
    ``durability="replicated"`` waits for, so their replies were not acted on
    (``NotReplicated``; 0 in the default mode)."""


class Reports:
    """This client's events: each script's, to its observer (``Subscribers``),
    and each key its calls gave up as poison, to a warning and its watchers;
    and the warnings of its drivers' loops.

    Callbacks run under no lock (they may call the queue). The watchers are a
    list changed by single appends and removes, read as a copy: no lock.
    """

    __slots__ = ("events", "max_stalls", "name", "watchers")

    def __init__(self, name: str, events: Subscribers, max_stalls: int) -> None:
        self.name = name
        self.events = events
        self.max_stalls = max_stalls
        # Called with each key this client's calls gave up as poison (the
        # runners' on_give_up): see watch_poison.
        self.watchers: list[Callable[[str], object]] = []

    def emit(self, now: Any, events: Sequence[Any]) -> None:
        """Report a script's events to this client's observer, in order."""
        if not events:
            return
        observer = self.events.observer
        if observer is None:  # nobody listens: only a poison key is acted on
            kinds = events[0::3]
            if _POISON_NAMES[0] not in kinds and _POISON_NAMES[1] not in kinds:
                return
        at = float(now)
        for i in range(0, len(events), 3):
            kind = _KINDS.get(events[i])
            if kind is None:
                continue
            key = text(events[i + 1])
            if kind is _POISON:
                self.poisoned(key)
            if observer is not None:
                duration = events[i + 2]
                observer(kind, key, at, float(duration) if duration not in EMPTY else None)

    def report(self, kind: EventKind, key: str | None, now: float) -> None:
        """One event this client learned itself (``LEASE_LOST``, ``SHUTDOWN``)."""
        observer = self.events.observer
        if observer is not None:
            observer(kind, key, now, None)

    def poisoned(self, key: str) -> None:
        """This client's call gave ``key`` up as poison: a warning, and each watcher told."""
        logger.warning(
            "keyqueue %r: key %r stalled its holder more than max_stalls (%d) times in a "
            "row (its holder died or stopped renewing with the handler running): given up "
            "as a poison key",
            self.name,
            key,
            self.max_stalls,
        )
        for watcher in tuple(self.watchers):
            try:
                watcher(key)
            except Exception:
                logger.exception("keyqueue %r: on_give_up(%r) raised", self.name, key)

    def drain_timed_out(self, timeout: float | None, held: int) -> None:
        """Say that this client's drain timed out, and what it leaves on the server."""
        logger.warning(
            "keyqueue %r: the drain timed out after %.3g s with %d key(s) still held by this "
            "client; left queued, not given up: they stay on the server (released by their "
            "done, or handed out again once their lease runs out), for the other clients or "
            "the next start",
            self.name,
            timeout,
            held,
        )

    def hand_back_failed(self) -> None:
        """Say (in an except block) that handing back a lost get's key failed."""
        logger.warning(
            "keyqueue %r: handing back the key of a get whose reply was lost "
            "failed; it comes back when its lease runs out",
            self.name,
            exc_info=True,
        )

    def renewal_failed(self, interval: float, unsent: bool) -> None:
        """Say (in an except block) that a renewal failed: the loop goes on. A
        pool without a free connection (``unsent``) was said once already."""
        if not unsent:
            logger.warning(
                "keyqueue %r: renewing leases failed; retrying in %.3g s",
                self.name,
                interval,
                exc_info=True,
            )

    def watch_poison(self, watcher: Callable[[str], object]) -> Callable[[], None]:
        """Call ``watcher(key)`` for each key this client's calls give up as
        poison (the runners pass it to ``on_give_up``); returns the unwatch."""
        self.watchers.append(watcher)

        def unwatch() -> None:
            if watcher in self.watchers:
                self.watchers.remove(watcher)

        return unwatch


def parse_stats(reply: Sequence[Any], shutting_down: bool) -> tuple[RedisStats, float, int]:
    """A ``stats`` reply (or a snapshot's summary): the stats, and the server's
    time and dirty count the gauges take. Its events are the caller's."""
    at, raw, depth, processing, delayed, dirty, _, by_priority, oldest = reply
    counters = {text(raw[i]): raw[i + 1] for i in range(0, len(raw), 2)}

    def count(field: str) -> int:
        return int(counters.get(field, 0))

    def seconds(field: str) -> float:
        return float(counters.get(field, 0.0))

    if by_priority:  # ranked: the server's counts
        pairs = (
            (int(by_priority[i]), int(by_priority[i + 1])) for i in range(0, len(by_priority), 2)
        )
        waiting = PriorityCounts(sorted(pairs, reverse=True))
    else:
        waiting = PriorityCounts({0: int(depth)} if int(depth) else ())
    stats = RedisStats(
        adds=count("adds"),
        enqueued=count("enqueued"),
        coalesced=count("coalesced"),
        marked_while_processing=count("marked_while_processing"),
        redeliveries=count("redeliveries"),
        gets=count("gets"),
        dones=count("dones"),
        retries=count("retries"),
        rate_limited=count("rate_limited"),
        rate_limit_delay_seconds=seconds("rate_limit_delay_seconds"),
        max_rate_limit_delay_seconds=seconds("max_rate_limit_delay_seconds"),
        depth=int(depth),
        max_depth=count("max_depth"),
        processing=int(processing),
        delayed=int(delayed),
        queue_wait_seconds=seconds("queue_wait_seconds"),
        work_seconds=seconds("work_seconds"),
        shutting_down=shutting_down,
        waiting_by_priority=waiting,
        oldest_wait_seconds=0.0 if oldest in EMPTY else float(at) - float(oldest),
        leases_expired=count("leases_expired"),
        leases_lost=count("leases_lost"),
        stalls=count("stalls"),
        given_up_retries=count("given_up_retries"),
        given_up_stalls=count("given_up_stalls"),
    )
    return stats, float(at), int(dirty)


def parse_snapshot(stats: RedisStats, reply: Sequence[Any], rows: int) -> Snapshot[str]:
    """A ``snapshot`` reply's rows, with its summary parsed as ``stats``."""
    summary, waiting, processing, delayed, failing, failing_keys, dead = reply
    at = float(summary[0])
    by_seq = sorted(  # ZRANGE orders equal ready times by key: the requests' order
        (float(delayed[i + 1]), int(delayed[i + 3]), i) for i in range(0, len(delayed), 4)
    )
    return Snapshot(
        stats,
        tuple(
            WaitingKey(text(waiting[i]), int(waiting[i + 1]), at - float(waiting[i + 2]))
            for i in range(0, len(waiting), 3)
        ),
        tuple(
            HeldKey(
                text(processing[i]),
                text(processing[i + 1]) or None,
                int(processing[i + 2]),
                at - float(processing[i + 3]),
                float(processing[i + 4]) - at,
            )
            for i in range(0, len(processing), 5)
        ),
        tuple(DelayedKey(text(delayed[i]), due - at, int(delayed[i + 2])) for due, _, i in by_seq),
        tuple(
            FailingKey(
                text(failing[i]),
                int(float(failing[i + 1])),
                None if failing[i + 2] in EMPTY else float(failing[i + 2]) - at,
            )
            for i in range(0, len(failing), 3)
        ),
        at,
        rows,
        int(failing_keys),
        parse_dead(dead[0::3], dead[1::3], dead[2::3]),
    )


def parse_dead(
    keys: Sequence[Any], times: Sequence[Any], entries: Sequence[Any]
) -> tuple[DeadKey[str], ...]:
    """Dead keys from their keys, the times they were given up and their
    entries (lua/lib/dead.lua's JSON), in the order given."""
    dead = []
    for key, when, entry in zip(keys, times, entries, strict=True):
        if entry is None:  # no entry: not written by this version's scripts
            continue
        reason, error_type, error, failures = json.loads(entry)
        dead.append(
            DeadKey(
                text(key),
                reason,
                None if error_type is False else error_type,
                None if error is False else error,
                int(failures),
                float(when),
            )
        )
    return tuple(dead)
