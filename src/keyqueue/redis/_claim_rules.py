"""The rules of batched claims, written once for threads and tasks (``_claims``).

``ClaimRules`` holds a run's ``ClaimBook`` and writes each rule as a flow
(``_flow.Flow``): it yields the calls to make, which ``Claims`` (threads:
``drive``) and ``AsyncClaims`` (the loop: ``adrive``) make, each its own way.
It is also what the workers call for their outcomes (``forget`` folded into
the done, ``retry``, ``add_after``...) and the ``_source.WorkerSource`` the
runners drive (``report``, ``requeue``, ``leave``).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import time
from collections import Counter
from typing import Any

from .._errors import Empty, ShutDown
from .._flow import Flow, Pause
from .._outcome import ABANDONED, abandon_flow
from ._claim_book import ClaimBook, Claimed, ClaimParts, UnsentDone, chunks, warn_stale
from ._holds import Hold

__all__ = ["ClaimRules", "WorkerHold"]

logger = logging.getLogger("keyqueue")


class WorkerHold:
    """The key a worker holds: its hold, whether its handler asked to forget
    it (sent with its done), and whether its handler was cancelled (put back)."""

    __slots__ = ("forget", "hold", "key", "put_back")

    def __init__(self, key: str, hold: Hold) -> None:
        self.key = key
        self.hold = hold
        self.forget = False
        self.put_back = False


class ClaimRules(abc.ABC):
    """What ``Claims`` and ``AsyncClaims`` share: a ``_source.WorkerSource``
    over a Redis queue client, and the queue calls its workers' outcomes make.

    A view (``Claims``, ``AsyncClaims``) adds ``get``, ``interrupt`` and
    ``close``, and supplies its guard (held around every use of the book),
    its workers' records and the calls the flows yield (its abstract methods)."""

    _guard: contextlib.AbstractContextManager[Any]

    def __init__(self, queue: Any, parts: ClaimParts, fold_forget: bool = True) -> None:
        """Claims on ``queue``: its public calls (``forget``, ``retry``,
        ``add_after``, ``abandon``, ``interrupt``...) and its ``parts``, which
        its driver hands over."""
        self._client = queue
        self._holds, self._getters, self._parts = parts.holds, parts.getters, parts
        self._lease: float = queue.lease
        self._book = ClaimBook(parts, self._lease)
        # A forget of a worker's key goes with its done (one script) unless the
        # client's forget was replaced: then that runs, as the user asked.
        self._fold_forget = fold_forget
        self.name: str = queue.name
        self.connection_errors: tuple[type[BaseException], ...] = queue.connection_errors
        self.said_errors: tuple[type[BaseException], ...] = queue.said_errors

    @property
    def queue(self) -> Any:
        """What the workers call: these claims (``_source.WorkerSource``)."""
        return self

    @property
    def shutting_down(self) -> bool:
        return self._getters.shutting_down

    @property
    def corrections(self) -> Counter[str]:
        """Outcome counts a late done changed (add them to the run's tallies)."""
        return self._book.corrections

    # -- the view's: how it waits and makes the calls the flows yield ---------------------

    @abc.abstractmethod
    def _mine(self) -> WorkerHold | None:
        """The calling worker's hold, or None."""

    @abc.abstractmethod
    def _set_mine(self, mine: WorkerHold | None) -> None:
        """Record (or, None, clear) the calling worker's hold."""

    @abc.abstractmethod
    def _claim(self, dones: list[UnsentDone], want: int, me: object) -> Any:
        """One claim script: send ``dones``, take up to ``want`` keys into the
        book; the key handed to the worker ``me`` (None: no worker), and the
        due time."""

    @abc.abstractmethod
    def _put_back(self, back: list[Claimed], finish: bool = True) -> Any:
        """``_put_back_flow`` of ``back``: whether each key was put back."""

    @abc.abstractmethod
    def _put_back_stale(self) -> Any:
        """``_put_back_stale_flow``."""

    @abc.abstractmethod
    def _wait_turn(self) -> Any:
        """A worker waits for a key or its turn to claim (the guard held)."""

    @abc.abstractmethod
    def _claimant_left(self, ok: bool) -> None:
        """The claimant left (guard held; ``ok``: with a key): wake the others."""

    @abc.abstractmethod
    def _then(self, first: object, call: functools.partial[Any]) -> Any:
        """``call()`` after ``first`` (a call's result, or an awaitable of it)."""

    # -- taking keys -----------------------------------------------------------------

    def _hand_out_now(self, me: object) -> Claimed | None:
        """A claimed key for the worker ``me`` at once (``_get_flow`` without
        waiting or claiming), or None."""
        book = self._book
        if not book.claimed:
            return None
        with self._guard:
            book.waiting += 1
            handed = book.hand_out(me)
            if handed is None:
                book.waiting -= 1
                return None
        self._set_mine(WorkerHold(*handed))
        return handed

    def _get_flow(self, me: object, handed: Claimed | None = None) -> Flow[str]:
        """A key for the worker ``me`` (``handed``: one it was handed already):
        claimed, or from the last claim. A key whose last holder died holding
        it (a suspect) has its start reported first, one round trip; one
        found taken back meanwhile is skipped."""
        while True:
            if handed is None:
                handed = yield from self._take(me)
                self._set_mine(WorkerHold(*handed))
            (key, hold), handed = handed, None
            if not hold.suspect:
                return key
            try:
                started = yield from self._report_start(key, hold)
            except BaseException:
                self._forget_hold(hold)
                raise
            if started:
                return key
            self._forget_hold(hold)

    def _report_start(self, key: str, hold: Hold) -> Flow[bool]:
        """A suspect's start, reported before its handler runs. False if its
        lease was taken back: it is not this worker's (finished)."""
        start = self._parts.start(key, hold)
        if isinstance(start, bool):
            return start
        return bool((yield functools.partial(self._parts.drive, start)))

    def _forget_hold(self, hold: Hold) -> None:
        """The worker's hold ended before (or without) its done."""
        self._set_mine(None)
        with self._guard:
            self._book.handed.pop(hold, None)

    def _take(self, me: object) -> Flow[Claimed]:
        """Wait for a claimed key, or claim it (the claimant): ``Empty`` once
        interrupted or the run ended, ``ShutDown`` once the client is shut down."""
        book, guard, getters = self._book, self._guard, self._getters
        seen = getters.interrupts
        handed: Claimed | None = None
        waiting = True  # counted in book.waiting
        with guard:
            book.waiting += 1
        try:
            while handed is None:
                dones: list[UnsentDone] = []
                with guard:
                    handed = book.hand_out(me)
                    if handed is not None:
                        break
                    if getters.interrupts != seen or book.closed:
                        raise Empty
                    lead = not book.claimant
                    if lead:
                        book.claimant = True
                    elif book.claimant_at_bell and book.unsent_dones:  # it waits for an add
                        dones, _ = book.next_claim()
                    else:
                        yield self._wait_turn  # a thread's wait releases the guard meanwhile
                        continue
                if not lead:
                    yield functools.partial(self._claim, dones, 0, None)
                    continue
                try:
                    handed = yield from self._claimant(seen, me)
                finally:
                    with guard:
                        if handed is None:
                            book.waiting -= 1
                            waiting = False
                        book.claimant = book.claimant_at_bell = False
                        self._claimant_left(handed is not None)
        except BaseException:
            if handed is None and waiting:
                with guard:
                    book.waiting -= 1
            raise
        return handed

    def _claimant(self, seen: int, me: object) -> Flow[Claimed]:
        """Claim until a key comes for ``me`` (waiting for the doorbell
        between claims that found none)."""
        book, guard, getters = self._book, self._guard, self._getters
        while True:
            if book.stale:  # back before the next claim: its reap would count them failed
                yield self._put_back_stale
            with guard:
                dones, want = book.next_claim()
            handed: Claimed | None
            due: float | None = None
            if dones or want:
                claimed: Any = yield functools.partial(self._claim, dones, want, me)
                handed, due = claimed
            else:
                with guard:
                    handed = book.hand_out(me)
            if handed is not None:
                return handed
            with guard:
                back = book.to_put_back() if getters.shutting_down or book.closed else []
            if back:
                yield functools.partial(self._put_back, back)
            if getters.shutting_down:
                raise ShutDown(f"this client of queue {self.name!r} is shut down")
            if book.closed:
                raise Empty  # the run ended
            if book.stale or getters.look_again(due):
                continue
            with guard:
                if book.unsent_dones:
                    continue
                book.claimant_at_bell = True  # a worker that finishes sends its done itself
            try:
                yield functools.partial(self._parts.wait_for_bell, seen)
            finally:
                with guard:
                    book.claimant_at_bell = False

    def _claim_flow(self, dones: list[UnsentDone], want: int, me: object) -> Flow[Any]:
        """One claim script's call and its reply in the book: the key handed
        to ``me`` (if not None), and the due time."""
        book, guard, driver = self._book, self._guard, self._parts
        op = driver.claim(want, [done for done, _ in dones], time.monotonic())
        try:
            reply: Any = yield functools.partial(driver.drive, op)
        except BaseException:
            with guard:
                book.send_again(dones)
            raise
        taken, statuses, due = reply
        with guard:
            book.dones_answered(dones, statuses)
            book.claimed.extend(taken)
            handed = None if me is None else book.hand_out(me)
        if taken:
            driver.holds_taken()
        return handed, due

    def _put_back_flow(self, back: list[Claimed], finish: bool) -> Flow[list[bool]]:
        """Claimed keys no worker started: waiting again at once, no failure, in
        one script (per ``MAX_CLAIM`` keys). Whether each was put back."""
        put: list[bool] = []
        for chunk in chunks(back):
            held = [(key, hold.token) for key, hold in chunk]
            try:
                reply: Any = yield functools.partial(self._send_put_back, held)
                now, done = reply
            except Exception:
                self._put_back_failed(chunk, finish)
                done = [True] * len(chunk)
            else:
                self._put_back_done(chunk, now, done, finish)
            put += done
        return put

    def _send_put_back(self, held: list[tuple[str, int]]) -> Any:
        return self._parts.drive(self._parts.put_back(held))

    def _put_back_stale_flow(self) -> Flow[None]:
        with self._guard:
            stale, self._book.stale = self._book.stale, []
        if stale:
            warn_stale(self.name, stale, (yield from self._put_back_flow(stale, True)))

    def _put_back_done(
        self, back: list[Claimed], now: float, put: list[bool], finish: bool
    ) -> None:
        """After a put-back: a hold whose key was not put back had been taken
        back (LEASE_LOST, once); each is finished unless the run was aborted
        under its handler (``finish`` False: its handler reports it)."""
        holds = self._holds
        for (key, hold), ok in zip(back, put, strict=True):
            if not ok:
                holds.mark_lost(key, hold, now)
            if finish:
                holds.finish(key, hold)

    def _put_back_failed(self, back: list[Claimed], finish: bool) -> None:
        """A put-back raised (in an except block): the keys come back when
        their leases run out (no longer renewed)."""
        logger.warning(
            "keyqueue %r: putting back %d claimed key(s) failed; each comes back when "
            "its lease runs out",
            self.name,
            len(back),
            exc_info=True,
        )
        for key, hold in back:
            hold.unsure = True
            if finish:
                self._holds.finish(key, hold)

    # -- the worker source -------------------------------------------------------------

    def report(self, key: str, outcome: str, pause: Pause | None) -> Flow[str]:
        """This worker finished ``key``: its done (after its forget, if asked)
        goes with the next claim; no done after ``"abandoned"`` (``abandon``).
        Returns the outcome to count. ``ValueError`` if the worker holds no
        such key."""
        if outcome == ABANDONED:
            return (yield from abandon_flow(self, key))
        mine = self._held(key)
        if mine is None:
            raise ValueError(f"done({key!r}): key is not being processed by this worker")
        self._set_mine(None)
        with self._guard:
            return self._book.queue_done(key, mine.hold, mine.forget, outcome, mine.put_back)

    def requeue(self, key: str) -> Flow[None]:
        """This worker's handler of ``key`` was cancelled: its report puts the
        key back (added again and released in one script, at the run's end,
        so no cancellation can come between the two); a key the worker does
        not hold is added."""
        mine = self._held(key)
        if mine is not None:
            mine.put_back = True
            return
        yield functools.partial(self._client.add, key)

    def leave(self) -> Flow[None]:
        """A worker stops: send the queued dones unless a claim will carry them."""
        book = self._book
        while True:
            with self._guard:
                if not book.unsent_dones or (book.claimant and not book.claimant_at_bell):
                    return
                dones, _ = book.next_claim()
            try:
                yield functools.partial(self._claim, dones, 0, None)
            except Exception:
                logger.warning("keyqueue %r: sending dones failed", self.name, exc_info=True)
                return

    def _send_last_dones(self) -> Flow[None]:
        """The run's end: send every queued done (those that fail are errors)."""
        while True:
            with self._guard:
                dones, _ = self._book.next_claim()
            if not dones:
                return
            try:
                yield functools.partial(self._claim, dones, 0, None)
            except Exception:
                with self._guard:
                    self._book.dones_failed(self.name)
                return

    # -- the outcome's calls -----------------------------------------------------------

    def _held(self, key: str) -> WorkerHold | None:
        mine = self._mine()
        return mine if mine is not None and mine.key == key else None

    def forget(self, key: str) -> Any:
        """For this worker's key, forgotten with its done (one script); else the queue's."""
        mine = self._held(key)
        if mine is not None and self._fold_forget:
            mine.forget = True
            return None
        return self._client.forget(key)

    def _forget_first(self, key: str) -> Any:
        """Apply a forget asked for this worker's key before another outcome call."""
        mine = self._held(key)
        if mine is not None and mine.forget:
            mine.forget = False
            return self._client.forget(key)
        return None

    def add(self, key: str) -> Any:
        return self._client.add(key)

    def add_after(self, key: str, seconds: float, priority: int = 0) -> Any:
        call = functools.partial(self._client.add_after, key, seconds, priority)
        return self._then(self._forget_first(key), call)

    def add_rate_limited(self, key: str, priority: int = 0) -> Any:
        call = functools.partial(self._client.add_rate_limited, key, priority)
        return self._then(self._forget_first(key), call)

    def retry(self, key: str) -> Any:
        return self._then(self._forget_first(key), functools.partial(self._client.retry, key))

    def abandon(self, key: str) -> None:
        mine = self._mine()
        if mine is not None:
            self._forget_hold(mine.hold)
        self._client.abandon(key)
