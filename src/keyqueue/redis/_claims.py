"""Claims: how ``run_workers`` and ``arun_workers`` take keys from a Redis queue in batches.

A worker process's threads (or tasks) share one ``Claims`` of their queue.
A worker that wants a key takes one the last claim brought, or, if none is
left and no claim is on its way, makes the next claim itself: one ``claim``
script that settles every hold the workers finished since the last one
(``done``, after ``forget`` for a handler that succeeded) and takes as many
keys as workers are waiting, each with its own lease and fencing token. The
others wait for it (client-go's workers wait in ``Get`` the same way). So a
busy process sends about one script per batch instead of three per key, and
never claims more keys than it has free workers.

A finished key's ``done`` is not sent at once: ``release`` queues it, and the
worker's next ``get`` sends it with that claim (group commit). A ``done`` the
server answers ``lost`` (the lease was taken back) is counted again as
``lease_lost`` in ``corrections``, which the runner adds to its tallies.
When no key waits, the claimant waits for the doorbell as ``get`` does; a
worker that finishes meanwhile sends its settle on its own (a claim of no
keys), so no ``done`` waits for an add.

A claimed key not yet handed to a worker when this client shuts down (or the
run ends) is put back at once, without a failure, all of them in one
``put_back`` script. Claimed keys are this client's holds like any other:
renewed with the rest, and lost back to the queue after the lease if the
process dies. One that waited for a worker until its lease was taken back,
or may have run out (the process stalled), is never handed out: it is put
back (a fenced put-back changes nothing if another holder has it).

Claims that take keys are one at a time per client (``_claim_turn``), however
many runs share the client: the server keeps one record per client, of its
last such claim, which the next one hands back if its reply was lost; a
second claim in flight would overwrite the record of the first.

The state is ``ClaimBook``'s, guarded by its condition; ``Claims`` (threads)
and ``AsyncClaims`` (``_async``) add the waiting and the I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .._errors import Empty, ShutDown
from .._outcome import ERRORS, LEASE_LOST
from ._protocol import MAX_CLAIM, Settle, _Hold

if TYPE_CHECKING:
    from ._async import AsyncRedisWorkQueue
    from ._sync import RedisWorkQueue

__all__ = ["AsyncClaims", "ClaimBook", "Claims"]

logger = logging.getLogger("keyqueue")

Pending = tuple[Settle, str]
"""A hold waiting to be settled, and the outcome its worker counted."""


class ClaimBook:
    """What the workers of one client share: keys claimed and not yet handed
    out, holds finished and not yet settled, who waits. No I/O; every method
    is called with ``cond`` held unless it says otherwise."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.buffer: deque[tuple[str, _Hold]] = deque()
        # Holds handed to a worker and not released yet (put back if the run is aborted).
        self.out: dict[_Hold, str] = {}
        # Claimed keys found taken back (or past their lease) before a worker
        # got them: never handed out; put back by whoever found them.
        self.stale: list[tuple[str, _Hold]] = []
        self.closed = False  # the run ended: no more claims take keys, none handed out
        # Holds whose handler was cancelled: put back (added again and released
        # in one script, with the run's end), not settled.
        self.returned: list[tuple[str, _Hold]] = []
        self.pending: list[Pending] = []
        self.hungry = 0  # workers in get without a key (the claimant among them)
        self.claiming = False  # a claimant: in a claim, or waiting for the doorbell
        self.in_bell = False  # the claimant waits for the doorbell
        # Outcomes the workers counted that a late settle changed (lease lost).
        self.corrections: Counter[str] = Counter()

    def take(self, owner: object) -> tuple[str, _Hold] | None:
        """Hand the oldest claimed key (and its hold) to the worker ``owner``;
        None if there is none (nor any once this client shuts down or the run
        ended). A claimed key whose lease was taken back, or has been held
        longer than a lease (the process stalled, renewals with it: it may
        have run out), is set aside in ``stale`` instead, never handed out."""
        buffer, queue = self.buffer, self.queue
        if not buffer or self.closed or queue.shutting_down:
            return None
        now = queue._local(time.monotonic())
        while buffer:
            key, hold = buffer.popleft()
            if hold.lost or now - hold.started >= queue.lease:
                self.stale.append((key, hold))
                continue
            hold.owner = owner
            self.out[hold] = key
            self.hungry -= 1
            queue._started(key, hold)  # its handler starts: the server learns it next
            return key, hold
        return None

    def next_claim(self) -> tuple[list[Pending], int]:
        """The holds to settle (at most ``MAX_CLAIM``: the rest go with the
        next) and how many keys to take in the next claim."""
        pending, self.pending = self.pending[:MAX_CLAIM], self.pending[MAX_CLAIM:]
        want = 0 if self.queue.shutting_down or self.closed else self.hungry - len(self.buffer)
        return pending, max(want, 0)

    def unsent(self, pending: list[Pending]) -> None:
        """A claim raised: its settles are sent again with the next one (as asked again)."""
        self.pending[:0] = pending

    def settled(self, pending: list[Pending], statuses: list[str]) -> None:
        """Count the settles the server answered ``lost``: their outcome becomes lease_lost."""
        for ((key, _, _), outcome), status in zip(pending, statuses, strict=True):
            if status == "lost" and outcome != LEASE_LOST:
                _warn_lost(key, "its done found the lease taken back")
                self.corrections[outcome] -= 1
                self.corrections[LEASE_LOST] += 1

    def unclaimed(self) -> list[tuple[str, _Hold]]:
        """Take every claimed key not handed out, stale ones too, and those of
        cancelled handlers (to put back)."""
        back = self.returned + self.stale + list(self.buffer)
        self.buffer.clear()
        self.stale, self.returned = [], []
        return back

    def close(self, abort: bool) -> tuple[list[tuple[str, _Hold]], list[tuple[str, _Hold]]]:
        """The run ended: no claim takes keys from now on. Returns the claimed
        keys to put back and, if ``abort`` (Ctrl-C again: the handlers still
        running are not waited for), the holds of those handlers, to put back
        too (marked lost: their handlers' later calls on them change nothing)."""
        self.closed = True
        running: list[tuple[_Hold, str]] = []
        if abort:
            running, self.out = list(self.out.items()), {}
        queue = self.queue
        with queue._lock:
            for hold, _ in running:
                hold.lost = True
        return self.unclaimed(), [(key, hold) for hold, key in running]

    def release(self, key: str, hold: _Hold, forget: bool, outcome: str, back: bool = False) -> str:
        """Queue a finished hold's settle (``back``: its put-back instead, a
        cancelled handler's); the outcome to count."""
        queue = self.queue
        if self.out.pop(hold, None) is None and self.closed:
            queue._finish(key, hold)  # put back when the run was aborted
            return outcome
        with queue._lock:
            live = queue._holds.get(key) is hold or hold in queue._lost_holds.get(key, ())
        if not live:  # ended already (the handler called done itself): as done raising
            logger.error("key %r: done raised; going on: the key is not held any more", key)
            return ERRORS
        if hold.lost:  # a renewal learned it: the server would answer lost
            self.queue._finish(key, hold)
            if outcome != LEASE_LOST:
                _warn_lost(key, "its lease was taken back")
            return LEASE_LOST
        if back:
            self.returned.append((key, hold))
        else:
            self.pending.append(((key, hold, forget), outcome))
        return outcome


