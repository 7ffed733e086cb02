"""What the workers of one Redis queue client share when they take keys in batches.

``ClaimBook`` is the state of a run's claims (``_claims``): keys claimed and
not handed out yet, holds handed to a worker, dones queued and not sent yet,
and who waits. It does no I/O and takes no lock of its own: its caller holds
the view's guard (``_claims``). ``QueueParts`` is what the claims use of the
queue client, in one place.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._outcome import ERRORS, LEASE_LOST
from ._protocol import MAX_CLAIM, Op, _Hold

__all__ = [
    "ClaimBook",
    "Claimed",
    "QueueParts",
    "QueuedDone",
    "UnsentDone",
    "chunks",
    "warn_lost",
    "warn_stale",
]

logger = logging.getLogger("keyqueue")

T = TypeVar("T")

Hold = _Hold
Claimed = tuple[str, Hold]
"""A key a claim took, and its hold."""
QueuedDone = tuple[str, Hold, bool]
"""A finished hold's done, queued for the next claim: its key, the hold, and
whether to forget the key first."""
UnsentDone = tuple[QueuedDone, str]
"""A queued done, and the outcome its worker counted."""


class QueueParts:
    """What the claims use of a Redis queue client: its holds, its getters'
    counts, its operations and its driver. The one place that reads the
    client's private state."""

    __slots__ = ("queue",)

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    @property
    def shutting_down(self) -> bool:
        return bool(self.queue.shutting_down)

    @property
    def interrupts(self) -> int:
        """How many times ``interrupt`` was called: a get that saw fewer raises ``Empty``."""
        return int(self.queue._interrupts)

    def now(self) -> float:
        """This client's time for hold ages (its virtual clock's, or monotonic)."""
        return float(self.queue._local(time.monotonic()))

    def blocked(self, n: int) -> None:
        """``n`` more (or fewer) workers wait for a key: counted as blocked in get."""
        with self.queue._lock:
            self.queue._getters += n

    def is_held(self, key: str, hold: Hold) -> bool:
        """Whether ``hold`` has not ended (live, or lost and not finished)."""
        queue = self.queue
        with queue._lock:
            return queue._holds.get(key) is hold or hold in queue._lost_holds.get(key, ())

    def finish(self, key: str, hold: Hold) -> None:
        self.queue._finish(key, hold)

    def mark_lost(self, key: str, hold: Hold, now: float) -> None:
        self.queue._mark_lost(key, hold, now)

    def lose_all(self, holds: Sequence[Hold]) -> None:
        """Mark ``holds`` lost without an event (a run aborted under their handlers)."""
        with self.queue._lock:
            for hold in holds:
                hold.lost = True

    def started(self, key: str, hold: Hold) -> None:
        self.queue._started(key, hold)

    def holds_taken(self) -> None:
        """A claim took keys: an asyncio client's drain waits for them."""
        no_holds = getattr(self.queue, "_no_holds", None)
        if isinstance(no_holds, asyncio.Event):
            no_holds.clear()

    def look_again(self, due: float | None) -> bool:
        return bool(self.queue._look_again(due))

    def claim(
        self, want: int, dones: Sequence[QueuedDone], now: float
    ) -> Op[tuple[list[Claimed], list[str], float | None]]:
        return self.queue._op_claim(want, dones, now)  # type: ignore[no-any-return]

    def put_back(self, held: Sequence[tuple[str, int]]) -> Op[tuple[float, list[bool]]]:
        return self.queue._op_put_back(held)  # type: ignore[no-any-return]

    def start(self, key: str, hold: Hold) -> Op[bool] | bool:
        return self.queue._op_start(key, hold)  # type: ignore[no-any-return]

    def drive(self, op: Op[T]) -> Any:
        """The driver's: ``op`` made (sync), or a coroutine of it (asyncio)."""
        return self.queue._drive(op)

    def wait_for_bell(self, seen: int) -> Any:
        """The driver's wait for the doorbell (or a coroutine of it)."""
        return self.queue._wait_for_bell(seen, None)

    def claim_turn(self, make: Callable[[], T]) -> T:
        """The client's turn to make a claim that takes keys (one at a time
        per client, whatever the runs on it): ``make()`` the first time."""
        queue = self.queue
        if queue._claim_turn is None:
            with _TURN_MADE:
                if queue._claim_turn is None:
                    queue._claim_turn = make()
        return queue._claim_turn  # type: ignore[no-any-return]


_TURN_MADE = threading.Lock()  # guards making a client's claim turn


class ClaimBook:
    """What the workers of one client share: keys claimed and not yet handed
    out, holds handed out, dones queued and not yet sent, who waits. No I/O;
    every method is called with the view's guard held unless it says otherwise."""

    def __init__(self, parts: QueueParts, lease: float) -> None:
        self.parts = parts
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
        claimed, parts = self.claimed, self.parts
        if not claimed or self.closed or parts.shutting_down:
            return None
        now = parts.now()
        while claimed:
            key, hold = claimed.popleft()
            if hold.lost or now - hold.started >= self.lease:
                self.stale.append((key, hold))
                continue
            hold.owner = owner
            self.handed[hold] = key
            self.waiting -= 1
            parts.started(key, hold)  # its handler starts: the server learns it next
            return key, hold
        return None

    def next_claim(self) -> tuple[list[UnsentDone], int]:
        """The dones to send (at most ``MAX_CLAIM``: the rest go with the
        next) and how many keys to take in the next claim."""
        dones, self.unsent_dones = self.unsent_dones[:MAX_CLAIM], self.unsent_dones[MAX_CLAIM:]
        closing = self.parts.shutting_down or self.closed
        want = 0 if closing else self.waiting - len(self.claimed)
        return dones, max(want, 0)

    def send_again(self, dones: list[UnsentDone]) -> None:
        """A claim raised: its dones go again with the next one (as asked again)."""
        self.unsent_dones[:0] = dones

    def dones_answered(self, dones: list[UnsentDone], statuses: list[str]) -> None:
        """Count the dones the server answered ``lost``: their outcome becomes lease_lost."""
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
            self.parts.finish(key, hold)
            self.corrections[outcome] -= 1
            self.corrections[ERRORS] += 1
        self.unsent_dones.clear()

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
        self.parts.lose_all([hold for hold, _ in running])
        return self.to_put_back(), [(key, hold) for hold, key in running]

    def queue_done(
        self, key: str, hold: Hold, forget: bool, outcome: str, put_back: bool = False
    ) -> str:
        """Queue a finished hold's done (``put_back``: its put-back instead, a
        cancelled handler's); the outcome to count."""
        parts = self.parts
        if self.handed.pop(hold, None) is None and self.closed:
            parts.finish(key, hold)  # put back when the run was aborted
            return outcome
        if not parts.is_held(key, hold):  # ended already (the handler called done itself)
            logger.error("key %r: done raised; going on: the key is not held any more", key)
            return ERRORS
        if hold.lost:  # a renewal learned it: the server would answer lost
            parts.finish(key, hold)
            if outcome != LEASE_LOST:
                warn_lost(key, "its lease was taken back")
            return LEASE_LOST
        if put_back:
            self.cancelled.append((key, hold))
        else:
            self.unsent_dones.append(((key, hold, forget), outcome))
        return outcome


def chunks(back: list[Claimed]) -> list[list[Claimed]]:
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
