"""How a sharded client's getters wait for any of its shards: on threads, on asyncio.

Theory of operation
-------------------
A ``BLPOP`` on several keys needs them in one slot, so one call cannot wait
on N shards' doorbells. A sharded client keeps one *watcher* per shard (a
daemon thread, or a task), running only while one of its getters waits.
The watcher is the shard's one leader getter: it waits in that shard's
``Doorbell.wait`` (``BLPOP`` on the shard's bell and the client's wake-up
list of that shard, in slices; the look-at time of the shard's getters) and
takes no key itself: when it returns (the bell rang, or a look is due) it
marks its shard *ready* and wakes one getter, which runs the get script on
the ready shards, the caller's own call (so the hold is the caller's). A
watcher waits again only once a getter has looked at its shard (the get
script ran: the shard's look-at time moved on).

A getter first looks at every shard, from a cursor that moves past the
shard that gave the last key (``rotations``), so the shards with work are
taken from in turn and a full shard does not starve an emptier one; then
it waits until a shard is ready and looks at the ready ones. The ready
shards it did not look at (it took a key first) stay ready for the next
getter.

When the last getter stops waiting, the watchers stand down: each shard's
interrupt count is raised (no command sent), so a watcher leaves at the end
of its ``BLPOP`` slice, and a bell it took meanwhile is pushed back (the
key it rang for is another client's). A watcher that returns when no
getter waits any more pushes its bell back too. Idle, a client costs each
shard what one unsharded client costs one queue: one ``BLPOP`` a slice and
one get script a lease.

``run_workers``' claims (``_claim_rules``) wait the same way: their
claimant is the client's one getter that waits, and it claims from the
ready shards.

``shutdown`` reaches the watchers through their shards (each shut down,
its wake-up list rung); ``interrupt`` wakes this client's getters only.
A watcher that fails (a connection error) hands the error to one getter,
which raises it; the next wait starts a new watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from .._errors import Empty, ShutDown
from ._bell import wait_until

__all__ = ["AsyncShardWaits", "ShardWaits", "rotations"]

logger = logging.getLogger("keyqueue")


def rotations(shards: int) -> tuple[tuple[int, ...], ...]:
    """For each cursor ``c``, the shards in the order a getter looks: ``c``, ``c + 1``, ..."""
    return tuple(tuple(range(c, shards)) + tuple(range(c)) for c in range(shards))


class _Waits:
    """What both variants keep: the ready shards, the waiting getters, the
    interrupts, the watchers. Guarded by ``lock``."""

    def __init__(self, shards: Sequence[Any], lock: Any) -> None:
        self.shards = shards
        self.lock = lock
        self.orders = rotations(len(shards))
        self.cursor = 0  # the shard a getter looks at first (moves past each key taken)
        self.ready: set[int] = set()  # shards whose watcher returned, no getter looked yet
        self.looking: set[int] = set()  # ready shards a getter is looking at now
        self.waiting = 0  # getters waiting for a ready shard
        self.interrupts = 0  # interrupt() calls: a get begun before one raises Empty
        self.shut = False  # this client's shutdown was called
        self.error: BaseException | None = None  # a watcher's, for the next getter to raise
        self.watching = [False] * len(shards)  # shard i's watcher runs

    def grow(self) -> None:
        """The client made more shards (a reshard adds them): getters look at
        them too, and while some wait, a watcher watches each new one."""
        with self.lock:
            count = len(self.shards)
            self.orders = rotations(count)
            self.watching.extend([False] * (count - len(self.watching)))
            if self.waiting:
                self._watch()

    def _watch(self) -> None:
        raise NotImplementedError

    def first_order(self) -> tuple[int, ...]:
        """Every shard, from the cursor."""
        return self.orders[self.cursor % len(self.orders)]

    def took(self, order: Sequence[int], at: int, from_ready: bool) -> None:
        """A getter took a key from ``order[at]``: the cursor moves past that
        shard; the ready shards of ``order`` it did not look at stay ready."""
        self.cursor = order[at] + 1
        if from_ready and at + 1 < len(order):
            self.give_back(order[at + 1 :])

    def give_back(self, shards: Sequence[int]) -> None:
        """Ready shards a getter (or a claimant) did not look at: ready again."""
        with self.lock:
            self.looking.difference_update(shards)
            self.ready.update(shards)
            self._notify()

    def looked(self, shard: int, again: bool) -> None:
        """A getter ran the get script on ``shard`` (``again``: more came due
        than one script releases: it stays ready)."""
        if not self.looking and not again:
            return
        with self.lock:
            self.looking.discard(shard)
            if again:
                self.ready.add(shard)
            self._notify()

    def check(self, seen: int) -> None:
        """Lock held: ``ShutDown`` once shut down, ``Empty`` once interrupted
        since ``seen``, a watcher's error."""
        if self.shut:
            raise ShutDown("this client of the sharded queue is shut down")
        if self.interrupts != seen:
            raise Empty
        error = self.error
        if error is not None:
            self.error = None
            raise error

    def take_ready(self) -> tuple[int, ...]:
        """Lock held: the ready shards, now being looked at."""
        ready = tuple(self.ready)
        self.ready.clear()
        self.looking.update(ready)
        return ready

    def stand_down(self) -> None:
        """Lock held, no getter waits: each watcher leaves at its slice's end."""
        for i, shard in enumerate(self.shards):
            if self.watching[i]:
                getters = shard._waiting
                with getters.lock:
                    getters.interrupts += 1

    def settled(self, i: int) -> bool:
        """Lock held: watcher ``i`` may wait again (its shard neither ready nor being looked at)."""
        return i not in self.ready and i not in self.looking

    def returned(self, i: int) -> bool:
        """Lock held: watcher ``i``'s wait returned; True if a getter will
        look (else the bell it may have taken is to be pushed back)."""
        if self.waiting and not self.shut:
            self.ready.add(i)
            self._notify()
            return True
        return False

    def failed(self, exc: BaseException) -> None:
        """Lock held: a watcher failed; the next getter raises ``exc``."""
        if self.waiting:
            self.error = exc
        self._notify()

    def _notify(self) -> None:
        raise NotImplementedError