class _Mine(threading.local):
    """A worker thread's hold: its key, and whether its handler asked to forget it."""

    key: str | None = None
    hold: _Hold | None = None
    forget = False


_TURN_MADE = threading.Lock()  # guards making a client's claim turn


def _turn(queue: Any, make: Callable[[], Any]) -> Any:
    """The client's turn to make a claim that takes keys (one at a time per
    client, whatever the runs on it): ``make()`` the first time."""
    if queue._claim_turn is None:
        with _TURN_MADE:
            if queue._claim_turn is None:
                queue._claim_turn = make()
    return queue._claim_turn


class _View:
    """What both views share: the queue, the book, and the queue's name,
    connection errors and shutdown flag (the runner reads them)."""

    def __init__(self, queue: Any, fold_forget: bool) -> None:
        self._queue = queue
        self._book = ClaimBook(queue)
        # A forget of a worker's key goes with its done (one script) unless the
        # client's forget was replaced: then that runs, as the user asked.
        self._fold_forget = fold_forget
        self.name: str = queue.name
        self.connection_errors: tuple[type[BaseException], ...] = queue.connection_errors
        self.said_errors: tuple[type[BaseException], ...] = queue.said_errors

    @property
    def shutting_down(self) -> bool:
        return bool(self._queue.shutting_down)

    @property
    def corrections(self) -> Counter[str]:
        """Outcome counts a late settle changed (add them to the run's tallies)."""
        return self._book.corrections

    def _put_back_done(
        self, back: list[tuple[str, _Hold]], now: float, put: list[bool], finish: bool
    ) -> None:
        """After a put-back: a hold whose key was not put back had been taken
        back (LEASE_LOST, once); each is finished unless the run was aborted
        under its handler (``finish`` False: its handler releases it)."""
        queue = self._queue
        for (key, hold), ok in zip(back, put, strict=True):
            if not ok:
                queue._mark_lost(key, hold, now)
            if finish:
                queue._finish(key, hold)

    def _put_back_failed(self, back: list[tuple[str, _Hold]], finish: bool) -> None:
        """A put-back raised (in an except block): the keys come back when
        their leases run out (no longer renewed)."""
        queue = self._queue
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
                queue._finish(key, hold)


