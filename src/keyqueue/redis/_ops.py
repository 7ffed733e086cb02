"""A Redis queue client's operations, without I/O: one generator per script.

Theory of operation
-------------------
The queue's state lives on the server, in the keys ``_schema`` lists, and
every change is one Lua script named after the ``_core.py`` transition it
transcribes. The only clock is the server's ``TIME`` (a virtual clock's
reading replaces it in tests), so machines never disagree about when a delay
or a lease ends.

Each operation is a generator (the runner's outcome flows, h11's shape): it
checks its arguments, yields one ``Call`` (a script's name and its ARGV; the
driver adds the script's keys), is sent the server's reply, parses it,
keeps this client's holds (``Holds``: tokens, request numbers, lost and
unsure holds, the get and claim records), reports the events, and returns
what the method returns. A call that raised (a lost connection: its outcome
is unknown) is thrown into it, so a fenced call marks its hold unsure before
the error reaches the caller. ``answer`` and ``failed`` are those two moves.
A test drives an operation by hand: ``call = next(op)``, then
``answer(op, reply)`` with a reply written out.

The operations that take and end holds (get, claim, done, put back,
renewal) are ``_holding``'s; the rest are here.

This module imports neither redis nor threading: the drivers (``_sync``,
``_async``) send the calls, and pass in the monotonic times and owners.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable, Iterator
from typing import Any, NoReturn, TypeVar

from .._checks import check_delay, check_flag
from .._dead import DeadKey, check_reason, describe
from .._snapshot import Snapshot, check_limit
from ._config import QueueConfig, check_key, key_batches, priority_arg
from ._getters import Getters
from ._holds import Holds, lease_lost
from ._replies import LOST, RedisStats, Reports, parse_dead, parse_snapshot, parse_stats, text

__all__ = [
    "Call",
    "Op",
    "add",
    "add_after",
    "add_many",
    "add_rate_limited",
    "answer",
    "dead",
    "delete",
    "failed",
    "forget",
    "forget_dead",
    "give_up",
    "idle",
    "reap",
    "replay",
    "retry",
    "snapshot",
    "stats",
]

logger = logging.getLogger("keyqueue")

T = TypeVar("T")

Call = tuple[str, list[str]]
"""A script call: the script's name (``_schema.SCRIPTS``) and its ARGV."""

Op = Generator[Call, Any, T]
"""An operation: yields one ``Call``, is sent its reply, returns the result."""


def answer(op: Op[T], reply: Any) -> T:
    """Send ``op`` its call's reply; its result."""
    try:
        op.send(reply)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
    raise RuntimeError("a Redis queue operation makes one call")


def failed(op: Op[Any], exc: BaseException) -> NoReturn:
    """Throw the error of ``op``'s call into it, which raises it again."""
    op.throw(exc)
    raise exc  # not reached: no operation swallows its call's error


# -- adding --------------------------------------------------------------------------------


def add(cfg: QueueConfig, reports: Reports, key: str, priority: int) -> Op[None]:
    """``add``: one key, one script."""
    keys = [check_key(key)]
    return add_keys(cfg, reports, keys, priority_arg(priority), cfg.groups_arg(keys))


def add_many(
    cfg: QueueConfig, reports: Reports, keys: Iterable[str], priority: int
) -> Iterator[Op[None]]:
    """``add_many``: one ``add`` script a batch, every key (and its group)
    checked first."""
    prio = priority_arg(priority)
    batches = key_batches(keys)
    groups = [cfg.groups_arg(batch) for batch in batches]
    for batch, batch_groups in zip(batches, groups, strict=True):
        yield add_keys(cfg, reports, batch, prio, batch_groups)


def add_keys(
    cfg: QueueConfig, reports: Reports, keys: list[str], priority: str, groups: str
) -> Op[None]:
    now, _, events = yield "add", [cfg.clock_arg(), priority, cfg.aging_arg, groups, *keys]
    if events:
        reports.emit(now, events)


# -- fenced outcomes -----------------------------------------------------------------------


