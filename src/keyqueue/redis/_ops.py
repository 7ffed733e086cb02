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

Leases: a holder that stops renewing (it died, stalled, or lost its
connection) loses the key to ``reap``: the key waits again at once, charged
nothing if its handler never started (a claimed key no worker took), else
counted as one stall (not a failure); a key that stalls its holder more
than ``max_stalls`` times in a row is given up as a poison key. A late
``done`` or renewal with a stale token changes nothing and raises
``LeaseLost``. Because items are keys, not payloads, recovery neither
duplicates nor loses a change: no two live holders, and every change after
a key's last hand-out leads to one more hand-out.

Starts: the server records each hold's run (``lua/lib/lease.lua``). A get's
hold is started when handed out (its caller has the key when get returns).
A claim's holds are not: the claimant hands each to a worker
(``Holds.started``) and the client reports those starts in batches on the
scripts it sends anyway (the next claim, as settle triples of mode ``s``;
the lease renewal), so a start costs no round trip. A key whose last holder
died holding it comes back with a stall record, and a claim flags it (a
suspect): its start is reported synchronously (``start``) before its
handler runs, so a key that kills its process before a batched report went
out is counted all the same.

This module imports neither redis nor threading: the drivers (``_sync``,
``_async``) send the calls, and pass in the monotonic times and owners.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

from .._checks import check_delay, check_flag
from .._snapshot import Snapshot, check_limit
from ._config import MAX_CLAIM, QueueConfig, check_key, key_batches, priority_arg
from ._getters import Getters
from ._holds import CLAIMED, REPORTED, Hold, Holds, Settle, lease_lost
from ._replies import EMPTY, LOST, RedisStats, Reports, parse_snapshot, parse_stats, text

__all__ = [
    "Call",
    "Op",
    "add",
    "add_after",
    "add_many",
    "add_rate_limited",
    "answer",
    "claim",
    "delete",
    "done",
    "failed",
    "forget",
    "get",
    "hand_back",
    "idle",
    "put_back",
    "reap",
    "renew",
    "renewed",
    "retry",
    "snapshot",
    "start",
    "stats",
]

logger = logging.getLogger("keyqueue")

T = TypeVar("T")

Call = tuple[str, list[str]]
"""A script call: the script's name (``_schema.SCRIPTS``) and its ARGV."""

Op = Generator[Call, Any, T]
"""An operation: yields one ``Call``, is sent its reply, returns the result."""

Taken = list[tuple[str, Hold]]
"""Keys a claim took, with their holds."""


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
    return add_keys(cfg, reports, [check_key(key)], priority_arg(priority))


def add_many(
    cfg: QueueConfig, reports: Reports, keys: Iterable[str], priority: int
) -> Iterator[Op[None]]:
    """``add_many``: one ``add`` script a batch, every key checked first."""
    prio = priority_arg(priority)
    for batch in key_batches(keys):
        yield add_keys(cfg, reports, batch, prio)


def add_keys(cfg: QueueConfig, reports: Reports, keys: list[str], priority: str) -> Op[None]:
    now, _, events = yield "add", [cfg.clock_arg(), priority, cfg.aging_arg, *keys]
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
) -> Op[Any]:
    """A fenced script (clock, token, seq, key, ``tail``, and the endpoint's
    arguments if ``endpoint``): its result, after its events; ``LeaseLost``
    (the hold marked lost, nothing changed) if the lease was taken back.

    If the call raises, its outcome is unknown: the hold is no longer
    renewed (if the call is never answered, the lease runs out and the key
    comes back) until a later call on it answers.
    """
    hold, fence = holds.fence(key, what, owner)
    args = [cfg.clock_arg(), *fence, key, *tail]
    if endpoint:
        args += cfg.endpoint_args(key)
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
    return _delay(cfg, holds, owner, check_key(key), seconds, "delay", priority_arg(priority))


