"""The operations that take and end a Redis queue client's holds, without I/O.

A get or a claim takes keys, each a hold of this client (``Holds``) with a
fencing token; a done, a claim's settles or a put back ends them; the
renewal keeps them. Each operation is a generator, as ``_ops``' are: it
yields one ``Call`` and is sent the reply (``answer``), or the error of its
call (``failed``).

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

This module imports neither redis nor threading.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ._config import MAX_CLAIM, QueueConfig, check_key
from ._getters import Getters
from ._holds import CLAIMED, REPORTED, Hold, Holds, Settle, lease_lost
from ._ops import Op
from ._replies import EMPTY, LOST, Reports, text

__all__ = [
    "Taken",
    "claim",
    "done",
    "get",
    "hand_back",
    "put_back",
    "renew",
    "renewal",
    "renewed",
    "start",
]

logger = logging.getLogger("keyqueue")

Taken = list[tuple[str, Hold]]
"""Keys a claim took, with their holds."""


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
        listened = holds.reports.events.observer is not None  # else only poison events
        args += (str(want), number, " ".join(lost), cfg.aging_arg, "1" if listened else "")
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
    if hold.lost or holds.overdue(key, hold):
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


def renewal(cfg: QueueConfig, holds: Holds) -> tuple[list[str], list[Hold]]:
    """ARGV of a renewal: clock, lease, then key, token, start triples of
    live holds (``Holds.renewal``); and the holds whose start it reports."""
    args = [cfg.clock_arg(), cfg.lease_arg]
    return args, holds.renewal(args)


def renew(cfg: QueueConfig, holds: Holds, now: float | None = None) -> Op[None] | bool:
    """The renewal of every live hold (neither lost nor after a failed
    call), reporting the starts not reported yet; with none, whether the
    renewal loop goes on (False: it ends). Sent at ``now`` (monotonic): once
    answered, the local deadlines of the holds it renewed move on
    (``Holds.kept``; the replicated mode's)."""
    args = [cfg.clock_arg(), cfg.lease_arg]
    kept: list[Hold] | None = None if now is None or holds.keep is None else []
    starts = holds.renewal(args, kept)
    if len(args) > 2:
        return _renew(cfg, holds, args, starts, kept, now)
    return not holds.renewals_end()


def _renew(
    cfg: QueueConfig,
    holds: Holds,
    args: list[str],
    starts: list[Hold],
    kept: list[Hold] | None,
    sent: float | None,
) -> Op[None]:
    renewed(cfg, holds, (yield "renew", args))
    for hold in starts:
        hold.run = REPORTED
    if kept and sent is not None:
        holds.kept(kept, sent)


def renewed(cfg: QueueConfig, holds: Holds, reply: Sequence[Any]) -> None:
    """Mark the holds a renewal found reaped lost: their ``done`` raises LeaseLost."""
    now, lost = reply
    for i in range(0, len(lost), 2):
        key = text(lost[i])
        hold = holds.reaped(key, int(lost[i + 1]))
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