def fenced(
    cfg: QueueConfig,
    holds: Holds,
    owner: object,
    key: str,
    what: str,
    script: str,
    tail: list[str],
    endpoint: bool = False,
    after: list[str] | None = None,
) -> Op[Any]:
    """A fenced script (clock, token, seq, key, ``tail``, and the endpoint's
    arguments if ``endpoint``, then ``after``): its result, after its events; ``LeaseLost``
    (the hold marked lost, nothing changed) if the lease was taken back.

    If the call raises, its outcome is unknown: the hold is no longer
    renewed (if the call is never answered, the lease runs out and the key
    comes back) until a later call on it answers.
    """
    hold, fence = holds.fence(key, what, owner)
    args = [cfg.clock_arg(), *fence, key, *tail]
    if endpoint:
        args += cfg.endpoint_args(key)
    if after:
        args += after
    try:
        now, result, events, status = yield script, args
    except BaseException as exc:
        if hold is not None and not cfg.unsent(exc):
            hold.unsure = True
        raise
    holds.reports.emit(now, events)
    if hold is None:
        return result
    lost = status in LOST
    if holds.answered(hold, lost):
        holds.start_renewing()
    if lost:
        holds.mark_lost(key, hold, float(now))
        raise lease_lost(key, hold, what)
    return result


def add_after(
    cfg: QueueConfig, holds: Holds, owner: object, key: str, seconds: float, priority: int
) -> Op[None]:
    """``add_after``: fenced when ``owner`` holds ``key``."""
    seconds = check_delay(seconds)
    check_key(key)
    prio = priority_arg(priority)
    return _delay(cfg, holds, owner, key, seconds, "delay", prio, cfg.group_tail(key))


def _delay(
    cfg: QueueConfig,
    holds: Holds,
    owner: object,
    key: str,
    seconds: float,
    kind: str,
    priority: str,
    group: list[str],
    what: str = "add_after",
) -> Op[None]:
    tail = [repr(seconds), kind, priority, cfg.aging_arg, *group]
    yield from fenced(cfg, holds, owner, key, what, "add_after", tail)


def add_rate_limited(
    cfg: QueueConfig, holds: Holds, owner: object, key: str, priority: int
) -> Op[None]:
    """``add_rate_limited``: the backoff the local limiter chose, or the server's."""
    check_key(key)
    prio = priority_arg(priority)
    group = cfg.group_tail(key)  # before the local limiter counts a failure
    limiter = cfg.local_limiter
    if limiter is not None:
        seconds = check_delay(limiter.when(key))
        what = "add_rate_limited"
        return _delay(cfg, holds, owner, key, seconds, "rate_limit", prio, group, what)
    tail = [*cfg.server_limiter_args, prio, cfg.aging_arg]
    what = "add_rate_limited"
    return fenced(cfg, holds, owner, key, what, what, tail, endpoint=True, after=group)


def forget(cfg: QueueConfig, holds: Holds, owner: object, key: str) -> Op[None]:
    """``forget``: the local limiter forgets at once, the server with the script."""
    check_key(key)
    if cfg.local_limiter is not None:
        cfg.local_limiter.forget(key)
    return fenced(cfg, holds, owner, key, "forget", "forget", [])


def give_up(
    cfg: QueueConfig, holds: Holds, owner: object, key: str, reason: object, error: object
) -> Op[None]:
    """``give_up``: ``forget``, and the key kept as dead (lua/give_up.lua),
    with its group (``fair_by``'s, checked before anything changes) for a
    replay."""
    check_key(key)
    kept = check_reason(reason)
    group = cfg.group_tail(key)
    error_type, message = describe(error if isinstance(error, BaseException) else None)
    if cfg.local_limiter is not None:
        cfg.local_limiter.forget(key)
    tail = [kept, error_type or "", message or "", *group]
    return fenced(cfg, holds, owner, key, "give_up", "give_up", tail)