def _delay(
    cfg: QueueConfig,
    holds: Holds,
    owner: object,
    key: str,
    seconds: float,
    kind: str,
    priority: str,
    what: str = "add_after",
) -> Op[None]:
    tail = [repr(seconds), kind, priority, cfg.aging_arg]
    yield from fenced(cfg, holds, owner, key, what, "add_after", tail)


def add_rate_limited(
    cfg: QueueConfig, holds: Holds, owner: object, key: str, priority: int
) -> Op[None]:
    """``add_rate_limited``: the backoff the local limiter chose, or the server's."""
    check_key(key)
    prio = priority_arg(priority)
    limiter = cfg.local_limiter
    if limiter is not None:
        seconds = check_delay(limiter.when(key))
        return _delay(cfg, holds, owner, key, seconds, "rate_limit", prio, "add_rate_limited")
    tail = [*cfg.server_limiter_args, prio, cfg.aging_arg]
    what = "add_rate_limited"
    return fenced(cfg, holds, owner, key, what, what, tail, endpoint=True)


def forget(cfg: QueueConfig, holds: Holds, owner: object, key: str) -> Op[None]:
    """``forget``: the local limiter forgets at once, the server with the script."""
    check_key(key)
    if cfg.local_limiter is not None:
        cfg.local_limiter.forget(key)
    return fenced(cfg, holds, owner, key, "forget", "forget", [])


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


# -- taking keys ---------------------------------------------------------------------------


def _found_none(cfg: QueueConfig, getters: Getters, due: Any, now: float) -> float | None:
    """A get or claim found no key at ``now`` (monotonic): the seconds
    until something is due (None if nothing will, or on a virtual clock),
    noted for the getters (``Getters.looked``)."""
    seconds = None if due in EMPTY or cfg.clock is not None else float(due)
    getters.looked(seconds, now)
    return seconds


def get(
    cfg: QueueConfig, holds: Holds, getters: Getters, owner: object, now: float
) -> Op[tuple[str | None, float | None]]:
    """One get script at monotonic time ``now``: (key, None), its hold
    recorded for ``owner``, or (None, seconds until something is due: None
    if nothing will, or on a virtual clock)."""
    getters.refuse_if_shut()
    slot, number, lost = holds.get_slot()  # the record slot to make it in (the get script's)
    args = [cfg.clock_arg(), cfg.lease_arg, *cfg.reap_args, cfg.holder]
    try:
        reply = yield "get", [*args, slot, number, lost, cfg.aging_arg, ""]
    except BaseException:  # its outcome unknown (or its caller went away)
        holds.get_raised(slot, f"{lost} {number}".lstrip())  # in order, since one answered
        raise
    holds.get_answered(slot)
    if not int(reply[1]):
        at, _, due, events = reply
        holds.reports.emit(at, events)
        return None, _found_none(cfg, getters, due, now)
    at, _, key, token, events = reply
    holds.reports.emit(at, events)
    key = text(key)
    holds.take(key, int(token), cfg.local(now), owner)
    return key, None


def hand_back(cfg: QueueConfig, holds: Holds, slot: str, numbers: str) -> Op[None]:
    """The get script that only hands back what the gets ``numbers`` of
    ``slot`` took (at shutdown: no get follows in the slot)."""
    args = [cfg.clock_arg(), cfg.lease_arg, *cfg.reap_args, cfg.holder]
    try:
        at, _, _, events = yield "get", [*args, slot, "", numbers, cfg.aging_arg, "1"]
    except BaseException:  # asked again at the next shutdown or get
        holds.get_raised(slot, numbers)
        raise
    holds.get_answered(slot)
    holds.reports.emit(at, events)