def _warn_stale(name: str, stale: list[tuple[str, _Hold]], put: list[bool]) -> None:
    for (key, _), ok in zip(stale, put, strict=True):
        how = "put back" if ok else "its lease was taken back, another holder may have it"
        logger.warning(
            "keyqueue %r: claimed key %r waited for a worker past its lease (this "
            "process stalled?); not handed out: %s",
            name,
            key,
            how,
        )


def _chunks(back: list[tuple[str, _Hold]]) -> list[list[tuple[str, _Hold]]]:
    return [back[i : i + MAX_CLAIM] for i in range(0, len(back), MAX_CLAIM)]


class Claims(_View):
    """``run_workers``' view of a ``RedisWorkQueue``: ``get`` takes from claims,
    ``release`` settles in the next one. The rest is the queue's."""

    _queue: RedisWorkQueue

    def __init__(self, queue: RedisWorkQueue, fold_forget: bool = True) -> None:
        super().__init__(queue, fold_forget)
        self._cond = threading.Condition()
        self._mine = _Mine()
        self._turn: threading.Lock = _turn(queue, threading.Lock)

    # -- taking keys -----------------------------------------------------------------

    def get(self) -> str:
        """A key for this worker: claimed, or from the last claim. Raises ``Empty``
        once interrupted, ``ShutDown`` once the client is shut down (after
        settling what was finished and putting back what was claimed). A key
        whose last holder died holding it (a suspect) has its start reported
        first, one round trip; one found taken back meanwhile is skipped."""
        try:
            while True:
                key = self._get()
                hold = self._mine.hold
                if hold is None or not hold.suspect or self._reported(key, hold):
                    return key
        finally:
            if self._book.stale:
                self._put_back_stale()

    def _reported(self, key: str, hold: _Hold) -> bool:
        """A suspect's start, reported before its handler runs (``_op_start``).
        False if its lease was taken back: it is not this worker's (finished)."""
        queue = self._queue
        try:
            start = queue._op_start(key, hold)
            if start if isinstance(start, bool) else queue._drive(start):
                return True
        except BaseException:
            self._drop(hold)
            raise
        self._drop(hold)
        return False

    def _drop(self, hold: _Hold) -> None:
        """A suspect's hold ended before its handler ran (``_op_start`` finished it)."""
        self._mine.key = self._mine.hold = None
        with self._cond:
            self._book.out.pop(hold, None)

    def _get(self) -> str:
        queue, book = self._queue, self._book
        seen = queue._interrupts
        with self._cond:
            book.hungry += 1
            try:
                key = self._wait(seen)
            except BaseException:
                book.hungry -= 1
                raise
        if key is None:
            try:
                key = self._lead(seen)
            except BaseException:
                with self._cond:
                    book.hungry -= 1
                    book.claiming = book.in_bell = False
                    self._cond.notify_all()  # the next claimant, or the interrupted
                raise
            with self._cond:
                book.claiming = book.in_bell = False
                # One waiter per key left, and one to make the next claim.
                self._cond.notify(len(book.buffer) + 1)
        mine = self._mine
        (mine.key, mine.hold), mine.forget = key, False
        return mine.key

    def _wait(self, seen: int) -> tuple[str, _Hold] | None:
        """Under the condition: a claimed key, or None to make the next claim."""
        book = self._book
        while True:
            handed = book.take(threading.get_ident())
            if handed is not None:
                return handed
            if self._queue._interrupts != seen or book.closed:
                raise Empty
            if not book.claiming:
                book.claiming = True
                return None
            if book.in_bell and book.pending:  # the claimant waits for an add: settle now
                pending, _ = book.next_claim()
                self._cond.release()
                try:
                    self._claim(pending, 0)
                finally:
                    self._cond.acquire()
                continue
            self._idle(1)  # counted as blocked in get, as the claimant in BLPOP is
            try:
                self._cond.wait()
            finally:
                self._idle(-1)

    def _idle(self, n: int) -> None:
        queue = self._queue
        with queue._lock:
            queue._getters += n

    def _claim(self, pending: list[Pending], want: int) -> tuple[list[Any], float | None]:
        """One claim script (no condition held): the keys taken and the due
        time. One that takes keys waits for the client's turn."""
        if not want:
            return self._claim_now(pending, 0)
        with self._turn:
            with self._cond:
                if self._book.closed:
                    want = 0
            return self._claim_now(pending, want)

    def _claim_now(self, pending: list[Pending], want: int) -> tuple[list[Any], float | None]:
        queue = self._queue
        try:
            op = queue._op_claim(want, [settle for settle, _ in pending], time.monotonic())
            taken, statuses, due = queue._drive(op)
        except BaseException:
            with self._cond:
                self._book.unsent(pending)
            raise
        with self._cond:
            self._book.settled(pending, statuses)
        return taken, due

    def _lead(self, seen: int) -> tuple[str, _Hold]:
        """The claimant: claim until a key comes (waiting for the doorbell
        between claims that found none)."""
        queue, book = self._queue, self._book
        while True:
            if book.stale:  # back before the next claim: its reap would count them failed
                self._put_back_stale()
            with self._cond:
                pending, want = book.next_claim()
            taken, due = self._claim(pending, want) if pending or want else ([], None)
            with self._cond:
                book.buffer.extend(taken)
                handed = book.take(threading.get_ident())
                if handed is not None:
                    return handed
                back = book.unclaimed() if queue.shutting_down or book.closed else []
            if back:
                self._put_back(back)
            if queue.shutting_down:
                raise ShutDown(f"this client of queue {queue.name!r} is shut down")
            if book.closed:
                raise Empty  # the run was aborted
            if book.stale:
                continue
            if queue._look_again(due):
                continue
            with self._cond:
                if book.pending:
                    continue
                book.in_bell = True  # from now on a worker that finishes settles itself
            queue._wait_for_bell(seen, None)
            with self._cond:
                book.in_bell = False

    def _put_back(self, back: list[tuple[str, _Hold]], finish: bool = True) -> list[bool]:
        """Claimed keys no worker started: waiting again at once, no failure, in
        one script (per ``MAX_CLAIM`` keys). Whether each was put back."""
        queue, put = self._queue, []
        for chunk in _chunks(back):
            try:
                now, done = queue._drive(queue._op_put_back([(k, h.token) for k, h in chunk]))
            except Exception:
                self._put_back_failed(chunk, finish)
                done = [True] * len(chunk)
            else:
                self._put_back_done(chunk, now, done, finish)
            put += done
        return put

    def _put_back_stale(self) -> None:
        with self._cond:
            stale, self._book.stale = self._book.stale, []
        if stale:
            _warn_stale(self.name, stale, self._put_back(stale))

    # -- outcomes --------------------------------------------------------------------

    def release(self, key: str, outcome: str) -> str:
        """This worker finished ``key``: its done (after its forget, if asked)
        goes with the next claim. Returns the outcome to count."""
        mine = self._mine
        hold = mine.hold
        if mine.key != key or hold is None:
            raise ValueError(f"done({key!r}): key is not being processed by this worker")
        mine.key, mine.hold = None, None
        with self._cond:
            return self._book.release(key, hold, mine.forget, outcome)

    def forget(self, key: str) -> None:
        """For this worker's key, forgotten with its done (one script); else the queue's."""
        if self._mine.key == key and self._fold_forget:
            self._mine.forget = True
        else:
            self._queue.forget(key)

    def _forgotten(self, key: str) -> None:
        """Apply a forget asked for this worker's key before another outcome call."""
        if self._mine.key == key and self._mine.forget:
            self._mine.forget = False
            self._queue.forget(key)

    def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        self._forgotten(key)
        self._queue.add_after(key, seconds, priority)

    def add_rate_limited(self, key: str, priority: int = 0) -> None:
        self._forgotten(key)
        self._queue.add_rate_limited(key, priority)

    def retry(self, key: str) -> bool:
        self._forgotten(key)
        return self._queue.retry(key)

    def abandon(self, key: str) -> None:
        hold = self._mine.hold
        self._mine.key = self._mine.hold = None
        if hold is not None:
            with self._cond:
                self._book.out.pop(hold, None)
        self._queue.abandon(key)

    def interrupt(self) -> None:
        """Wake every worker waiting for a key: each raises ``Empty``."""
        self._queue.interrupt()
        with self._cond:
            self._cond.notify_all()

    def leave(self) -> None:
        """A worker stops: send what is finished unless a claim will carry it."""
        while True:
            with self._cond:
                if not self._book.pending or (self._book.claiming and not self._book.in_bell):
                    return
                pending, _ = self._book.next_claim()
            try:
                self._claim(pending, 0)
            except Exception:
                logger.warning(
                    "keyqueue %r: settling finished keys failed", self.name, exc_info=True
                )
                return

    def close(self, abort: bool = False) -> None:
        """The run ended: settle what is left, put back what was claimed (one
        script). ``abort`` (Ctrl-C again: the workers were not waited for):
        the keys of handlers still running are put back too. Waits (up to a
        lease) for a claim that takes keys in flight, so none comes after."""
        turn = self._turn.acquire(timeout=self._queue.lease)
        try:
            with self._cond:
                back, running = self._book.close(abort)
        finally:
            if turn:
                self._turn.release()
        while True:
            with self._cond:
                pending, _ = self._book.next_claim()
            if not pending:
                break
            try:
                self._claim(pending, 0)
            except Exception:
                with self._cond:
                    _unsettled(self._queue, self._book)
                break
        self._put_back(back)
        self._put_back(running, finish=False)