class ShardWaits(_Waits):
    """The threading variant: watchers are daemon threads, getters wait on a condition."""

    def __init__(self, shards: Sequence[Any], name: str) -> None:
        super().__init__(shards, threading.Lock())
        self.name = name
        self.changed = threading.Condition(self.lock)  # notified: a shard ready, shut, interrupted

    def _notify(self) -> None:
        self.changed.notify_all()

    def wait(self, seen: int, deadline: float | None) -> tuple[int, ...]:
        """Block until a shard is ready; return the ready shards (this getter
        looks at them). ``Empty`` at ``deadline`` (monotonic) or once
        interrupted; ``ShutDown`` once shut down; a watcher's error."""
        with self.changed:
            self.check(seen)
            self.waiting += 1
            try:
                self._watch()
                while not self.ready:
                    if not wait_until(self.changed, deadline):
                        raise Empty
                    self.check(seen)
                return self.take_ready()
            finally:
                self.waiting -= 1
                if not self.waiting:
                    self.stand_down()

    def interrupt(self) -> None:
        """Wake every waiting getter: each raises ``Empty``."""
        with self.changed:
            self.interrupts += 1
            self.changed.notify_all()

    def shutdown(self) -> None:
        """Wake every waiting getter: each raises ``ShutDown``."""
        with self.changed:
            self.shut = True
            self.changed.notify_all()

    def _watch(self) -> None:
        for i, running in enumerate(self.watching):
            if not running:
                self.watching[i] = True
                thread = threading.Thread(
                    target=self._watcher, args=(i,), name=f"keyqueue-watch-{self.name}/{i}"
                )
                thread.daemon = True
                thread.start()

    def _watcher(self, i: int) -> None:
        shard = self.shards[i]
        try:
            while True:
                with self.changed:
                    while self.waiting and not self.settled(i):
                        self.changed.wait()
                    if not self.waiting or self.shut:
                        return
                try:
                    shard._doorbell.wait(shard._waiting.interrupts, None)
                except Empty:  # stood down, a bell it took pushed back
                    continue
                with self.changed:
                    if self.returned(i):
                        continue
                shard._client.rpush(shard._bell, "1")  # the key it rang for is someone's
                return
        except ShutDown:
            pass
        except BaseException as exc:
            with self.changed:
                self.failed(exc)
        finally:
            with self.changed:
                self.watching[i] = False


class AsyncShardWaits(_Waits):
    """The asyncio variant: watchers are tasks, getters wait on futures. The
    lock is a no-op: everything runs on the client's loop."""

    def __init__(self, shards: Sequence[Any], spawn: Callable[[Any], None]) -> None:
        super().__init__(shards, contextlib.nullcontext())
        self.spawn = spawn  # the facade's: run a task of its own, awaited at close
        self.futures: list[asyncio.Future[None]] = []  # waiting getters and watchers

    def _notify(self) -> None:
        futures, self.futures = self.futures, []
        for future in futures:
            if not future.done():
                future.set_result(None)

    async def _changed(self, deadline: float | None) -> bool:
        """Wait for a change; False once ``deadline`` (monotonic) passed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.futures.append(future)
        try:
            if deadline is None:
                await future
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await future
            return True
        finally:
            if not future.done():
                future.cancel()

    async def wait(self, seen: int, deadline: float | None) -> tuple[int, ...]:
        """As ``ShardWaits.wait``, on the loop."""
        self.check(seen)
        self.waiting += 1
        try:
            self._watch()
            while not self.ready:
                if not await self._changed(deadline):
                    raise Empty
                self.check(seen)
            return self.take_ready()
        finally:
            self.waiting -= 1
            if not self.waiting:
                self.stand_down()

    def interrupt(self) -> None:
        self.interrupts += 1
        self._notify()

    def shutdown(self) -> None:
        self.shut = True
        self._notify()

    def _watch(self) -> None:
        for i, running in enumerate(self.watching):
            if not running:
                self.watching[i] = True
                self.spawn(self._watcher(i))

    async def _watcher(self, i: int) -> None:
        shard = self.shards[i]
        try:
            while True:
                while self.waiting and not self.settled(i):
                    await self._changed(None)
                if not self.waiting or self.shut:
                    return
                try:
                    await shard._doorbell.wait(shard._waiting.interrupts, None)
                except Empty:
                    continue
                if self.returned(i):
                    continue
                await shard._client.rpush(shard._bell, "1")
                return
        except (ShutDown, asyncio.CancelledError):
            pass
        except (redis.exceptions.RedisError, OSError) as exc:
            self.failed(exc)
        finally:
            self.watching[i] = False
