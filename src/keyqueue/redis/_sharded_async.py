"""``AsyncShardedRedisWorkQueue``: ``AsyncRedisWorkQueue(name, shards=N)`` for N > 1.

The asyncio twin of ``_sharded_sync``: a facade over N
``AsyncRedisWorkQueue`` shard clients (``_sharded``), each per-key call its
key's shard's, in the calling task; ``get`` waits for any shard
(``_shard_waits.AsyncShardWaits``: watcher tasks); ``stats`` and
``snapshot`` read the shards concurrently and add them up (``_shards``).
``arun_workers`` claims keys in batches per shard (``_async_claims``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import Any, TypeVar

import redis
import redis.asyncio

from .._checks import check_timeout
from .._dead import DEAD_LIMIT, DeadKey
from .._errors import Empty
from .._metrics import QueueGauges
from .._snapshot import Snapshot
from .._source import batch_with
from . import _mover as mover
from ._async import AsyncRedisWorkQueue
from ._async_claims import AsyncClaims
from ._claim_book import ClaimParts
from ._connection import aclose_client
from ._ends import drain_timeout
from ._replies import RedisStats
from ._resharding import ROUTE, KeyMoved, MapChanged, ask_again, refused, routed, tag
from ._shard_waits import AsyncShardWaits
from ._sharded import ShardedParts
from ._shards import check_shards, merge_dead, merge_gauges, merge_snapshots, merge_stats

__all__ = ["AsyncShardedRedisWorkQueue"]

T = TypeVar("T")


class AsyncShardedRedisWorkQueue(ShardedParts, AsyncRedisWorkQueue):
    """``AsyncRedisWorkQueue(name, shards=N)`` with N > 1: as
    ``ShardedRedisWorkQueue``, its methods coroutines as
    ``AsyncRedisWorkQueue``'s."""

    _base = AsyncRedisWorkQueue

    @staticmethod
    def _shard_claim_parts(shard: AsyncRedisWorkQueue) -> ClaimParts:
        """A shard's claim machinery, as a sharded client's claims use it."""
        return shard._claim_parts(
            shard._drive,
            functools.partial(shard._doorbell.wait, deadline=None),
            shard._ends.holds_taken,
        )

    def _start(self) -> None:
        self._map_lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()  # the watchers
        self._waits = AsyncShardWaits(self._shards, self._spawn)
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the map ----------------------------------------------------------------------

    async def _reload_map(self) -> bool:
        """The map read again from shard 0 (``map``): whether it changed."""
        async with self._map_lock:
            shard = self._shards[0]
            return self._map_read(await shard._run("map", self._map_args()))

    async def _shard_run(self, run: Any, script: str, args: list[str]) -> Any:
        """As ``ShardedRedisWorkQueue._shard_run``; the map read first, on the first call."""
        if self._map is None and script != "map":
            await self._reload_map()
        while True:
            route = ROUTE.get()
            epoch = self._current.epoch
            try:
                return await run(script, tag(args, epoch, route))
            except redis.exceptions.ResponseError as exc:
                refused(exc)
                await self._reload_map()  # (another thread or task may have already)
                ask_again(exc, epoch, self._current.epoch, route)

    async def _keyed(
        self, key: str, call: Callable[[Any], Awaitable[T]], by_hold: bool = True
    ) -> T:
        """As ``ShardedRedisWorkQueue._keyed``."""
        if self._map is None:
            await self._reload_map()
        while True:
            first, home = self._first(key, by_hold)
            try:
                with routed("r" if first == home else "m"):
                    return await call(self._shards[first])
            except MapChanged:
                continue
            except KeyMoved:
                pass
            try:
                with routed("r"):
                    if await self._move(key, first, home):
                        return await call(self._shards[home])
            except MapChanged:
                continue

    async def _move(self, key: str, old: int, new: int) -> bool:
        """As ``ShardedRedisWorkQueue._move``."""
        steps = mover.move(key, old, new, self._current, self._cfg.clock_arg, self._cfg.aging_arg)
        return await self._run_steps(steps) is not None

    # -- resharding ------------------------------------------------------------------

    async def reshard(self, shards: int) -> int:
        """As ``ShardedRedisWorkQueue.reshard``."""
        target = check_shards(shards)
        if self._map is None:
            await self._reload_map()
        moved = 0
        while True:
            steps = mover.reshard(target, self._cfg.clock_arg, self._cfg.aging_arg)
            try:
                with routed("r"):
                    return moved + int(await self._run_steps(steps))
            except MapChanged:
                continue

    async def _run_steps(self, steps: Generator[mover.Step, Any, T]) -> T:
        """As ``ShardedRedisWorkQueue._run_steps``."""
        reply: Any = None
        while True:
            try:
                kind, shard, what, args = steps.send(reply)
            except StopIteration as end:
                result: T = end.value
                return result
            reply = None
            if kind == "call":
                self._grow(shard + 1)
                reply = await self._shards[shard]._run(what, args)
            elif kind == "reap":
                reaper = self._shards[shard]
                await reaper._drive(reaper._op_reap())
            elif kind == "reload":
                await self._reload_map()
            else:
                await asyncio.sleep(float(what))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- per key: the key's shard ------------------------------------------------------

    async def add(self, key: str, priority: int = 0) -> None:
        await self._keyed(key, lambda shard: shard.add(key, priority), by_hold=False)

    async def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """As ``ShardedRedisWorkQueue.add_many``."""
        if self._map is None:
            await self._reload_map()
        groups, moving = self._groups(keys, priority)
        for index, group in enumerate(groups):
            if group:
                try:
                    with routed("r"):
                        await self._shards[index].add_many(group, priority)
                except MapChanged:
                    moving.extend(group)
        for key in moving:
            await self.add(key, priority)

    async def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        await self._keyed(key, lambda shard: shard.add_after(key, seconds, priority))

    async def add_rate_limited(self, key: str, priority: int = 0) -> None:
        await self._keyed(key, lambda shard: shard.add_rate_limited(key, priority))

    async def forget(self, key: str) -> None:
        await self._keyed(key, lambda shard: shard.forget(key))

    async def num_requeues(self, key: str) -> int:
        """As ``ShardedRedisWorkQueue.num_requeues``."""
        if self._map is None:
            await self._reload_map()
        held = self._holding(key)
        if held is not None:
            return int(await held.num_requeues(key))
        first, home = self._current.route(key)
        return max([int(await self._shards[i].num_requeues(key)) for i in {first, home}])

    async def retry(self, key: str) -> bool:
        return bool(await self._keyed(key, lambda shard: shard.retry(key)))

    async def give_up(self, key: str, reason: str, error: BaseException | None = None) -> None:
        await self._keyed(key, lambda shard: shard.give_up(key, reason, error))

    async def replay(self, key: str) -> bool:
        """As ``ShardedRedisWorkQueue.replay``."""
        if await self._keyed(key, lambda shard: shard.replay(key)):
            return True
        found = await asyncio.gather(*(shard.forget_dead(key) for shard in self._shards))
        if not any(found):
            return False
        await self.add(key)
        return True

    async def forget_dead(self, key: str) -> bool:
        """As ``ShardedRedisWorkQueue.forget_dead``."""
        found = await asyncio.gather(*(shard.forget_dead(key) for shard in self._shards))
        return any(found)

    async def done(self, key: str) -> None:
        await self._keyed(key, lambda shard: shard.done(key))

    # -- getting: any shard -----------------------------------------------------------

    async def _take_any(self, order: tuple[int, ...], from_ready: bool) -> str | None:
        """The get script on each shard of ``order`` until one hands out a
        key (each a shard's ``_take``: a cancelled get puts its key back)."""
        self._loop = asyncio.get_running_loop()
        waits, shards = self._waits, self._shards
        for n, i in enumerate(order):
            shard = shards[i]
            again = False
            try:
                key, due = await shard._take()
                if key is None:
                    again = shard._waiting.look_again(due)
            finally:
                waits.looked(i, again)
            if key is not None:
                waits.took(order, n, from_ready)
                return str(key)
        return None

    async def get_nowait(self) -> str:
        key = await self._take_any(self._waits.first_order(), False)
        if key is None:
            raise Empty
        return key

    async def get(self, timeout: float | None = None) -> str:
        waits = self._waits
        _, deadline = self._waiting.bounds(timeout, time.monotonic())
        seen = waits.interrupts
        order, from_ready = waits.first_order(), False
        while True:
            key = await self._take_any(order, from_ready)
            if key is not None:
                return key
            order, from_ready = await waits.wait(seen, deadline), True

    async def interrupt(self) -> None:
        self._waits.interrupt()

    # -- the client's end ------------------------------------------------------------

    async def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        timeout = drain_timeout(drain, timeout)
        self._quiet_shut(self._shards)
        for shard in self._shards:
            await shard.shutdown()
        self._waits.shutdown()
        if not drain:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        drained = True
        for shard in self._shards:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            drained = await shard.shutdown(drain=True, timeout=left) and drained
        return drained

    async def join(self, timeout: float | None = None) -> bool:
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            await self._reload_map()
            for shard in self._shards:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not await shard.join(left):
                    return False
            if all([await shard._idle() for shard in self._shards]):
                return True

    async def aclose(self) -> None:
        """As ``AsyncRedisWorkQueue.aclose``; the watchers, woken by each shard's
        shutdown, are waited for (a lease at most, then cancelled)."""
        await self.shutdown()
        if self._background:
            await asyncio.wait(list(self._background), timeout=self.lease)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for shard in self._shards:
            await shard.aclose()
        if self._owns_client:
            await aclose_client(self._client)

    async def __aenter__(self) -> AsyncShardedRedisWorkQueue:
        for shard in self._shards:
            await shard._ready()
        return self

    # -- the whole queue: every shard, added up ---------------------------------------------

    async def stats(self) -> RedisStats:
        """As ``ShardedRedisWorkQueue.stats``; the shards read concurrently."""
        await self._reload_map()
        parts = await asyncio.gather(*(shard.stats() for shard in self._shards))
        return merge_stats(parts, self.shutting_down)

    async def snapshot(self, limit: int = 100) -> Snapshot[str]:
        await self._reload_map()
        parts = await asyncio.gather(*(shard.snapshot(limit) for shard in self._shards))
        return merge_snapshots(parts, self.shutting_down)

    async def dead(self, limit: int = 100) -> tuple[DeadKey[str], ...]:
        """Each shard's dead keys (read concurrently), newest first, cut at ``limit``."""
        parts = await asyncio.gather(*(shard.dead(limit) for shard in self._shards))
        return merge_dead(parts, limit)

    async def replay_all(self) -> int:
        """As ``ShardedRedisWorkQueue.replay_all``."""
        replayed = 0
        for shard in self._shards:
            while dead := await shard.dead(DEAD_LIMIT):
                for row in dead:
                    replayed += await self.replay(row.key)
        return replayed

    async def exists(self) -> bool:
        """As ``ShardedRedisWorkQueue.exists`` (the map is written by a client's first call)."""
        return any([await shard.exists() for shard in self._shards])

    async def delete(self, *, force: bool = False) -> bool:
        """As ``ShardedRedisWorkQueue.delete``."""
        await self._reload_map()
        self._check_not_moving()
        if not force:
            for shard in self._shards:
                if (await shard.stats()).processing:
                    raise RuntimeError(
                        f"queue {self.name!r}: keys are held; delete(force=True) to delete"
                    )
        return any([await shard.delete(force=force) for shard in self._shards])

    def _gauges(self) -> QueueGauges:
        return merge_gauges([shard._gauges() for shard in self._shards])


def _claims(queue: AsyncShardedRedisWorkQueue, fold_forget: bool) -> AsyncClaims:
    """``arun_workers``' batched source on a sharded queue (``ShardedParts._new_claims``)."""
    return queue._new_claims(AsyncClaims, fold_forget)


AsyncRedisWorkQueue._sharded = AsyncShardedRedisWorkQueue
batch_with(AsyncShardedRedisWorkQueue, _claims)
