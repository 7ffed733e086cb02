"""Resharding's interleavings, each driven step by step on a real server.

The mover is the ``_mover.reshard`` generator run one step at a time by
``Stepper`` (the test's own driver of the steps ``reshard`` runs), so a
test stops it just before a chosen step, lets clients call in between, and
goes on. Time is a ``FakeClock`` where a lease must run out. Each test pins
a promise of a reshard: a key has state in one shard at a time (so no two
live holders), an acknowledged add is kept, and a client with an old map
or an old hold never writes a key's state into a shard that does not own
it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis.asyncio

from keyqueue import Empty
from keyqueue.redis import AsyncRedisWorkQueue, LeaseLost, RedisWorkQueue, shard_of
from keyqueue.redis import _mover as mover
from keyqueue.redis._resharding import routed
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import FakeClock
from tests.redis.test_reshard import depths, drain, moving_keys
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

Step = tuple[str, int, str, list[str]]


class Stepper:
    """``q``'s mover to ``target`` shards, run a step at a time (as
    ``ShardedRedisWorkQueue._run_steps``, pauses not slept)."""

    def __init__(self, q: Any, target: int) -> None:
        self.q = q
        self.steps: Generator[Step, Any, int] = mover.reshard(
            target, q._cfg.clock_arg, q._cfg.aging_arg
        )
        self.pending: Step | None = next(self.steps)
        self.moved: int | None = None

    def run_until(self, stop: Callable[[Step], bool] = lambda step: False) -> None:
        """Steps run until the next one is one ``stop`` picks (not run), or the end."""
        while self.pending is not None and not stop(self.pending):
            kind, shard, what, args = self.pending
            reply: Any = None
            with routed("r"):
                if kind == "call":
                    self.q._grow(shard + 1)
                    reply = self.q._shards[shard]._run(what, args)
                elif kind == "reap":
                    reaper = self.q._shards[shard]
                    reaper._drive(reaper._op_reap())
                elif kind == "reload":
                    self.q._reload_map()
            try:
                self.pending = self.steps.send(reply)
            except StopIteration as end:
                self.pending, self.moved = None, int(end.value)


def call_of(script: str, shard: int | None = None) -> Callable[[Step], bool]:
    return lambda step: step[2] == script and (shard is None or step[1] == shard)


def has_state(q: Any, shard: int, key: str) -> bool:
    """Whether ``key`` is dirty (added, not yet handed out) in ``shard`` of ``q``'s queue."""
    raw = q._shards[0]._client
    return bool(raw.hexists(f"keyqueue:{hash_tag(shard_name(q.name, shard))}:dirty", key))