def claim(
    cfg: QueueConfig,
    holds: Holds,
    getters: Getters,
    want: int,
    settles: Sequence[Settle],
    now: float,
) -> Op[tuple[Taken, list[str], float | None]]:
    """One claim script at monotonic time ``now``: settle ``settles`` (each
    hold's done, after its forget if asked), then take up to ``want`` keys
    (none once this client is shut down), held as ``CLAIMED`` until the
    claimant hands each to its worker (``Hold.owner``).

    Returns the keys taken with their holds, the settled holds' statuses in
    order (``ok``, ``repeat`` or ``lost``: then the hold is marked lost; its
    done changed nothing), and, when it took none, the seconds until
    something is due (as ``get``). Every settled hold is finished. The claim
    also reports the starts of this client's holds handed to a worker since
    its last claim or renewal (``Holds.started``). A key taken whose last
    holder died holding it is a suspect (``Hold.suspect``): its claimant
    reports its start (``start``) before its handler runs. If the call
    raises, the settled holds' outcome is unknown: they are no longer
    renewed, and asked again they are sent as such (upper case); the starts
    go with the next; the keys it took, if it ran, are handed back by the
    next claim (the claim record: no failure counted).
    """
    want = 0 if getters.shutting_down else min(want, MAX_CLAIM)
    limiter = cfg.local_limiter
    if limiter is not None:  # a local limiter forgets here, as forget does
        for key, _, forgets in settles:
            if forgets:
                limiter.forget(key)
    with holds.lock:
        # Only a claim that takes keys writes the record or hands back
        # what it holds: those are one at a time per client (claim_turn).
        number, lost = holds.claim_number(bool(want))
        args = [cfg.clock_arg(), cfg.lease_arg, *cfg.reap_args, cfg.holder]
        args += (str(want), number, " ".join(lost), cfg.aging_arg)
        before = [hold.unanswered for _, hold, _ in settles]
        for key, hold, forgets in settles:
            mode = "f" if forgets else "d"
            args += (key, str(hold.token), mode.upper() if hold.unanswered == "done" else mode)
            hold.unanswered = "done"
        starts = holds.starts(settles)
        for key, hold in starts:
            args += (key, str(hold.token), "s")
    try:
        at, statuses, handed, due, events, suspects = yield "claim", args
    except BaseException as exc:
        holds.unreport(starts)  # reported with the next
        if cfg.unsent(exc):  # not sent: as if never asked
            for (_, hold, _), unanswered in zip(settles, before, strict=True):
                hold.unanswered = unanswered
            raise
        for _, hold, _ in settles:
            hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
        if want:  # what it took, if it ran, is handed back by the next claim
            holds.claim_raised(number)
        raise
    for _, hold in starts:
        hold.run = REPORTED
    if lost:
        holds.claims_handed_back(lost)
    results = [text(status) for status in statuses]
    for (key, hold, _), status in zip(settles, results, strict=True):
        if status == "lost":
            holds.mark_lost(key, hold, float(at))  # the LEASE_LOST event, as done's
        holds.finish(key, hold)
    holds.reports.emit(at, events)
    taken: Taken = []
    started = cfg.local(now)
    for i in range(0, len(handed), 2):
        key = text(handed[i])
        taken.append((key, holds.take(key, int(handed[i + 1]), started, CLAIMED)))
    if suspects:
        for key in map(text, suspects):
            holds.live[key].suspect = True
    seconds = _found_none(cfg, getters, due, now) if want and not taken else None
    return taken, results, seconds


def start(cfg: QueueConfig, holds: Holds, key: str, hold: Hold) -> Op[bool] | bool:
    """A suspect's start, reported before its handler runs (one renewal of
    its hold alone, recording the start): True once recorded. False if
    its lease was taken back meanwhile (then without a call if this
    client knows it already): the hold is lost and finished (it goes to
    no worker). If the call raises, the hold is let go (not renewed: it
    runs out unstarted and comes back, charged nothing)."""
    if hold.lost:
        holds.finish(key, hold)
        return False
    return _start(cfg, holds, key, hold)


