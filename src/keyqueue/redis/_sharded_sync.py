"""``ShardedRedisWorkQueue``: ``RedisWorkQueue(name, shards=N)`` for N > 1, on threads.

A facade over N ``RedisWorkQueue`` shard clients (``_sharded``): each
per-key call is its key's shard's, made in the calling thread; ``get``
looks at the shards from a moving cursor and waits for any of them
(``_shard_waits.ShardWaits``); ``stats`` and ``snapshot`` read every shard
(one script each) and add them up (``_shards``). ``run_workers`` claims
keys in batches per shard (``_claims``: each shard's claim machinery, the
shards with work taken from in turn, the claimant waiting for any shard).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

import redis

from .._checks import check_timeout
from .._dead import DEAD_LIMIT, DeadKey
from .._errors import Empty
from .._metrics import QueueGauges
from .._snapshot import Snapshot
from .._source import batch_with
from . import _mover as mover
from ._claim_book import ClaimParts
from ._claims import Claims
from ._connection import close_client
from ._ends import drain_timeout
from ._front import logger
from ._replies import RedisStats
from ._resharding import ROUTE, KeyMoved, MapChanged, ask_again, refused, routed, tag
from ._shard_waits import ShardWaits
from ._sharded import ShardedParts
from ._shards import check_shards, merge_dead, merge_gauges, merge_snapshots, merge_stats
from ._sync import RedisWorkQueue, _nothing

__all__ = ["ShardedRedisWorkQueue"]

T = TypeVar("T")


class ShardedRedisWorkQueue(ShardedParts, RedisWorkQueue):
    """``RedisWorkQueue(name, shards=N)`` with N > 1: one queue over N shards,
    each the ordinary queue ``name/i`` in the slot ``{name/i}``, so on a
    Valkey Cluster the shards spread over the primaries.

    The same methods and rules as ``RedisWorkQueue``, per key (a key's shard
    is ``keyqueue.redis.shard_of(key, N)``). What differs: hand-out order and
    priorities (with aging) hold within a shard, the getters taking from the
    shards that have work in turn; the server token bucket is split (qps/N
    and burst/N per shard); fencing tokens increase per key; ``stats`` and
    ``snapshot`` read each shard in one step and add them up (N scripts);
    ``run_workers`` claims in batches per shard, from the shards with work
    in turn. Every client of a queue must pass the same ``shards``.
    """

    _base = RedisWorkQueue

    @staticmethod
    def _shard_claim_parts(shard: RedisWorkQueue) -> ClaimParts:
        """A shard's claim machinery, as a sharded client's claims use it."""
        return shard._claim_parts(
            shard._drive, functools.partial(shard._doorbell.wait, deadline=None), _nothing
        )

    def _start(self) -> None:
        self._map_lock = threading.Lock()
        self._waits = ShardWaits(self._shards, self.name)
        try:
            self._reload_map()
        except BaseException:
            self.close()
            raise

    # -- the map ----------------------------------------------------------------------

    def _reload_map(self) -> bool:
        """The map read again from shard 0: whether it changed."""
        with self._map_lock:
            shard = self._shards[0]
            return self._map_read(shard._run("map", self._map_args()))

    def _shard_run(self, run: Any, script: str, args: list[str]) -> Any:
        """A shard client's script call with the map's epoch (``_resharding``):
        refused for an older map, the map is reloaded and the call asked
        again, or (routed by its key) ``MapChanged`` raised."""
        while True:
            route = ROUTE.get()
            epoch = self._current.epoch
            try:
                return run(script, tag(args, epoch, route))
            except redis.exceptions.ResponseError as exc:
                refused(exc)
                self._reload_map()  # (another thread or task may have already)
                ask_again(exc, epoch, self._current.epoch, route)

    def _keyed(self, key: str, call: Callable[[Any], T], by_hold: bool = True) -> T:
        """``call`` on the shard client of ``key``: with ``by_hold``, the one
        that holds it; else its shard's by the map (``_first``). While it
        moves: its old shard first, then, if that one does not hold it, the
        key moved (``_move``) and its new shard. Routed again whenever the
        map changes."""
        while True:
            first, home = self._first(key, by_hold)
            try:
                with routed("r" if first == home else "m"):
                    return call(self._shards[first])
            except MapChanged:
                continue
            except KeyMoved:
                pass
            try:
                with routed("r"):
                    if self._move(key, first, home):
                        return call(self._shards[home])
            except MapChanged:
                continue

    def _move(self, key: str, old: int, new: int) -> bool:
        """Move ``key`` from shard ``old`` to ``new`` (``_mover.move``): False
        if ``old`` holds it now (ask there again)."""
        steps = mover.move(key, old, new, self._current, self._cfg.clock_arg, self._cfg.aging_arg)
        return self._run_steps(steps) is not None

    # -- resharding ------------------------------------------------------------------

    def reshard(self, shards: int) -> int:
        """Move the queue's keys to ``shards`` shards while producers and
        workers run (``_mover``): returns once every key is in its new shard,
        how many keys this call moved. Every client follows the new map
        without restart; a held key moves once its holder is done, so this
        takes at least the longest hold. Resumes a reshard to ``shards``
        that a mover left unfinished (it died); ``ValueError`` if one to
        another count is under way. A connection error leaves the move
        where it was: call again to resume it.
        """
        target = check_shards(shards)
        moved = 0
        while True:
            steps = mover.reshard(target, self._cfg.clock_arg, self._cfg.aging_arg)
            try:
                with routed("r"):
                    return moved + int(self._run_steps(steps))
            except MapChanged:  # another mover went on meanwhile: look again
                continue

    def _run_steps(self, steps: Generator[mover.Step, Any, T]) -> T:
        """``steps`` (``_mover``'s) run on this client's shards: what they return."""
        reply: Any = None
        while True:
            try:
                kind, shard, what, args = steps.send(reply)
            except StopIteration as end:
                result: T = end.value
                return result
            reply = None
            if kind == "call":
                with self._map_lock:
                    self._grow(shard + 1)
                reply = self._shards[shard]._run(what, args)
            elif kind == "reap":
                reaper = self._shards[shard]
                reaper._drive(reaper._op_reap())
            elif kind == "reload":
                self._reload_map()
            else:
                time.sleep(float(what))

    # -- per key: the key's shard ------------------------------------------------------

    def add(self, key: str, priority: int = 0) -> None:
        self._keyed(key, lambda shard: shard.add(key, priority), by_hold=False)

    def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """As ``RedisWorkQueue.add_many``: every key checked first; then each
        shard's keys, in order, in batches (atomic per shard and batch); while
        a reshard moves keys, those that move one at a time."""
        groups, moving = self._groups(keys, priority)
        for index, group in enumerate(groups):
            if group:
                self._add_group(index, group, priority)
        for key in moving:
            self.add(key, priority)

    def _add_group(self, index: int, keys: list[str], priority: int) -> None:
        """``keys`` (of shard ``index`` by the map) added there; by key if the map changed."""
        try:
            with routed("r"):
                self._shards[index].add_many(keys, priority)
        except MapChanged:
            for key in keys:
                self.add(key, priority)

    def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        self._keyed(key, lambda shard: shard.add_after(key, seconds, priority))

    def add_rate_limited(self, key: str, priority: int = 0) -> None:
        self._keyed(key, lambda shard: shard.add_rate_limited(key, priority))

    def forget(self, key: str) -> None:
        self._keyed(key, lambda shard: shard.forget(key))

    def num_requeues(self, key: str) -> int:
        """As ``RedisWorkQueue.num_requeues``; while the key moves, the larger
        of its old and new shards' counts."""
        held = self._holding(key)
        if held is not None:
            return int(held.num_requeues(key))
        first, home = self._current.route(key)
        counts = {int(self._shards[i].num_requeues(key)) for i in {first, home}}
        return max(counts)

    def retry(self, key: str) -> bool:
        return self._keyed(key, lambda shard: bool(shard.retry(key)))

    def give_up(self, key: str, reason: str, error: BaseException | None = None) -> None:
        self._keyed(key, lambda shard: shard.give_up(key, reason, error))

    def replay(self, key: str) -> bool:
        """As ``RedisWorkQueue.replay``, on the key's shard (one script). A
        key given up in another shard (before a reshard moved it) is found
        there: its entry dropped, then ``add`` (two steps)."""
        if self._keyed(key, lambda shard: bool(shard.replay(key))):
            return True
        if not any([shard.forget_dead(key) for shard in self._shards]):
            return False
        self.add(key)
        return True

    def forget_dead(self, key: str) -> bool:
        """Drop ``key``'s dead entry on every shard; False if none had one."""
        return any([shard.forget_dead(key) for shard in self._shards])

    def done(self, key: str) -> None:
        self._keyed(key, lambda shard: shard.done(key))

    # -- getting: any shard -----------------------------------------------------------

    def _take(self, order: tuple[int, ...], from_ready: bool) -> str | None:
        """The get script on each shard of ``order`` until one hands out a key."""
        waits, shards = self._waits, self._shards
        for n, i in enumerate(order):
            shard = shards[i]
            again = False
            try:
                key, due = shard._drive(shard._op_get(time.monotonic()))
                if key is None:
                    again = shard._waiting.look_again(due)
            finally:
                waits.looked(i, again)
            if key is not None:
                waits.took(order, n, from_ready)
                return str(key)
        return None

    def get_nowait(self) -> str:
        """As ``RedisWorkQueue.get_nowait``: the shards looked at in turn, from
        the one after the shard of the last key taken (up to N scripts)."""
        key = self._take(self._waits.first_order(), False)
        if key is None:
            raise Empty
        return key

    def get(self, timeout: float | None = None) -> str:
        """As ``RedisWorkQueue.get``, from any shard (``_shard_waits``)."""
        waits = self._waits
        _, deadline = self._waiting.bounds(timeout, time.monotonic())
        seen = waits.interrupts
        order, from_ready = waits.first_order(), False
        while True:
            key = self._take(order, from_ready)
            if key is not None:
                return key
            order, from_ready = waits.wait(seen, deadline), True

    def interrupt(self) -> None:
        self._waits.interrupt()

    # -- the client's end ------------------------------------------------------------

    def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        timeout = drain_timeout(drain, timeout)
        self._quiet_shut(self._shards)
        for shard in self._shards:
            shard.shutdown()
        self._waits.shutdown()
        if not drain:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        drained = True
        for shard in self._shards:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            drained = shard.shutdown(drain=True, timeout=left) and drained
        return drained

    def join(self, timeout: float | None = None) -> bool:
        """As ``RedisWorkQueue.join``: until every shard is idle at once."""
        timeout = check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._reload_map()
            for shard in self._shards:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not shard.join(left):
                    return False
            if all(shard._drive(shard._op_idle()) for shard in self._shards):
                return True

    def close(self) -> None:
        self.shutdown()
        for shard in self._shards:
            shard.close()
        if self._owns_client:
            close_client(self._client)

    # -- the whole queue: every shard, added up ---------------------------------------------

    def stats(self) -> RedisStats:
        """The queue's stats: each shard's read in one step (N scripts), summed
        (``_shards.merge_stats``): ``gets == dones + processing +
        leases_expired`` holds for the sum. The map is read first (one more
        round trip), so every shard of a reshard is counted."""
        self._reload_map()
        return merge_stats([shard.stats() for shard in self._shards], self.shutting_down)

    def snapshot(self, limit: int = 100) -> Snapshot[str]:
        """Each shard's snapshot (N scripts), merged (``_shards.merge_snapshots``);
        the map read first, as ``stats``."""
        self._reload_map()
        parts = [shard.snapshot(limit) for shard in self._shards]
        return merge_snapshots(parts, self.shutting_down)

    def dead(self, limit: int = 100) -> tuple[DeadKey[str], ...]:
        """Each shard's dead keys (N scripts), newest first, cut at ``limit``."""
        return merge_dead([shard.dead(limit) for shard in self._shards], limit)

    def replay_all(self) -> int:
        """``replay`` of every dead key of every shard, a key at a time (each
        is routed as ``add``, whichever shard gave it up); how many."""
        replayed = 0
        for shard in self._shards:
            while dead := shard.dead(DEAD_LIMIT):
                for row in dead:
                    replayed += self.replay(row.key)
        return replayed

    def exists(self) -> bool:
        """Whether the queue's shards are on the server: from the first
        client built (it writes the map of shards) until ``delete``."""
        return any(shard.exists() for shard in self._shards)

    def delete(self, *, force: bool = False) -> bool:
        """As ``RedisWorkQueue.delete``, each shard in turn. Without ``force``
        it is refused (``RuntimeError``, nothing changed) if a key is held in
        any shard when it starts; a key taken meanwhile refuses its shard's
        part (the shards before it are deleted). The map is read first, so
        every shard of a reshard is deleted. Refused (``RuntimeError``,
        nothing changed) while a reshard is under way: its mover would bring
        back the keys it carries."""
        self._reload_map()
        self._check_not_moving()
        if not force and any(shard.stats().processing for shard in self._shards):
            raise RuntimeError(f"queue {self.name!r}: keys are held; delete(force=True) to delete")
        existed = [shard.delete(force=force) for shard in self._shards]
        return any(existed)

    def _gauges(self) -> QueueGauges:
        try:
            self.stats()
        except redis.exceptions.RedisError:
            logger.exception("keyqueue %r: reading gauges from the server failed", self.name)
        return merge_gauges([shard._last_levels for shard in self._shards])

    def __enter__(self) -> ShardedRedisWorkQueue:
        return self


def _claims(queue: ShardedRedisWorkQueue, fold_forget: bool) -> Claims:
    """``run_workers``' batched source on a sharded queue (``ShardedParts._new_claims``)."""
    return queue._new_claims(Claims, fold_forget)


RedisWorkQueue._sharded = ShardedRedisWorkQueue
batch_with(ShardedRedisWorkQueue, _claims)
