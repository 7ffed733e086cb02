"""What the workers of one Redis queue client share when they take keys in batches.

``ClaimBook`` is the state of a run's claims (``_claims``): keys claimed and
not handed out yet, holds handed to a worker, dones queued and not sent yet,
and who waits. It does no I/O and takes no lock of its own: its caller holds
the view's guard (``_claims``). The claims use the client's parts, which
its driver hands over (``ClaimParts``, made by ``_sync`` and ``_async``):
one per shard, a sharded client's shards each with their own (holds, claim
records, turn), a key's hold in its shard's. How the claimant finds the
shards to claim from and waits for any of them is a ``Spread``: ``OneShard``
for an unsharded client, a sharded client's ``_shard_waits``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from .._outcome import ERRORS, LEASE_LOST
from . import _holding as holding
from ._config import MAX_CLAIM, QueueConfig
from ._getters import Getters
from ._holds import Hold, Holds
from ._ops import Op
from ._replies import Reports

__all__ = [
    "ClaimBook",
    "ClaimParts",
    "Claimed",
    "OneShard",
    "QueuedDone",
    "Spread",
    "UnsentDone",
    "chunks",
    "claim_parts",
    "claim_turn",
    "warn_lost",
    "warn_stale",
]

logger = logging.getLogger("keyqueue")

T = TypeVar("T")

Claimed = tuple[str, Hold]
"""A key a claim took, and its hold."""
QueuedDone = tuple[str, Hold, bool]
"""A finished hold's done, queued for the next claim: its key, the hold, and
whether to forget the key first."""
UnsentDone = tuple[QueuedDone, str]
"""A queued done, and the outcome its worker counted."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimParts:
    """What the claims use of a Redis queue client, handed over by its driver
    (``_sync``, ``_async``): its holds and getters, its operations (sans-I/O
    generators), the I/O that makes them (``drive``: the reply, or a
    coroutine of it on the loop), the wait for the doorbell, and its clock."""

    holds: Holds
    """The client's holds (the claimed keys are holds like any other)."""
    getters: Getters
    """The client's getters: its shutdown flag, interrupts, blocked count."""
    drive: Callable[[Op[Any]], Any]
    """Make ``op``'s call: its result (a coroutine of it, on asyncio)."""
    wait_for_bell: Callable[[int], Any]
    """Wait for the doorbell, interrupts counted from ``seen`` (``_bell``)."""
    claim: Callable[
        [int, Sequence[QueuedDone], float], Op[tuple[list[Claimed], list[str], float | None]]
    ]
    """``_holding.claim`` on the client's parts: take ``want`` keys, send the dones."""
    put_back: Callable[[Sequence[tuple[str, int]]], Op[tuple[float, list[bool]]]]
    """``_holding.put_back``: keys waiting again, no failure."""
    start: Callable[[str, Hold], Op[bool] | bool]
    """``_holding.start``: a suspect's start reported."""
    now: Callable[[], float]
    """This client's time for hold ages (its virtual clock's, or monotonic)."""
    holds_taken: Callable[[], None]
    """A claim took keys (an asyncio client's drain waits for them)."""


def claim_parts(
    cfg: QueueConfig,
    reports: Reports,
    holds: Holds,
    getters: Getters,
    drive: Callable[[Op[Any]], Any],
    wait_for_bell: Callable[[int], Any],
    holds_taken: Callable[[], None],
) -> ClaimParts:
    """A client's ``ClaimParts``: its operations bound to its settings,
    events, holds and getters, with its driver's I/O."""
    clock = cfg.clock
    return ClaimParts(
        holds=holds,
        getters=getters,
        drive=drive,
        wait_for_bell=wait_for_bell,
        claim=functools.partial(holding.claim, cfg, holds, getters),
        put_back=functools.partial(holding.put_back, cfg, reports),
        start=functools.partial(holding.start, cfg, holds),
        now=time.monotonic if clock is None else clock.now,  # QueueConfig.local
        holds_taken=holds_taken,
    )


class Spread(Protocol):
    """How a run's claimant takes from the shards of its client: the order
    to look at them in, and the wait for any of them (``OneShard``; a
    sharded client's ``_shard_waits.ShardWaits`` or ``AsyncShardWaits``)."""

    @property
    def interrupts(self) -> int:
        """The client's ``interrupt`` calls: a claimant that began before one raises ``Empty``."""
        ...

    def first_order(self) -> tuple[int, ...]:
        """Every shard, from the one after the shard that gave the last keys."""
        ...

    def wait(self, seen: int, deadline: float | None) -> Any:
        """Wait until a shard may have work: the ready shards to look at
        (None: every shard), or a coroutine of them. ``Empty`` once
        interrupted since ``seen``, ``ShutDown`` once shut down."""
        ...

    def looked(self, shard: int, again: bool) -> None:
        """A claim that asked for keys ran on ``shard`` (``again``: look at once)."""
        ...

    def took(self, order: Sequence[int], at: int, from_ready: bool) -> None:
        """``order[at]`` gave keys: the next ``first_order`` begins after it."""
        ...

    def give_back(self, shards: Sequence[int]) -> None:
        """Ready shards ``wait`` returned that no claim looked at: ready again."""
        ...