def test_an_add_from_a_client_whose_hold_ran_out_goes_to_the_keys_new_shard(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    key = next(k for k in moving_keys(2, 3, 20) if shard_of(k, 2) == 0)
    new = shard_of(key, 3)
    worker = make(shards=2, clock=clock, lease=10)
    worker.add(key)
    assert worker.get_nowait() == key  # held in shard 0
    for shard in worker._shards:  # type: ignore[attr-defined]
        shard._stop_renewing.set()  # a slow handler: its lease runs out
    stepper = Stepper(make(shards=2, clock=clock), 3)
    stepper.run_until(call_of("holdings"))  # the map says: 3, moving from 2
    clock.step(11)
    stepper.run_until(call_of("import"))  # the lease taken back, the key exported
    stepper.run_until(call_of("holdings"))  # imported into its new shard, finished
    assert has_state(worker, new, key)
    assert not has_state(worker, 0, key)
    worker.add(key)  # the worker still thinks it holds the key in shard 0
    assert not has_state(worker, 0, key)  # never again in its old shard
    producer = make(shards=2, clock=clock)
    assert producer.get_nowait() == key
    with pytest.raises(Empty):
        producer.get_nowait()  # one holder: the key is in one shard
    producer.done(key)
    stepper.run_until()
    assert stepper.moved == 1
    with pytest.raises(Empty):
        producer.get_nowait()


def test_a_key_moved_while_a_shard_has_the_old_map_gets_no_state_there_again(
    make: Callable[..., RedisWorkQueue],
) -> None:
    key = next(k for k in moving_keys(3, 6, 40) if shard_of(k, 3) == 2)
    new = shard_of(key, 6)
    old_map = make(shards=3)  # reads the map now: 3 shards, not moving
    stepper = Stepper(make(shards=3), 6)
    stepper.run_until(call_of("set_map", 2))  # shard 0 and 1 have the new map, 2 not yet
    moving_map = make(shards=3)  # reads shard 0's map: 6, moving from 3
    moving_map.add(key)  # moved by this client: export from 2, import into its new shard
    assert has_state(moving_map, new, key)
    old_map.add(key)  # routed to shard 2 by the old map
    assert not has_state(moving_map, 2, key)  # refused there: followed the map
    assert moving_map.get_nowait() == key
    with pytest.raises(Empty):
        moving_map.get_nowait()  # one holder: the key is in one shard
    moving_map.done(key)
    stepper.run_until()
    assert moving_map.stats().depth == 0


def test_an_add_of_a_key_held_while_its_shard_had_the_old_map_is_kept(
    make: Callable[..., RedisWorkQueue],
) -> None:
    key = next(k for k in moving_keys(3, 6, 40) if shard_of(k, 3) == 2)
    old_map = make(shards=3)
    stepper = Stepper(make(shards=3), 6)
    stepper.run_until(call_of("set_map", 2))
    moving_map = make(shards=3)
    moving_map.add(key)  # moved to its new shard
    assert moving_map.get_nowait() == key  # and held there
    old_map.add(key)  # acknowledged: a redelivery is owed after the done
    moving_map.done(key)
    stepper.run_until()
    assert moving_map.get_nowait() == key  # the one redelivery
    moving_map.done(key)
    with pytest.raises(Empty):
        moving_map.get_nowait()


def test_delete_by_a_client_with_an_old_map_deletes_the_shards_a_reshard_added(
    make: Callable[..., RedisWorkQueue], name: str
) -> None:
    early = make(shards=2)
    keys = [f"d{i}" for i in range(40)]
    early.add_many(keys)
    make(shards=2).reshard(4)
    assert early.delete()
    raw = early._shards[0]._client  # type: ignore[attr-defined]
    left = [k for k in raw.scan_iter(match=f"keyqueue:{{{name}*") if b":wake:" not in k]
    assert left == []  # every shard's state, those of both maps
    fresh = make(shards=2)
    assert fresh.shards == 2
    assert fresh.stats().depth == 0


def test_delete_is_refused_while_a_reshard_carries_keys_and_deletes_once_it_ended(
    make: Callable[..., RedisWorkQueue], valkey_url: str
) -> None:
    q = make(shards=2)
    q.add_many(moving_keys(2, 3, 20))
    stepper = Stepper(make(shards=2), 3)
    stepper.run_until(call_of("import"))  # a key exported, not yet imported
    with pytest.raises(RuntimeError, match="reshard from 2 to 3 shards is under way"):
        q.delete(force=True)

    async def adelete() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        try:
            aq = AsyncRedisWorkQueue(q.name, client=client, shards=2)
            with pytest.raises(RuntimeError, match="under way"):
                await aq.delete(force=True)
            await aq.aclose()
        finally:
            await client.aclose()

    asyncio.run(adelete())
    assert q.stats().depth == 19  # nothing deleted; one key is in the mover's hands
    stepper.run_until()
    assert stepper.moved is not None
    assert stepper.moved > 0
    assert q.stats().depth == 20
    assert q.delete()
    assert make(shards=2).stats().depth == 0  # no key brought back


def test_the_asyncio_client_gives_an_old_shard_the_map_before_it_moves_a_key(
    make: Callable[..., RedisWorkQueue], valkey_url: str, name: str
) -> None:
    key = next(k for k in moving_keys(3, 6, 40) if shard_of(k, 3) == 2)
    old_map = make(shards=3)
    stepper = Stepper(make(shards=3), 6)
    stepper.run_until(call_of("set_map", 2))

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        moving_map = AsyncRedisWorkQueue(name, client=client, shards=3)
        try:
            await moving_map.add(key)  # moved: shard 2 given the map first
            old_map.add(key)  # refused there: followed the map, coalesced
            assert not has_state(old_map, 2, key)
            assert await moving_map.get_nowait() == key
            with pytest.raises(Empty):
                await moving_map.get_nowait()
            await moving_map.done(key)
        finally:
            await moving_map.aclose()
            await client.aclose()

    asyncio.run(main())
    stepper.run_until()
    assert old_map.stats().depth == 0


def test_a_holder_whose_key_moved_on_after_its_lease_ran_out_learns_it_lost_the_lease(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    key = next(k for k in moving_keys(2, 3, 20) if shard_of(k, 2) == 0)
    worker = make(shards=2, clock=clock, lease=10)
    worker.add(key)
    assert worker.get_nowait() == key
    for shard in worker._shards:  # type: ignore[attr-defined]
        shard._stop_renewing.set()
    stepper = Stepper(make(shards=2, clock=clock), 3)
    stepper.run_until(call_of("holdings"))
    clock.step(11)
    stepper.run_until()  # taken back, moved; the map is 3 shards
    worker._reload_map()  # type: ignore[attr-defined]
    for outcome in (worker.retry, worker.forget, worker.done):
        with pytest.raises(LeaseLost):
            outcome(key)
    worker.add(key)  # coalesced in its new shard
    assert not has_state(worker, 0, key)
    assert worker.get_nowait() == key
    worker.done(key)


def test_two_movers_interleaved_move_every_key_once(make: Callable[..., RedisWorkQueue]) -> None:
    q = make(shards=2)
    keys = [f"t{i}" for i in range(60)]
    q.add_many(keys)
    first = Stepper(make(shards=2), 3)
    first.run_until(call_of("import"))  # a key exported by the first, kept
    second = Stepper(make(shards=2), 3)  # resumes the move: imports the kept key itself
    second.run_until(call_of("set_map", 0))  # its final pass done, the map not yet ended
    first.run_until(call_of("holdings"))  # the kept key imported again: a repeat
    second.run_until()  # the move ends
    first.run_until()  # its last pass finds nothing to move; its map written already
    again = Stepper(make(shards=2), 3)
    again.run_until()
    assert again.moved == 0  # reshard(3) is done
    assert q.stats().depth == len(keys)  # the map read: every shard
    assert depths(q) == [sum(shard_of(k, 3) == i for k in keys) for i in range(3)]
    assert sorted(drain(q)) == sorted(keys)
