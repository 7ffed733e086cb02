"""The holds a Redis queue client keeps: its keys, their tokens, and how each ends.

Theory of operation
-------------------
The server knows every lease; a client knows its own holds: the key, the
fencing token its get or claim was handed, who took it (a thread, a task,
or ``CLAIMED`` until a claimant hands it to a worker), and what this client
has learned of it since. A hold ends in one of the ways ``keyqueue.redis``'s
glossary names (done, put back, abandoned, reaped, lost); until then it is
*live* (in ``Holds.live``), renewed with the client's other holds, and its
calls carry its token.

A key can be handed out again while its old holder has not called done (its
lease ran out and another get took it): the old hold moves to ``Holds.lost``
under the key, and the holds of one key are told apart by owner, so the old
holder's done raises ``LeaseLost`` instead of releasing the new hold.

The calls that take keys keep records here too. A get or claim whose reply
was lost may have taken keys no caller learned: the next get in the same
record slot (the next claim) names it, and the server hands back what it
took (``lua/get.lua``, ``lua/claim.lua``).

In the replicated mode (``_durability``) each hold has a local deadline:
the send time of its last hand-out or renewal that every replica
acknowledged, plus ``keep`` (the lease less a margin). Past it the hold is
lost as if a renewal had said so: the renewal loop marks it (``renewal``,
waking for it: ``next_wake``), and a done or fenced call finds it
(``overdue``, ``fence``) and raises ``LeaseLost`` without sending.

One lock, ``Holds.lock``, guards every field below that says so; the
drivers build their conditions on it (``Getters`` shares it). Callbacks
(the renewal start, the drain wake-up, events) run outside it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import LeaseLost
from .._events import EventKind
from ._replies import Reports

__all__ = [
    "CLAIMED",
    "REPORTED",
    "STARTED",
    "UNSTARTED",
    "Hold",
    "Holds",
    "Settle",
    "lease_lost",
]

CLAIMED = object()
"""The owner of a hold a claim took until its claimant hands it to a worker."""

# A hold's run (``Hold.run``): what the server knows of its handler's start.
UNSTARTED = 0  # a claimed key not handed to a worker: the server has it unstarted
STARTED = 1  # handed to a worker; the server has it unstarted until reported
REPORTED = 2  # the server has it started (a get's hold from the start)


class Hold:
    """A key this client holds: its fencing token and when it was taken."""

    __slots__ = (
        "deadline",
        "lost",
        "owner",
        "run",
        "seq",
        "started",
        "suspect",
        "token",
        "unanswered",
        "unsure",
    )

    def __init__(self, token: int, started: float, owner: object) -> None:
        self.token = token
        self.started = started
        self.owner = owner  # the thread or task that took it
        # UNSTARTED, STARTED or REPORTED: a claimed key's start reaches the
        # server with this client's next claim or renewal (REPORTED once answered).
        self.run = UNSTARTED if owner is CLAIMED else REPORTED
        # A claimed key whose last holder died holding it: its start is
        # reported before its handler runs (ops.start).
        self.suspect = False
        self.lost = False  # the lease was taken back (a renewal or an outcome learned it)
        # A call on the hold raised (a lost connection): whether it reached the
        # server is unknown, so the lease is no longer renewed. If the call did
        # not release the key, the lease runs out and the key comes back;
        # asking the same call again is safe (the scripts apply it once).
        self.unsure = False
        # Fenced outcomes (retry, add_after, add_rate_limited, forget) carry a
        # request number, per hold: the server applies each number once. A call
        # asked again after it raised (``unanswered`` names it) reuses its number.
        self.seq = 0
        self.unanswered = ""
        # The replicated mode's local deadline (monotonic seconds): past it the
        # hold is lost. inf: none (the default mode, or a virtual clock).
        self.deadline = math.inf


Settle = tuple[str, Hold, bool]
"""A hold a claim settles: its key, the hold, and whether to forget the key first."""


def lease_lost(key: str, hold: Hold, what: str = "done") -> LeaseLost:
    """The ``LeaseLost`` a call ``what`` on ``hold`` raises (its lease was taken back)."""
    return LeaseLost(
        f"{what}({key!r}): the lease (token {hold.token}) ran out and was taken back; "
        "another holder may have the key. Nothing changed."
    )


class Holds:
    """This client's holds, its get and claim records, and the one lock.

    ``holds[key]``, ``key in holds``, ``holds.get(key)`` and ``len(holds)``
    read the live holds. Every method takes the lock itself unless it says
    it is called with it held.
    """

    def __init__(
        self,
        reports: Reports,
        *,
        virtual: bool,
        start_renewing: Callable[[], None],
        nothing_held: Callable[[], None],
        keep: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.lock = threading.Lock()
        # Seconds a confirmed hand-out or renewal keeps a hold (the replicated
        # mode's local deadlines; None: no deadline). Time for them: clock
        # (monotonic, as the drivers' ``now``), and wall for a deadline's
        # LEASE_LOST event (other events carry the server's time).
        self.keep = keep
        self.clock = clock
        self.wall = wall
        self.reports = reports
        self.virtual = virtual  # a virtual clock: leases are not renewed
        self.start_renewing = start_renewing  # the driver's: start the renewal loop
        self.nothing_held = nothing_held  # the driver's: wake the drains and joiners
        # key -> the live hold. Guarded by lock.
        self.live: dict[str, Hold] = {}
        # key -> holds whose lease was taken back and whose holder has not
        # called done yet (never empty lists). Guarded by lock.
        self.lost: dict[str, list[Hold]] = {}
        # Claimed holds handed to a worker whose start the server has not been
        # told (run STARTED when appended; the next claim or renewal takes
        # them). Guarded by lock.
        self.unreported: list[tuple[str, Hold]] = []
        # The renewal loop (a thread or a task) while one runs; None when none
        # does: set by the driver that starts one, cleared (under lock) by the
        # renewal that finds nothing left to renew.
        self.renewer: object | None = None
        # Gets made in the slots of this client's get record: how many it
        # made, the slots free, and the slots whose last get raised, with the
        # numbers of the slot's gets since the last one answered (the next get
        # in the slot hands back what the last of them that ran took).
        # Guarded by lock.
        self.gets_made = 0
        self.get_slots: list[str] = []
        self.gets_lost: list[tuple[str, str]] = []
        # Claims: how many this client made, and those that took keys and
        # whose reply was lost (the next claim hands back what they took).
        # Guarded by lock.
        self.claims_made = 0
        self.claims_lost: list[str] = []
        # The claims that take keys, one at a time per client, so that the one
        # claim record always holds the last of them: the claim views' lock
        # (a threading.Lock or an asyncio.Lock), made by the first view.
        self.claim_turn: Any = None

    # -- the live holds, read ----------------------------------------------------------

    def __getitem__(self, key: str) -> Hold:
        return self.live[key]

    def __contains__(self, key: object) -> bool:
        return key in self.live

    def __len__(self) -> int:
        return len(self.live)

    def get(self, key: str) -> Hold | None:
        """The live hold of ``key``, or None."""
        return self.live.get(key)

    def is_held(self, key: str, hold: Hold) -> bool:
        """Whether ``hold`` has not ended (live, or lost and not finished)."""
        with self.lock:
            return self.live.get(key) is hold or hold in self.lost.get(key, ())

    def idle(self) -> bool:
        """Whether this client holds nothing (no live hold, no lost one unfinished)."""
        with self.lock:
            return not self.live and not self.lost

    def count(self) -> int:
        """How many holds have not ended, live and lost."""
        with self.lock:
            return len(self.live) + sum(len(lost) for lost in self.lost.values())

    def ages(self, now: float) -> tuple[float, float]:
        """The live holds' total and longest age at ``now`` (this client's time)."""
        total = longest = 0.0
        with self.lock:
            holds = list(self.live.values())
        for hold in holds:
            held = now - hold.started
            total += held
            if held > longest:
                longest = held
        return total, longest

    # -- taking and finding ------------------------------------------------------------

    def take(self, key: str, token: int, started: float, owner: object) -> Hold:
        """Record a hold of ``owner`` (``CLAIMED`` for one a claimant hands on),
        taken at ``started``; start the renewal loop if none runs."""
        hold = Hold(token, started, owner)
        if self.keep is not None:
            hold.deadline = started + self.keep
        with self.lock:
            old = self.live.get(key)
            if old is not None and (old.owner != owner or owner is CLAIMED):
                # The server handed the key out again, so the old lease is gone;
                # its holder's done must raise LeaseLost, not release this hold.
                # (The same thread or task getting it again has moved on.)
                self.lost.setdefault(key, []).append(old)
            self.live[key] = hold
            renew = not self.virtual and self.renewer is None
        if renew:
            self.start_renewing()
        return hold

    def find(self, key: str, what: str, owner: object) -> Hold:
        """The hold of ``owner`` on ``key`` (called with the lock held).

        The live hold, unless another owner holds that one and ``owner``'s own
        was taken back (then that one: its done raises LeaseLost). Holds are
        told apart by owner only when a key was handed out again while its old
        holder had not called done. ``ValueError`` if this client holds none.
        """
        hold = self.live.get(key)
        lost_holds = self.lost.get(key)
        if lost_holds and (hold is None or hold.owner != owner):
            for lost in lost_holds:
                if lost.owner == owner:
                    return lost
            if hold is None:
                return lost_holds[0]
        if hold is None:
            raise ValueError(f"{what}({key!r}): key is not being processed by this client")
        return hold

    def token(self, key: str, owner: object) -> int:
        """The fencing token of ``owner``'s hold on ``key`` (``ValueError``: none)."""
        with self.lock:
            return self.find(key, "token", owner).token

    def finish(self, key: str, hold: Hold) -> None:
        """The hold ended: drop it; wake the drains and joiners when this
        client holds nothing."""
        with self.lock:
            if self.live.get(key) is hold:
                del self.live[key]
            else:
                lost_holds = self.lost.get(key, [])
                if hold in lost_holds:
                    lost_holds.remove(hold)
                    if not lost_holds:
                        del self.lost[key]
            idle = not self.live and not self.lost
        if idle:
            self.nothing_held()

    def abandon(self, key: str, owner: object) -> None:
        """Let go of ``owner``'s hold of ``key``: never renewed again, ended
        here (``ValueError`` if there is none)."""
        with self.lock:
            hold = self.find(key, "abandon", owner)
            hold.unsure = True
        self.finish(key, hold)

    # -- lost leases -------------------------------------------------------------------

    def mark_lost(self, key: str, hold: Hold, now: float) -> None:
        """Mark ``hold`` lost, learned at ``now`` (server time): the
        LEASE_LOST event once per hold, whichever reply learned it first (a
        renewal and a done or settle in flight may both)."""
        with self.lock:
            first = not hold.lost
            hold.lost = True
        if first:
            self.reports.report(EventKind.LEASE_LOST, key, now)

    def overdue(self, key: str, hold: Hold) -> bool:
        """Whether ``hold``'s local deadline has passed (the replicated mode):
        then it is marked lost (``mark_lost``)."""
        if self.keep is None or hold.deadline > self.clock():
            return False
        self.mark_lost(key, hold, self.wall())
        return True

    def lose_all(self, holds: Sequence[Hold]) -> None:
        """Mark ``holds`` lost without an event (a run aborted under their handlers)."""
        with self.lock:
            for hold in holds:
                hold.lost = True

    def fence(self, key: str, what: str, owner: object) -> tuple[Hold | None, list[str]]:
        """``owner``'s hold on ``key`` (None if it holds none: the call is not
        fenced) and the token and request number the script takes.

        Raises ``LeaseLost`` (nothing sent) if the hold's lease is known to be
        taken back, or its local deadline passed. The request number is the
        last one again if the last call on the hold was this one and it
        raised (its outcome is unknown).
        """
        with self.lock:
            if key not in self.live and key not in self.lost:
                return None, ["", "0"]
            hold = self.find(key, what, owner)
            if hold.lost:
                raise lease_lost(key, hold, what)
            if self.keep is None or hold.deadline > self.clock():
                if hold.unanswered != what:
                    hold.seq += 1
                hold.unanswered = what
                return hold, [str(hold.token), str(hold.seq)]
        self.mark_lost(key, hold, self.wall())
        raise lease_lost(key, hold, what)

    def answered(self, hold: Hold, lost: bool) -> bool:
        """A fenced call on ``hold`` was answered (``lost``: its lease was taken
        back): whether it is renewed again (a call on it had raised)."""
        with self.lock:
            hold.unanswered = ""
            renew = hold.unsure and not hold.lost and not lost
            hold.unsure = False
        return renew and not self.virtual

    # -- renewals and starts -----------------------------------------------------------

    def renewal(self, args: list[str], renewed: list[Hold] | None = None) -> list[Hold]:
        """Append a renewal's key, token, start triples to ``args``: the live
        holds (neither lost nor after a failed call; start ``s`` for a hold
        whose start the server has not been told). Returns the holds whose
        start it reports; appends every hold it renews to ``renewed`` (if
        given). A hold past its local deadline is marked lost instead."""
        starts: list[Hold] = []
        late: list[tuple[str, Hold]] = []
        with self.lock:
            now = -math.inf if self.keep is None else self.clock()  # -inf: no deadline
            for key, hold in self.live.items():
                if not (hold.lost or hold.unsure):
                    if hold.deadline <= now:
                        late.append((key, hold))
                        continue
                    if renewed is not None:
                        renewed.append(hold)
                    if hold.run == STARTED:
                        starts.append(hold)
                        args += (key, str(hold.token), "s")
                    else:
                        args += (key, str(hold.token), "-")
        for key, hold in late:
            self.mark_lost(key, hold, self.wall())
        return starts

    def kept(self, renewed: Sequence[Hold], sent: float) -> None:
        """A renewal sent at ``sent`` (monotonic) was confirmed: the local
        deadlines of the holds it renewed move to ``sent + keep``."""
        if self.keep is None:
            return
        deadline = sent + self.keep
        with self.lock:
            for hold in renewed:
                if not hold.lost and hold.deadline < deadline:
                    hold.deadline = deadline

    def next_wake(self, interval: float) -> float:
        """Seconds until the renewal loop's next turn: ``interval``, or less
        to reach the earliest local deadline of a hold it renews."""
        if self.keep is None:
            return interval
        with self.lock:
            earliest = min(
                (h.deadline for h in self.live.values() if not (h.lost or h.unsure)),
                default=math.inf,
            )
        return max(0.0, min(interval, earliest - self.clock()))

    def renewals_end(self) -> bool:
        """No hold to renew: True if the renewal loop ends (none is live: it is
        forgotten), False if a hold arrived meanwhile (renewed next time)."""
        with self.lock:
            if all(hold.lost or hold.unsure for hold in self.live.values()):
                self.renewer = None
                return True
        return False

    def reaped(self, key: str, token: int) -> Hold | None:
        """The live hold ``key``/``token`` a renewal found reaped, unless it
        is lost already or ended (done since, or a newer hold of the key)."""
        with self.lock:
            hold = self.live.get(key)
            if hold is None or hold.lost or hold.token != token:
                return None
            return hold

    def started(self, key: str, hold: Hold) -> None:
        """A claimed hold is handed to its worker, whose handler starts now:
        the server learns it from this client's next claim or renewal (a
        suspect's claimant reports it first, ``ops.start``)."""
        if hold.suspect:
            return
        with self.lock:
            hold.run = STARTED
            self.unreported.append((key, hold))

    def starts(self, settles: Sequence[Settle]) -> list[tuple[str, Hold]]:
        """The holds whose start a claim reports (called with the lock held):
        those handed to a worker since, still live and not settled by it."""
        unreported, self.unreported = self.unreported, []
        if not unreported:
            return unreported
        ending = {id(hold) for _, hold, _ in settles}
        return [
            (key, hold)
            for key, hold in unreported
            if hold.run == STARTED
            and not (hold.lost or hold.unsure)
            and id(hold) not in ending
            and self.live.get(key) is hold
        ]

    def unreport(self, starts: list[tuple[str, Hold]]) -> None:
        """A claim that reported ``starts`` raised: the next one reports them."""
        with self.lock:
            self.unreported += starts

    # -- the get and claim records ----------------------------------------------------

    def get_slot(self) -> tuple[str, str, str]:
        """A get's slot in the get record, its number, and the numbers of the
        slot's gets whose reply was lost (what they took, it hands back)."""
        with self.lock:
            self.gets_made += 1
            number = str(self.gets_made)
            if self.gets_lost:
                slot, lost = self.gets_lost.pop()
            elif self.get_slots:
                slot, lost = self.get_slots.pop(), ""
            else:
                slot, lost = number, ""
        return slot, number, lost

    def get_raised(self, slot: str, numbers: str) -> None:
        """The gets ``numbers`` of ``slot`` were not answered: the next get in
        it (or the shutdown) hands back what they took."""
        with self.lock:
            self.gets_lost.append((slot, numbers))

    def get_answered(self, slot: str) -> None:
        """A get in ``slot`` was answered: the slot is free."""
        with self.lock:
            self.get_slots.append(slot)

    def take_gets_lost(self) -> list[tuple[str, str]]:
        """Every slot whose gets were not answered (at shutdown: no get follows)."""
        with self.lock:
            lost, self.gets_lost = self.gets_lost, []
        return lost

    def claim_number(self, takes: bool) -> tuple[str, list[str]]:
        """A claim's number, and (if it ``takes`` keys) the numbers of the
        claims whose reply was lost, whose keys it hands back (called with
        the lock held)."""
        self.claims_made += 1
        return str(self.claims_made), list(self.claims_lost) if takes else []

    def claim_raised(self, number: str) -> None:
        """A claim that takes keys raised: the next one hands back what it took."""
        with self.lock:
            self.claims_lost.append(number)

    def claims_handed_back(self, numbers: list[str]) -> None:
        """A claim handed back what the claims ``numbers`` took."""
        with self.lock:
            self.claims_lost = [n for n in self.claims_lost if n not in numbers]