class OneShard:
    """The ``Spread`` of an unsharded client: its one queue, its doorbell."""

    __slots__ = ("_getters", "_wait")

    def __init__(self, parts: ClaimParts) -> None:
        self._getters = parts.getters
        self._wait = parts.wait_for_bell

    @property
    def interrupts(self) -> int:
        return self._getters.interrupts

    def first_order(self) -> tuple[int, ...]:
        return (0,)

    def wait(self, seen: int, deadline: float | None) -> Any:
        """The doorbell wait (``_bell``): its None (or coroutine of None)."""
        return self._wait(seen)

    def looked(self, shard: int, again: bool) -> None:
        pass

    def took(self, order: Sequence[int], at: int, from_ready: bool) -> None:
        pass

    def give_back(self, shards: Sequence[int]) -> None:
        pass


def one_shard(key: str) -> int:
    """The shard of every key of an unsharded client."""
    return 0


_TURN_MADE = threading.Lock()  # guards making a client's claim turn


def claim_turn(holds: Holds, make: Callable[[], T]) -> T:
    """The client's turn to make a claim that takes keys (one at a time per
    client, whatever the runs on it): ``make()`` the first time."""
    if holds.claim_turn is None:
        with _TURN_MADE:
            if holds.claim_turn is None:
                holds.claim_turn = make()
    return holds.claim_turn  # type: ignore[no-any-return]


