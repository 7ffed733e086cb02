"""``AsyncClaims``: ``arun_workers``' batched claims on an ``AsyncRedisWorkQueue``.

The rules are ``_claims.ClaimRules``', driven on the loop (``adrive``). The
workers are tasks, so the book needs no lock. A claim runs in a task of its
own, shielded: a claimant cancelled meanwhile (the workers stopping) loses no
key; what the claim took is put back at the close. The client's claim turn
is taken inside that task, so it is held until the claim's reply has been
read, whoever waits for it. A put-back hit by a cancellation or Ctrl-C
(asyncio.run's second one raises ``KeyboardInterrupt`` in whatever runs,
then cancels every task) is sent once more (it is fenced: applied once),
then the cancellation is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter, deque
from collections.abc import Coroutine
from typing import Any

from .._flow import Flow, adrive
from ._claim_book import Claimed, UnsentDone
from ._claim_rules import ClaimRules, WorkerHold

__all__ = ["AsyncClaims"]


class AsyncClaims(ClaimRules):
    """``arun_workers``' view of an ``AsyncRedisWorkQueue``, as ``Claims`` on the loop."""

    _new_turn = asyncio.Lock
    _turns: list[asyncio.Lock]

    def _start_view(self) -> None:
        self._guard = contextlib.nullcontext()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._workers: dict[object, WorkerHold] = {}  # task -> its hold
        self._tasks: set[asyncio.Task[Any]] = set()  # claims and put-backs in flight
        # A cancellation (or Ctrl-C) that hit a put-back: raised once it was sent again.
        self._cancelled: BaseException | None = None

    async def get(self) -> str:
        """As ``Claims.get``; cancelling it loses no key."""
        me = asyncio.current_task()
        try:
            handed = self._hand_out_now(me)
            if handed is not None and not handed[1].suspect:
                return handed[0]
            return await adrive(self._get_flow(me, handed))
        finally:
            if self._book.stale:
                await self._put_back_stale()

    async def interrupt(self) -> None:
        await self._client.interrupt()
        self._wake_all()

    def close(self, abort: bool) -> Flow[Counter[str]]:
        """The run ended: put back what was claimed and not started, and the
        keys of cancelled handlers, in one script, then send the queued dones
        (a claim whose claimant was cancelled is waited for first). The
        workers are always waited for (``abort`` is the threads')."""
        yield self._claims_ended
        back, _ = self._book.close(False)
        yield functools.partial(self._put_back, back)
        yield from self._send_last_dones()
        return self._book.corrections

    async def _claims_ended(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _mine(self) -> WorkerHold | None:
        return self._workers.get(asyncio.current_task())

    def _set_mine(self, mine: WorkerHold | None) -> None:
        if mine is None:
            self._workers.pop(asyncio.current_task(), None)
        else:
            self._workers[asyncio.current_task()] = mine

    async def _claim_one(self, shard: int, dones: list[UnsentDone], want: int) -> Any:
        """One claim script in a shielded task: what it took goes to the book
        even if the caller is cancelled (the round hands a key to its
        worker after, in the worker's task)."""
        return await self._shielded(self._claim_now(shard, dones, want))

    async def _claim_now(self, shard: int, dones: list[UnsentDone], want: int) -> Any:
        if not want:
            return await adrive(self._claim_flow(shard, dones, 0))
        async with self._turns[shard]:
            want = 0 if self._book.closed else want
            return await adrive(self._claim_flow(shard, dones, want))

    async def _shielded(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Run ``work`` in a task of its own that a cancelled caller does not
        stop (``close`` waits for it); its result."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller saw it, or was cancelled

    async def _put_back(self, back: list[Claimed], finish: bool = True) -> list[bool]:
        return await self._shielded(self._sent_once(self._put_back_flow(back, finish)))  # type: ignore[no-any-return]

    async def _put_back_stale(self) -> None:
        await self._shielded(self._sent_once(self._put_back_stale_flow()))

    async def _sent_once(self, flow: Flow[Any]) -> Any:
        """``flow`` driven, then the cancellation that hit one of its put-backs."""
        result = await adrive(flow)
        cancelled, self._cancelled = self._cancelled, None
        if cancelled is not None:
            raise cancelled
        return result

    async def _send_put_back(self, shard: int, held: list[tuple[str, int]]) -> Any:
        driver = self._shard_parts[shard]
        try:
            return await driver.drive(driver.put_back(held))
        except (asyncio.CancelledError, KeyboardInterrupt) as exc:
            self._cancelled = self._cancelled or exc
            return await driver.drive(driver.put_back(held))

    async def _wait_turn(self) -> None:
        """Wait for a future, counted as blocked in get (as the claimant in
        ``BLPOP`` is; ``Getters.blocked`` changes on the loop's thread only)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        getters = self._getters
        getters.blocked += 1
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # woken, but will not look
                self._wake_one()
            raise
        finally:
            getters.blocked -= 1
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _claimant_left(self, ok: bool) -> None:
        """As ``Claims._claimant_left``: with a key, one waiter, which passes
        the wake-up on (the claimant's task may run the keys itself before
        a woken one steps); without, all (the next claimant, the interrupted)."""
        if ok:
            self._wake_one()
        else:
            self._wake_all()

    def _woken_took(self) -> None:
        self._wake_one()

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _then(self, first: object, call: functools.partial[Any]) -> Any:
        if first is not None:
            await first  # type: ignore[misc]
        return await call()