def retry(cfg: QueueConfig, holds: Holds, owner: object, key: str) -> Op[bool]:
    """``retry``: False once the key failed ``max_retries`` times."""
    check_key(key)
    limiter = cfg.local_limiter
    if limiter is not None:
        tail = [cfg.max_retries_arg, repr(check_delay(limiter.when(key)))]
    else:
        tail = [cfg.max_retries_arg, "", *cfg.server_limiter_args]
    endpoint = limiter is None
    return bool(int((yield from fenced(cfg, holds, owner, key, "retry", "retry", tail, endpoint))))


# -- time --------------------------------------------------------------------------------


def reap(cfg: QueueConfig, reports: Reports) -> Op[None]:
    """Release due keys and reap leases (a virtual clock moved, or a timer fired)."""
    now, events = yield "reap", [cfg.clock_arg(), *cfg.reap_args]
    reports.emit(now, events)


# -- reading -------------------------------------------------------------------------------


def stats(cfg: QueueConfig, reports: Reports, getters: Getters) -> Op[tuple[RedisStats, int]]:
    """The queue's stats, and its dirty count (for the gauges)."""
    reply = yield "stats", [cfg.clock_arg(), *cfg.reap_args]
    reports.emit(reply[0], reply[6])
    stats, _, dirty = parse_stats(reply, getters.shutting_down)
    return stats, dirty


def snapshot(
    cfg: QueueConfig, reports: Reports, getters: Getters, limit: object
) -> Op[tuple[Snapshot[str], int]]:
    """The queue's snapshot (``Snapshot``), and its dirty count (for the
    gauges). A bad ``limit`` raises before anything is sent."""
    rows = check_limit(limit)
    reply = yield "snapshot", [cfg.clock_arg(), str(rows)]
    summary = reply[0]
    reports.emit(summary[0], summary[6])
    stats, _, dirty = parse_stats(summary, getters.shutting_down)
    return parse_snapshot(stats, reply, rows), dirty


def dead(cfg: QueueConfig, limit: object) -> Op[tuple[DeadKey[str], ...]]:
    """The first ``limit`` dead keys, newest first (a bad ``limit`` raises
    before anything is sent)."""
    rows = check_limit(limit)
    keys, times, entries = yield "dead", [cfg.clock_arg(), str(rows)]
    return parse_dead(keys, times, entries)


def replay(cfg: QueueConfig, reports: Reports, keys: list[str] | None) -> Op[list[str]]:
    """``replay`` of ``keys`` (None: every dead key): the keys replayed."""
    args = ["all"] if keys is None else ["keys", *(check_key(key) for key in keys)]
    now, replayed, _, events = yield "replay", [cfg.clock_arg(), *args]
    if events:
        reports.emit(now, events)
    if cfg.local_limiter is not None:
        for key in replayed:
            cfg.local_limiter.forget(text(key))
    return [text(key) for key in replayed]


def forget_dead(cfg: QueueConfig, key: str) -> Op[bool]:
    """``forget_dead``: whether ``key`` had a dead entry."""
    return bool(int((yield "forget_dead", [cfg.clock_arg(), check_key(key)])))


def idle(cfg: QueueConfig) -> Op[bool]:
    """``join``'s look: whether the queue (every client's) has nothing
    waiting or pending, held or delayed. One read-only script: three O(1)
    reads, atomic."""
    dirty, held, delayed = yield "idle", []
    return not (int(dirty) or int(held) or int(delayed))


def delete(cfg: QueueConfig, force: object) -> Op[bool]:
    """Delete the queue: whether it existed. ``RuntimeError`` (nothing
    changed) while keys are held, unless ``force``."""
    check_flag(force, "force")
    _, held, deleted, existed = yield "delete", [cfg.clock_arg(), "1" if force else ""]
    if not int(deleted):
        raise RuntimeError(
            f"keyqueue.redis queue {cfg.name!r}: {int(held)} key(s) are held; not "
            "deleted (delete(force=True) deletes it anyway: their holders' done "
            "then raises LeaseLost)"
        )
    return bool(int(existed))
