"""The rules of batched claims, written once for threads and tasks (``_claims``).

``ClaimRules`` holds a run's ``ClaimBook`` and writes each rule as a flow
(``_flow.Flow``): it yields the calls to make, which ``Claims`` (threads:
``drive``) and ``AsyncClaims`` (the loop: ``adrive``) make, each its own way.
It is also what the workers call for their outcomes (``forget`` folded into
the done, ``retry``, ``add_after``...) and the ``_source.WorkerSource`` the
runners drive (``report``, ``requeue``, ``leave``).

A claim is a *round* over the client's shards (one, unless it is sharded):
the claimant asks each shard in its spread's order (``Spread.first_order``:
from the one after the shard that last gave keys) for the keys still
wanted, each shard's claim script carrying that shard's queued dones, until
as many keys came as workers wait; the dones of shards it did not reach go
in claims of no keys. So a full shard does not starve an emptier one (the
next round begins after the shard that gave), the batch is sized to the
waiting workers as on one queue, and each shard keeps its own claim script,
claim record, turn, renewal and put-back. Only a round that found no key
waits, for any shard (``Spread.wait``), and the next round asks the shards
that rang first. A shard a claim found empty is asked after the others for
the next ``PASSED_OVER`` rounds. An unsharded client's round is one claim
script, as ever.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import Empty, ShutDown
from .._flow import Flow, Pause
from .._outcome import ABANDONED, abandon_flow
from ._claim_book import (
    ClaimBook,
    Claimed,
    ClaimParts,
    OneShard,
    Spread,
    UnsentDone,
    chunks,
    claim_turn,
    one_shard,
    warn_stale,
)
from ._holds import Hold

__all__ = ["ClaimRules", "WorkerHold"]

logger = logging.getLogger("keyqueue")

CARRY_GAP = 0.005
"""Seconds: a claimant's round carries other shards' dones over only while
its rounds begin on average (a moving average, 1/8 the weight of the last
gap) less than this apart: then the next claim on their shard comes soon.
Otherwise (slow handlers, or workers that finish together and then work
long) it sends them at once, and a done reaches the server as soon as on
one queue."""

PASSED_OVER = 8
"""Rounds a shard that a claim found empty may be passed over, asked after
the others (and only if they gave too few keys): then it is asked in its
turn again. So a key added to it waits at most that many rounds more, and a
round on a queue whose keys are all in one shard pays one script, not N."""


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
    _new_turn: Callable[[], Any]
    """The view's lock type for a shard's claim turn (``threading.Lock``, ``asyncio.Lock``)."""
    _turns: list[Any]
    """Each shard's claim turn (its client's, shared by every run on it), shard 0's first."""

    def __init__(
        self,
        queue: Any,
        parts: Sequence[ClaimParts],
        fold_forget: bool = True,
        spread: Spread | None = None,
        shard_of: Callable[[str], int] = one_shard,
    ) -> None:
        """Claims on ``queue``: its public calls (``forget``, ``retry``,
        ``add_after``, ``abandon``, ``interrupt``...) and its shards' ``parts``
        (shard ``i``'s: ``parts[i]``), which its driver hands over; ``spread``
        (``OneShard`` of the one shard by default) orders the shards and
        waits for them; a key's shard is ``shard_of(key)``."""
        first = parts[0]
        self._client = queue
        # The first shard's holds and getters hold what is the client's: its
        # lock, its shutdown flag, its count of blocked getters.
        self._holds, self._getters = first.holds, first.getters
        self._shard_parts = list(parts)
        self._spread: Spread = OneShard(first) if spread is None else spread
        self._lease: float = queue.lease
        self._book = ClaimBook(parts, self._lease, shard_of)
        # Shards a claim found empty: the rounds since that passed them over
        # (``_ordered``). Only the claimant (one at a time) reads and writes it.
        self._empty: dict[int, int] = {}
        self._last_round = -math.inf  # when the claimant's last round began (book.now)
        self._gap = math.inf  # the moving average of the seconds between its rounds
        # A forget of a worker's key goes with its done (one script) unless the
        # client's forget was replaced: then that runs, as the user asked.
        self._fold_forget = fold_forget
        self.name: str = queue.name
        self.connection_errors: tuple[type[BaseException], ...] = queue.connection_errors
        self.said_errors: tuple[type[BaseException], ...] = queue.said_errors
        self._turns = [claim_turn(each.holds, self._new_turn) for each in parts]
        self._start_view()

    def grow(self, parts: Sequence[ClaimParts]) -> None:
        """The parts of shards a reshard added to the client (the next shards,
        in order): claimed from too, from the next round on."""
        self._shard_parts.extend(parts)
        self._book.shard_holds.extend(each.holds for each in parts)
        self._turns.extend(claim_turn(each.holds, self._new_turn) for each in parts)

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
    def _start_view(self) -> None:
        """The view's own state (its guard, its workers' records), made last by ``__init__``."""

    @abc.abstractmethod
    def _mine(self) -> WorkerHold | None:
        """The calling worker's hold, or None."""

    @abc.abstractmethod
    def _set_mine(self, mine: WorkerHold | None) -> None:
        """Record (or, None, clear) the calling worker's hold."""

    @abc.abstractmethod
    def _claim_one(self, shard: int, dones: list[UnsentDone], want: int) -> Any:
        """One claim script on ``shard`` (``_claim_flow``, in the shard's claim
        turn if it takes keys): send ``dones``, take up to ``want`` keys into
        the book; how many it took, and the due time."""

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
    def _woken_took(self) -> None:
        """A worker woken from ``_wait_turn`` took a key (guard held)."""

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

    def _parts_of(self, key: str) -> ClaimParts:
        """The parts of ``key``'s shard."""
        return self._shard_parts[self._book.shard_of(key)]

    def _report_start(self, key: str, hold: Hold) -> Flow[bool]:
        """A suspect's start, reported before its handler runs. False if its
        lease was taken back: it is not this worker's (finished)."""
        parts = self._parts_of(key)
        start = parts.start(key, hold)
        if isinstance(start, bool):
            return start
        return bool((yield functools.partial(parts.drive, start)))

    def _forget_hold(self, hold: Hold) -> None:
        """The worker's hold ended before (or without) its done."""
        self._set_mine(None)
        with self._guard:
            self._book.handed.pop(hold, None)

    def _take(self, me: object) -> Flow[Claimed]:
        """Wait for a claimed key, or claim it (the claimant): ``Empty`` once
        interrupted or the run ended, ``ShutDown`` once the client is shut down."""
        book, guard, spread = self._book, self._guard, self._spread
        seen = spread.interrupts
        handed: Claimed | None = None
        waiting = True  # counted in book.waiting
        with guard:
            book.waiting += 1
        woken = False  # back from _wait_turn
        try:
            while handed is None:
                dones: list[UnsentDone] = []
                with guard:
                    handed = book.hand_out(me)
                    if handed is not None:
                        if woken:
                            self._woken_took()
                        break
                    if spread.interrupts != seen or book.closed:
                        raise Empty
                    lead = not book.claimant
                    if lead:
                        book.claimant = True
                    elif book.claimant_at_bell and book.unsent_dones:  # it waits for an add
                        dones, _ = book.next_claim()
                    else:
                        yield self._wait_turn  # a thread's wait releases the guard meanwhile
                        woken = True
                        continue
                if not lead:
                    yield from self._round(dones, 0, None)
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
        """Claim until a key comes for ``me`` (waiting for any shard between
        rounds that found none)."""
        book, guard, getters, spread = self._book, self._guard, self._getters, self._spread
        order, from_ready = self._ordered(spread.first_order()), False
        while True:
            if book.stale:  # back before the next claim: its reap would count them failed
                yield self._put_back_stale
            with guard:
                dones, want = book.next_claim()
            handed: Claimed | None
            again = False
            if dones or want or from_ready:
                handed, again = yield from self._round(dones, want, me, order, from_ready)
            else:
                with guard:
                    handed = book.hand_out(me)
            if handed is not None:
                return handed
            order, from_ready = self._ordered(spread.first_order()), False
            with guard:
                back = book.to_put_back() if getters.shutting_down or book.closed else []
            if back:
                yield functools.partial(self._put_back, back)
            if getters.shutting_down:
                raise ShutDown(f"this client of queue {self.name!r} is shut down")
            if book.closed:
                raise Empty  # the run ended
            if book.stale or again:
                continue
            with guard:
                if book.unsent_dones:
                    continue
                book.claimant_at_bell = True  # a worker that finishes sends its done itself
            try:
                ready: Any = yield functools.partial(spread.wait, seen, None)
            finally:
                with guard:
                    book.claimant_at_bell = False
            if ready:
                order, from_ready = tuple(ready), True

    def _ordered(self, order: tuple[int, ...]) -> tuple[int, ...]:
        """``order`` with the shards found empty and passed over fewer than
        ``PASSED_OVER`` rounds moved to its end (each part in ``order``'s order)."""
        empty = self._empty
        if not empty:
            return order
        later = tuple(shard for shard in order if empty.get(shard, PASSED_OVER) < PASSED_OVER)
        if not later:
            return order
        return tuple(shard for shard in order if shard not in later) + later

    def _round(
        self,
        dones: list[UnsentDone],
        want: int,
        me: object,
        order: Sequence[int] = (),
        from_ready: bool = False,
    ) -> Flow[tuple[Claimed | None, bool]]:
        """One round (the module's docstring): claims on the shards of
        ``order`` in turn until ``want`` keys came, each with its shard's
        ``dones``, then the other shards' dones in claims of no keys. Returns
        the key handed to ``me`` (None: none, or no worker) and whether to
        claim again at once: a shard has more due than one script releases,
        or the keys taken went to other workers first. ``from_ready``: the
        shards of ``order`` came from ``Spread.wait``; those not looked at
        are ready again. A round that took its keys before it reached every
        shard carries the other shards' dones over (``ClaimBook.carry``: at
        most N - 1 rounds) when rounds are frequent (``CARRY_GAP``), so that
        they ride a later claim on their shard rather than cost a script of
        their own."""
        book, guard, spread = self._book, self._guard, self._spread
        rest = book.by_shard(dones)
        handed: Claimed | None = None
        again = False
        tried = 0
        carry = False
        if me is not None and len(self._shard_parts) > 1:
            began, self._last_round = self._last_round, book.now()
            gap = self._last_round - began
            self._gap = gap if self._gap == math.inf else self._gap + (gap - self._gap) / 8
            carry = self._gap < CARRY_GAP
        try:
            for at, shard in enumerate(order):
                if want <= 0:
                    if carry and at and rest:
                        with guard:
                            rest = book.carry(rest, len(self._shard_parts) - 1)
                    break
                tried = at + 1
                look = False
                try:
                    reply: Any = yield functools.partial(
                        self._claim_one, shard, rest.pop(shard, []), want
                    )
                    taken, due = reply
                    if taken:
                        self._empty.pop(shard, None)
                        want -= taken
                        spread.took(order, at, False)
                        if me is not None and handed is None:
                            with guard:
                                handed = book.hand_out(me)
                            again = again or handed is None
                    else:
                        look = self._shard_parts[shard].getters.look_again(due)
                        if not look:
                            self._empty[shard] = 0
                finally:
                    spread.looked(shard, look)  # its watcher may wait again
                again = again or look
            while rest:
                shard, mine = rest.popitem()
                reply = yield functools.partial(self._claim_one, shard, mine, 0)
        except BaseException:
            with guard:
                book.send_again([done for mine in rest.values() for done in mine])
            raise
        finally:
            if from_ready and tried < len(order):
                spread.give_back(order[tried:])
            elif me is not None:
                self._passed_over(order[tried:])
        return handed, again

    def _passed_over(self, shards: Sequence[int]) -> None:
        """A claimant's round took its keys before it asked ``shards``."""
        empty = self._empty
        for shard in shards:
            if shard in empty:
                empty[shard] += 1

    def _claim_flow(self, shard: int, dones: list[UnsentDone], want: int) -> Flow[Any]:
        """One claim script's call on ``shard`` and its reply in the book: how
        many keys it took, and the due time when it took none."""
        book, guard, driver = self._book, self._guard, self._shard_parts[shard]
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
        if taken:
            driver.holds_taken()
        return len(taken), due

    def _put_back_flow(self, back: list[Claimed], finish: bool) -> Flow[list[bool]]:
        """Claimed keys no worker started: waiting again at once, no failure, in
        one script per shard (per ``MAX_CLAIM`` keys). Whether each was put
        back, in ``back``'s order."""
        put = [True] * len(back)
        shards: dict[int, list[int]] = {}
        for i, (key, _) in enumerate(back):
            shards.setdefault(self._book.shard_of(key), []).append(i)
        for shard, indices in shards.items():
            for part in chunks(indices):
                chunk = [back[i] for i in part]
                held = [(key, hold.token) for key, hold in chunk]
                try:
                    reply: Any = yield functools.partial(self._send_put_back, shard, held)
                    now, done = reply
                except Exception:
                    self._put_back_failed(chunk, finish)
                    continue
                self._put_back_done(chunk, now, done, finish)
                for i, ok in zip(part, done, strict=True):
                    put[i] = ok
        return put

    def _send_put_back(self, shard: int, held: list[tuple[str, int]]) -> Any:
        parts = self._shard_parts[shard]
        return parts.drive(parts.put_back(held))

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
        holds_of = self._book.holds_of
        for (key, hold), ok in zip(back, put, strict=True):
            if not ok:
                holds_of(key).mark_lost(key, hold, now)
            if finish:
                holds_of(key).finish(key, hold)

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
                self._book.holds_of(key).finish(key, hold)

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
                yield from self._round(dones, 0, None)
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
                yield from self._round(dones, 0, None)
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

    def give_up(self, key: str, reason: str, error: BaseException | None = None) -> Any:
        call = functools.partial(self._client.give_up, key, reason, error)
        return self._then(self._forget_first(key), call)

    def abandon(self, key: str) -> None:
        mine = self._mine()
        if mine is not None:
            self._forget_hold(mine.hold)
        self._client.abandon(key)