class ClaimBook:
    """What the workers of one client share: keys claimed and not yet handed
    out, holds handed out, dones queued and not yet sent, who waits. No I/O;
    every method is called with the view's guard held unless it says otherwise."""

    def __init__(
        self, parts: Sequence[ClaimParts], lease: float, shard_of: Callable[[str], int]
    ) -> None:
        """The book of a client whose shard ``i``'s parts are ``parts[i]``, a
        key's shard ``shard_of(key)``."""
        first = parts[0]
        self.shard_holds = [each.holds for each in parts]  # shard i's holds
        self.shard_of = shard_of
        self.getters = first.getters  # its shutting_down: this client takes no more keys
        self.now = first.now
        self.lease = lease
        # Keys a claim took, in order, not handed to a worker yet.
        self.claimed: deque[Claimed] = deque()
        # Holds handed to a worker whose done is not queued yet (put back if
        # the run is aborted), with their keys.
        self.handed: dict[Hold, str] = {}
        # Claimed keys found taken back (or past their lease) before a worker
        # got them: never handed out; put back by whoever found them.
        self.stale: list[Claimed] = []
        self.closed = False  # the run ended: no more claims take keys, none handed out
        # Holds whose handler was cancelled: put back (added again and released
        # in one script, with the run's end), no done.
        self.cancelled: list[Claimed] = []
        self.unsent_dones: list[UnsentDone] = []  # queued for the next claim, in order
        # Queued dones a round carried over (their shard's claim not reached),
        # and how many rounds carried each (``carry``).
        self.carried: dict[Hold, int] = {}
        self.waiting = 0  # workers in get without a key (the claimant among them)
        self.claimant = False  # a worker claims for the others, or waits for the doorbell
        self.claimant_at_bell = False  # the claimant waits for the doorbell
        # Outcomes the workers counted that a late done changed (lease lost).
        self.corrections: Counter[str] = Counter()

    def hand_out(self, owner: object) -> Claimed | None:
        """Hand the oldest claimed key (and its hold) to the worker ``owner``;
        None if there is none (nor any once this client shuts down or the run
        ended). A claimed key whose lease was taken back, or has been held
        longer than a lease (the process stalled, renewals with it: it may
        have run out), is set aside in ``stale`` instead, never handed out."""
        claimed = self.claimed
        if not claimed or self.closed or self.getters.shutting_down:
            return None
        now = self.now()
        while claimed:
            key, hold = claimed.popleft()
            if hold.lost or now - hold.started >= self.lease:
                self.stale.append((key, hold))
                continue
            hold.owner = owner
            self.handed[hold] = key
            self.waiting -= 1
            self.holds_of(key).started(key, hold)  # its handler starts: the server learns it next
            return key, hold
        return None

    def holds_of(self, key: str) -> Holds:
        """The holds of ``key``'s shard (where its hold is)."""
        return self.shard_holds[self.shard_of(key)]

    def by_shard(self, dones: Sequence[UnsentDone]) -> dict[int, list[UnsentDone]]:
        """``dones`` by their keys' shards, each shard's in order."""
        groups: dict[int, list[UnsentDone]] = {}
        for done in dones:
            groups.setdefault(self.shard_of(done[0][0]), []).append(done)
        return groups

    def next_claim(self) -> tuple[list[UnsentDone], int]:
        """The dones to send (at most ``MAX_CLAIM``: the rest go with the
        next) and how many keys to take in the next claim."""
        dones, self.unsent_dones = self.unsent_dones[:MAX_CLAIM], self.unsent_dones[MAX_CLAIM:]
        closing = self.getters.shutting_down or self.closed
        want = 0 if closing else self.waiting - len(self.claimed)
        return dones, max(want, 0)

    def send_again(self, dones: list[UnsentDone]) -> None:
        """A claim raised: its dones go again with the next one (as asked again)."""
        self.unsent_dones[:0] = dones

    def carry(self, rest: dict[int, list[UnsentDone]], rounds: int) -> dict[int, list[UnsentDone]]:
        """A round took its keys before it reached the shards of ``rest``:
        their dones wait for a later claim on their shard, queued again
        first, unless a done of the shard was carried ``rounds`` times
        already (then the shard's dones go now, in a claim of no keys: the
        ones returned). So a done waits at most ``rounds`` more rounds than
        on one queue."""
        now: dict[int, list[UnsentDone]] = {}
        later: list[UnsentDone] = []
        carried = self.carried
        for shard, mine in rest.items():
            if any(carried.get(hold, 0) >= rounds for (_, hold, _), _ in mine):
                now[shard] = mine
                continue
            later += mine
            for (_, hold, _), _ in mine:
                carried[hold] = carried.get(hold, 0) + 1
        self.unsent_dones[:0] = later
        return now

    def dones_answered(self, dones: list[UnsentDone], statuses: list[str]) -> None:
        """Count the dones the server answered ``lost``: their outcome becomes lease_lost."""
        carried = self.carried
        if carried:
            for (_, hold, _), _ in dones:
                carried.pop(hold, None)
        for ((key, _, _), outcome), status in zip(dones, statuses, strict=True):
            if status == "lost" and outcome != LEASE_LOST:
                warn_lost(key, "its done found the lease taken back")
                self.corrections[outcome] -= 1
                self.corrections[LEASE_LOST] += 1

    def dones_failed(self, name: str) -> None:
        """The last dones' claim raised (in an except block): not released
        (their leases run out), counted as errors."""
        logger.error(
            "keyqueue %r: sending %d done(s) failed; their keys are not released "
            "(their leases run out and they are handed out again)",
            name,
            len(self.unsent_dones),
            exc_info=True,
        )
        for (key, hold, _), outcome in self.unsent_dones:
            hold.unsure = True  # not renewed: its lease runs out
            self.holds_of(key).finish(key, hold)
            self.corrections[outcome] -= 1
            self.corrections[ERRORS] += 1
        self.unsent_dones.clear()
        self.carried.clear()

    def to_put_back(self) -> list[Claimed]:
        """Take every claimed key not handed out, stale ones too, and those of
        cancelled handlers (to put back)."""
        back = self.cancelled + self.stale + list(self.claimed)
        self.claimed.clear()
        self.stale, self.cancelled = [], []
        return back

    def close(self, abort: bool) -> tuple[list[Claimed], list[Claimed]]:
        """The run ended: no claim takes keys from now on. Returns the claimed
        keys to put back and, if ``abort`` (Ctrl-C again: the handlers still
        running are not waited for), the holds of those handlers, to put back
        too (marked lost: their handlers' later calls on them change nothing)."""
        self.closed = True
        running: list[tuple[Hold, str]] = []
        if abort:
            running, self.handed = list(self.handed.items()), {}
        for hold, key in running:
            self.holds_of(key).lose_all([hold])
        return self.to_put_back(), [(key, hold) for hold, key in running]

    def queue_done(
        self, key: str, hold: Hold, forget: bool, outcome: str, put_back: bool = False
    ) -> str:
        """Queue a finished hold's done (``put_back``: its put-back instead, a
        cancelled handler's); the outcome to count."""
        holds = self.holds_of(key)
        if self.handed.pop(hold, None) is None and self.closed:
            holds.finish(key, hold)  # put back when the run was aborted
            return outcome
        if not holds.is_held(key, hold):  # ended already (the handler called done itself)
            logger.error("key %r: done raised; going on: the key is not held any more", key)
            return ERRORS
        if hold.lost or holds.overdue(key, hold):  # taken back, or past its local deadline
            holds.finish(key, hold)
            if outcome != LEASE_LOST:
                warn_lost(key, "its lease was taken back")
            return LEASE_LOST
        if put_back:
            self.cancelled.append((key, hold))
        else:
            self.unsent_dones.append(((key, hold, forget), outcome))
        return outcome


def chunks(back: Sequence[T]) -> list[Sequence[T]]:
    """``back`` in put-back scripts of at most ``MAX_CLAIM`` keys."""
    return [back[i : i + MAX_CLAIM] for i in range(0, len(back), MAX_CLAIM)]


def warn_lost(key: str, how: str) -> None:
    """The runner's one warning for a lease lost (``_outcome``'s words), and how it was learned."""
    logger.warning("key %r: lease lost, another holder may have it; not retrying: %s", key, how)


def warn_stale(name: str, stale: list[Claimed], put: list[bool]) -> None:
    """Say each claimed key that waited for a worker past its lease, and whether it went back."""
    for (key, _), ok in zip(stale, put, strict=True):
        how = "put back" if ok else "its lease was taken back, another holder may have it"
        logger.warning(
            "keyqueue %r: claimed key %r waited for a worker past its lease (this "
            "process stalled?); not handed out: %s",
            name,
            key,
            how,
        )
