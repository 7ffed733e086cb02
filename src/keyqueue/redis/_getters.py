"""The getters waiting in a Redis queue client's ``get``: who leads, when to look.

Theory of operation
-------------------
A get that finds no key waits for the queue's doorbell, a list every add
pushes to. One getter of the client, the leader, waits for it in ``BLPOP``
(so an idle client sends one ``BLPOP`` a slice, however many getters it
has); the others, the followers, wait in the driver (on a condition, or on
futures) until the leader leaves, and the first to wake takes its place.

Nothing polls, but the get script is run again without a doorbell at the
*look-at* time: when something delayed comes due (the driver's timer runs
``reap`` then, which rings the bell) and at the latest one lease after the
last look, since another client's lease may run out meanwhile and only a
script reaps it. The getters share that time, so an idle client looks once.

``shutdown`` and ``interrupt`` wake every getter: the followers directly
(``wake_followers``, the driver's), the leader through the client's wake-up
list, which its ``BLPOP`` watches beside the bell. A getter checks the flags
under the lock before it waits, so none blocks unseen after them.

The fields are guarded by the lock of the client's ``Holds``, shared here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._checks import check_timeout
from .._errors import Empty, ShutDown

__all__ = ["Getters"]


class Getters:
    """The getters of one client waiting for the doorbell, its shutdown flag,
    its interrupts and its look-at time. No I/O."""

    __slots__ = (
        "arm",
        "block",
        "blocked",
        "interrupts",
        "leading",
        "lease",
        "lock",
        "look_at",
        "name",
        "shutting_down",
        "wake_followers",
    )

    def __init__(
        self,
        name: str,
        lock: Any,
        *,
        lease: float,
        block: float,
        wake_followers: Callable[[], None],
        arm: Callable[[float], None],
    ) -> None:
        self.name = name
        self.lock = lock  # the client's Holds.lock
        self.lease = lease
        self.block = block  # the longest single BLPOP, in seconds (_connection.block_limit)
        self.wake_followers = wake_followers  # the driver's: wake every follower (lock held)
        self.arm = arm  # the driver's: run reap in so many seconds
        # Getters blocked in get on this client (the claim views' waiting
        # workers count too). Guarded by lock; an asyncio client's changes
        # all run on its loop's thread, where AsyncClaims takes no lock.
        self.blocked = 0
        self.leading = False  # a getter waits in BLPOP. Guarded by lock.
        self.interrupts = 0  # interrupt() calls: a get that began before one raises Empty
        self.shutting_down = False  # this client's shutdown was called. Set under lock.
        # Monotonic time by which some getter of this client is to run the get
        # script again though no doorbell rang.
        self.look_at = 0.0

    def shut(self) -> tuple[bool, int]:
        """Set the shutdown flag and wake the followers. Returns whether this
        was the first shutdown, and how many getters wait in ``BLPOP`` (0 or
        1: the leader), each to be woken through the wake-up list."""
        with self.lock:
            first = not self.shutting_down
            self.shutting_down = True
            self.wake_followers()
            return first, 1 if self.leading else 0

    def interrupt(self) -> int:
        """Count an interrupt and wake the followers (as ``shut``; each getter
        then raises ``Empty``); returns how many getters wait in ``BLPOP``."""
        with self.lock:
            self.interrupts += 1
            self.wake_followers()
            return 1 if self.leading else 0

    def refuse_if_shut(self) -> None:
        """``ShutDown`` once this client is shut down: it takes no more keys."""
        if self.shutting_down:
            raise ShutDown(f"this client of queue {self.name!r} is shut down")

    def check_wait(self, seen: int) -> None:
        """A getter may block: not if this client is shut down (``ShutDown``) or
        ``interrupt`` was called since its get began (``Empty``). Lock held."""
        self.refuse_if_shut()
        if self.interrupts != seen:
            raise Empty

    def stopped(self, seen: int) -> bool:
        """This client was shut down, or interrupted since interrupt ``seen``."""
        return self.shutting_down or self.interrupts != seen

    def bounds(self, timeout: float | None, now: float) -> tuple[int, float | None]:
        """A ``get(timeout)`` begun at ``now`` (monotonic): the interrupts it has
        seen, and its deadline (None: none)."""
        timeout = check_timeout(timeout)
        return self.interrupts, None if timeout is None else now + timeout

    def looked(self, due: float | None, now: float) -> None:
        """A get found nothing waiting at ``now`` (monotonic): the getters need
        not run it again before ``due`` unless the doorbell rings, nor for
        longer than a lease (another client's lease may run out: a get reaps it)."""
        wait = self.lease
        if due is not None and due < wait:
            wait = due
        self.look_at = now + wait

    def look_again(self, due: float | None) -> bool:
        """A get found nothing, ``due`` seconds before something comes due: True
        if more came due than one script releases (run it again now); else,
        if that is within a ``BLPOP`` slice, arm the driver's timer for it."""
        if due is not None:
            if due <= 0:
                return True
            if due < self.block:
                self.arm(due)
        return False

    def blpop_timeout(self, now: float, deadline: float | None) -> float:
        """The leader's next ``BLPOP`` timeout at ``now`` (monotonic): a slice,
        until the next look, or until ``deadline`` (``Empty`` once it passed).
        BLPOP's timeout 0 means forever: never less than 1 ms."""
        wait = min(self.block, self.look_at - now)
        if deadline is not None:
            if deadline <= now:
                raise Empty
            wait = min(wait, deadline - now)
        return max(wait, 0.001)