class AsyncClaims(_View):
    """``arun_workers``' view of an ``AsyncRedisWorkQueue``, as ``Claims`` on the
    loop: the workers are tasks, so the book needs no lock. A claim runs in a
    task of its own, shielded: a claimant cancelled meanwhile (the workers
    stopping) loses no key; what the claim took is put back at the close.
    The client's turn is taken inside that task, so it is held until the
    claim's reply has been read, whoever waits for it."""

    _queue: AsyncRedisWorkQueue

    def __init__(self, queue: AsyncRedisWorkQueue, fold_forget: bool = True) -> None:
        super().__init__(queue, fold_forget)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._mine: dict[object, list[Any]] = {}  # task -> [key, hold, forget, put back]
        self._tasks: set[asyncio.Task[Any]] = set()  # claims and put-backs in flight
        self._turn: asyncio.Lock = _turn(queue, asyncio.Lock)

    async def get(self) -> str:
        """As ``Claims.get``; cancelling it loses no key."""
        try:
            while True:
                key = await self._get()
                hold = self._mine[asyncio.current_task()][1]
                if not hold.suspect or await self._reported(key, hold):
                    return key
        finally:
            if self._book.stale:
                await self._shielded(self._put_back_stale())

    async def _reported(self, key: str, hold: _Hold) -> bool:
        """As ``Claims._reported``."""
        queue = self._queue
        try:
            start = queue._op_start(key, hold)
            if start if isinstance(start, bool) else await queue._drive(start):
                return True
        except BaseException:
            self._drop(hold)
            raise
        self._drop(hold)
        return False

    def _drop(self, hold: _Hold) -> None:
        self._mine.pop(asyncio.current_task(), None)
        self._book.out.pop(hold, None)

    async def _get(self) -> str:
        queue, book = self._queue, self._book
        seen = queue._interrupts
        me = asyncio.current_task()
        book.hungry += 1
        handed: tuple[str, _Hold] | None = None
        try:
            while handed is None:
                handed = book.take(me)
                if handed is not None:
                    break
                if queue._interrupts != seen or book.closed:
                    raise Empty
                elif not book.claiming:
                    book.claiming = True
                    try:
                        handed = await self._lead(seen, me)
                    finally:
                        book.claiming = book.in_bell = False
                        self._wake_all()  # the next claimant, or the interrupted
                elif book.in_bell and book.pending:  # the claimant waits for an add
                    pending, _ = book.next_claim()
                    await self._claim(pending, 0)
                else:
                    await self._wait()
        except BaseException:
            if handed is None:
                book.hungry -= 1
            raise
        self._mine[me] = [handed[0], handed[1], False, False]
        return handed[0]

    async def _wait(self) -> None:
        queue = self._queue
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        queue._getters += 1  # counted as blocked in get, as the claimant in BLPOP is
        try:
            await waiter
        finally:
            queue._getters -= 1
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _wake_all(self) -> None:
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _claim(self, pending: list[Pending], want: int) -> float | None:
        """One claim script in a shielded task: what it took goes to the book
        even if the caller is cancelled. Returns the due time."""
        return await self._shielded(self._claim_now(pending, want))  # type: ignore[no-any-return]

    async def _shielded(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Run ``work`` in a task of its own that a cancelled caller does not
        stop (``aclose`` waits for it); its result."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return await asyncio.shield(task)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller saw it, or was cancelled

    async def _claim_now(self, pending: list[Pending], want: int) -> float | None:
        if not want:
            return await self._claim_call(pending, 0)
        async with self._turn:
            return await self._claim_call(pending, 0 if self._book.closed else want)

    async def _claim_call(self, pending: list[Pending], want: int) -> float | None:
        queue, book = self._queue, self._book
        try:
            op = queue._op_claim(want, [settle for settle, _ in pending], time.monotonic())
            taken, statuses, due = await queue._drive(op)
        except BaseException:
            book.unsent(pending)
            raise
        book.settled(pending, statuses)
        book.buffer.extend(taken)
        if taken and queue._no_holds is not None:
            queue._no_holds.clear()
        return due

    async def _lead(self, seen: int, me: object) -> tuple[str, _Hold]:
        queue, book = self._queue, self._book
        while True:
            if book.stale:  # back before the next claim: its reap would count them failed
                await self._shielded(self._put_back_stale())
            pending, want = book.next_claim()
            due = await self._claim(pending, want) if pending or want else None
            handed = book.take(me)
            if handed is not None:
                return handed
            if queue.shutting_down or book.closed:
                await self._shielded(self._put_back(book.unclaimed()))
                if queue.shutting_down:
                    raise ShutDown(f"this client of queue {queue.name!r} is shut down")
                raise Empty  # the run ended
            if queue._look_again(due) or book.pending or book.stale:
                continue
            book.in_bell = True  # from now on a worker that finishes settles itself
            try:
                await queue._wait_for_bell(seen, None)
            finally:
                book.in_bell = False

    async def _put_back(self, back: list[tuple[str, _Hold]], finish: bool = True) -> list[bool]:
        """As ``Claims._put_back``: one script (per ``MAX_CLAIM`` keys). A
        cancellation or Ctrl-C meanwhile (asyncio.run's second one raises
        KeyboardInterrupt in whatever runs, then cancels every task) sends it
        once more (it is fenced: applied once), then is raised."""
        queue, put = self._queue, []
        cancelled: BaseException | None = None
        for chunk in _chunks(back):
            held = [(k, h.token) for k, h in chunk]
            try:
                try:
                    now, done = await queue._drive(queue._op_put_back(held))
                except (asyncio.CancelledError, KeyboardInterrupt) as exc:
                    cancelled = exc
                    now, done = await queue._drive(queue._op_put_back(held))
            except Exception:
                self._put_back_failed(chunk, finish)
                done = [True] * len(chunk)
            else:
                self._put_back_done(chunk, now, done, finish)
            put += done
        if cancelled is not None:
            raise cancelled
        return put

    async def _put_back_stale(self) -> None:
        stale, self._book.stale = self._book.stale, []
        if stale:
            _warn_stale(self.name, stale, await self._put_back(stale))

    # -- outcomes --------------------------------------------------------------------

    def _held(self, key: str) -> list[Any] | None:
        mine = self._mine.get(asyncio.current_task())
        return mine if mine is not None and mine[0] == key else None

    def release(self, key: str, outcome: str) -> str:
        """As ``Claims.release``: no I/O here."""
        mine = self._held(key)
        if mine is None:
            raise ValueError(f"done({key!r}): key is not being processed by this worker")
        del self._mine[asyncio.current_task()]
        return self._book.release(key, mine[1], mine[2], outcome, back=mine[3])

    def requeue(self, key: str) -> bool:
        """This worker's handler of ``key`` was cancelled: its release puts the
        key back (added again and released in one script, at the run's end,
        so no cancellation can come between the two). False if the worker
        holds no such key (then ``add`` it)."""
        mine = self._held(key)
        if mine is None:
            return False
        mine[3] = True
        return True

    async def forget(self, key: str) -> None:
        mine = self._held(key)
        if mine is not None and self._fold_forget:
            mine[2] = True
        else:
            await self._queue.forget(key)

    async def _forgotten(self, key: str) -> None:
        mine = self._held(key)
        if mine is not None and mine[2]:
            mine[2] = False
            await self._queue.forget(key)

    async def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        await self._forgotten(key)
        await self._queue.add_after(key, seconds, priority)

    async def add_rate_limited(self, key: str, priority: int = 0) -> None:
        await self._forgotten(key)
        await self._queue.add_rate_limited(key, priority)

    async def retry(self, key: str) -> bool:
        await self._forgotten(key)
        return await self._queue.retry(key)

    async def add(self, key: str) -> None:
        """A cancelled handler's key, added again (``arun_workers``)."""
        await self._queue.add(key)

    def abandon(self, key: str) -> None:
        mine = self._mine.pop(asyncio.current_task(), None)
        if mine is not None:
            self._book.out.pop(mine[1], None)
        self._queue.abandon(key)

    async def interrupt(self) -> None:
        await self._queue.interrupt()
        self._wake_all()

    async def leave(self) -> None:
        """A worker stops: send what is finished unless a claim will carry it."""
        book = self._book
        while book.pending and not (book.claiming and not book.in_bell):
            pending, _ = book.next_claim()
            try:
                await self._claim(pending, 0)
            except Exception:
                logger.warning(
                    "keyqueue %r: settling finished keys failed", self.name, exc_info=True
                )
                return

    async def aclose(self) -> None:
        """The run ended: put back what was claimed and not started, and the
        keys of cancelled handlers, in one script, then settle what is left (a
        claim whose claimant was cancelled is waited for first)."""
        book = self._book
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        back, _ = book.close(False)
        await self._shielded(self._put_back(back))
        while book.pending:
            pending, _ = book.next_claim()
            try:
                await self._claim(pending, 0)
            except Exception:
                _unsettled(self._queue, book)


def _warn_lost(key: str, how: str) -> None:
    """The runner's one warning for a lease lost (``_outcome``'s words), and how it was learned."""
    logger.warning("key %r: lease lost, another holder may have it; not retrying: %s", key, how)


def _unsettled(queue: Any, book: ClaimBook) -> None:
    """The last settles failed (in an except block): not released (their
    leases run out), counted as errors."""
    logger.error(
        "keyqueue %r: settling %d finished key(s) failed; they are not released "
        "(their leases run out and they are handed out again)",
        queue.name,
        len(book.pending),
        exc_info=True,
    )
    for (key, hold, _), outcome in book.pending:
        hold.unsure = True  # not renewed: its lease runs out
        queue._finish(key, hold)
        book.corrections[outcome] -= 1
        book.corrections[ERRORS] += 1
    book.pending.clear()