def _start(cfg: QueueConfig, holds: Holds, key: str, hold: Hold) -> Op[bool]:
    try:
        reply = yield "renew", [cfg.clock_arg(), cfg.lease_arg, key, str(hold.token), "S"]
    except BaseException:
        hold.unsure = True
        holds.finish(key, hold)
        raise
    renewed(cfg, holds, reply)
    if hold.lost:
        holds.finish(key, hold)
        return False
    hold.run, hold.suspect = REPORTED, False
    return True


# -- ending holds --------------------------------------------------------------------------


def done(cfg: QueueConfig, holds: Holds, owner: object, key: str) -> Op[None]:
    """``done``: releases ``owner``'s hold on ``key``; ``LeaseLost`` if its
    lease was taken back (known before: nothing is sent)."""
    check_key(key)
    with holds.lock:
        hold = holds.find(key, "done", owner)
        before = hold.unanswered
        again = "1" if before == "done" else ""
        hold.unanswered = "done"
    if hold.lost:
        holds.finish(key, hold)
        raise lease_lost(key, hold)
    try:
        now, status, events = yield "done", [cfg.clock_arg(), key, str(hold.token), again]
    except BaseException as exc:
        if cfg.unsent(exc):
            hold.unanswered = before
        else:
            hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
        raise
    holds.finish(key, hold)
    holds.reports.emit(now, events)
    if status in LOST:
        holds.mark_lost(key, hold, float(now))
        raise lease_lost(key, hold)


def put_back(
    cfg: QueueConfig, reports: Reports, held: Sequence[tuple[str, int]]
) -> Op[tuple[float, list[bool]]]:
    """One put_back script for every ``(key, token)`` of ``held``: each key
    whose lease is still that token's waits again at once, no failure.
    Returns the server's time and, in order, whether each key was put back
    (False: its lease had been taken back)."""
    args = [cfg.clock_arg(), cfg.aging_arg]
    for key, token in held:
        args += (key, str(token))
    now, put, events = yield "put_back", args
    reports.emit(now, events)
    return float(now), [bool(int(flag)) for flag in put]


# -- leases and time -----------------------------------------------------------------------


def reap(cfg: QueueConfig, reports: Reports) -> Op[None]:
    """Release due keys and reap leases (a virtual clock moved, or a timer fired)."""
    now, events = yield "reap", [cfg.clock_arg(), *cfg.reap_args]
    reports.emit(now, events)


def renewal(cfg: QueueConfig, holds: Holds) -> tuple[list[str], list[Hold]]:
    """ARGV of a renewal: clock, lease, then key, token, start triples of
    live holds (``Holds.renewal``); and the holds whose start it reports."""
    args = [cfg.clock_arg(), cfg.lease_arg]
    return args, holds.renewal(args)


def renew(cfg: QueueConfig, holds: Holds) -> Op[None] | bool:
    """The renewal of every live hold (neither lost nor after a failed
    call), reporting the starts not reported yet; with none, whether the
    renewal loop goes on (False: it ends)."""
    args, starts = renewal(cfg, holds)
    if len(args) > 2:
        return _renew(cfg, holds, args, starts)
    return not holds.renewals_end()


def _renew(cfg: QueueConfig, holds: Holds, args: list[str], starts: list[Hold]) -> Op[None]:
    renewed(cfg, holds, (yield "renew", args))
    for hold in starts:
        hold.run = REPORTED


def renewed(cfg: QueueConfig, holds: Holds, reply: Sequence[Any]) -> None:
    """Mark the holds a renewal found taken back: their ``done`` raises LeaseLost."""
    now, lost = reply
    for i in range(0, len(lost), 2):
        key = text(lost[i])
        hold = holds.taken_back(key, int(lost[i + 1]))
        if hold is None:
            continue  # done since, or a newer hold of the key
        # Debug only: the holder learns it as LeaseLost from its next call
        # on the key (the runner logs that, once).
        logger.debug(
            "keyqueue %r: the lease of key %r was taken back (this client stalled "
            "past its lease?); its done will raise LeaseLost",
            cfg.name,
            key,
        )
        holds.mark_lost(key, hold, float(now))


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
