"""``run_workers`` and ``arun_workers`` on a sharded queue claim in batches per shard.

Each shard's own claim script takes its keys and settles their dones (the
scripts are counted per shard by wrapping each shard client's ``_drive``,
the private hook its claims and gets go through, before the run makes its
claims); a round takes from the shards with work in turn, so a full shard
does not starve an emptier one; a worker process killed with keys of
several shards loses each back to the queue once its lease runs out; an
idle run waits without polling and stops at once. On one server and on a
3-primary Valkey Cluster (each shard's slot on its own primary).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import keyqueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue, shard_of
from keyqueue.redis._claim_rules import PASSED_OVER
from keyqueue.testing import ValkeyCluster
from tests.redis.test_shards import adrain, drain, keys_of_shard, spread_name
from tests.support import valkey_server
from tests.support.redis_processes import (
    CONTEXT,
    Names,
    Processes,
    async_blocked_claimer,
    claiming_worker,
    processes,
)

name = valkey_server.name  # fixtures: a queue of this test's own

SHARDS = 3
WAIT = 20.0


class Scripts:
    """The scripts each shard client of ``q`` sends, by name, and the keys its
    claims took (``taken[i]``), counted from now on."""

    def __init__(self, q: RedisWorkQueue | AsyncRedisWorkQueue) -> None:
        shards: list[Any] = q._shards  # type: ignore[union-attr]
        self.sent = [Counter[str]() for _ in shards]
        self.taken = [Counter[str]() for _ in shards]
        for i, shard in enumerate(shards):
            self._wrap(shard, self.sent[i], self.taken[i])

    @staticmethod
    def _wrap(shard: Any, sent: Counter[str], taken: Counter[str]) -> None:
        drive = shard._drive

        def count(op: Any, result: Any) -> None:
            what = op.gi_code.co_name
            sent[what] += 1
            if what == "claim":
                taken.update(key for key, _ in result[0])

        if isinstance(shard, AsyncRedisWorkQueue):

            async def adrive(op: Any) -> Any:
                result = await drive(op)
                count(op, result)
                return result

            shard._drive = adrive
        else:

            def sdrive(op: Any) -> Any:
                result = drive(op)
                count(op, result)
                return result

            shard._drive = sdrive

    def claims(self) -> int:
        return sum(sent["claim"] for sent in self.sent)


def check_drained_by_claims(scripts: Scripts, keys: list[str]) -> None:
    """Every key was taken by its own shard's claim script, once; no get
    script ran; about one claim per batch of keys, not a get and a done a key."""
    for i, taken in enumerate(scripts.taken):
        mine = [key for key in keys if shard_of(key, SHARDS) == i]
        assert sorted(taken) == sorted(mine), f"shard {i}"
        assert set(taken.values()) == {1}
        assert scripts.sent[i]["claim"] > 0
        assert scripts.sent[i]["get"] == 0
    assert scripts.claims() < 0.5 * len(keys), scripts.sent


async def adrain_by_claims(q: AsyncRedisWorkQueue, keys: list[str]) -> Any:
    """``keys`` added and drained by ``arun_workers`` (8 tasks), each taken
    by its shard's claim script (``check_drained_by_claims``): the stats after."""
    await q.add_many(keys)
    scripts = Scripts(q)
    assert sorted(await adrain(q, keys, workers=8)) == sorted(keys)
    check_drained_by_claims(scripts, keys)
    s = await q.stats()
    assert s.gets == s.dones == len(keys)
    return s


# -- on one server ---------------------------------------------------------------------


@pytest.fixture
def client(valkey_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(valkey_url)
    yield made
    made.close()


def test_run_workers_takes_each_shards_keys_with_that_shards_claims(
    client: redis.Redis, name: str
) -> None:
    q = RedisWorkQueue(name, client=client, shards=SHARDS)
    keys = [f"k{i}" for i in range(600)]
    q.add_many(keys)
    scripts = Scripts(q)
    handled = drain(q, keys, workers=8)
    assert sorted(handled) == sorted(keys)
    check_drained_by_claims(scripts, keys)
    s = q.stats()
    assert s.gets == s.dones == len(keys)
    assert (s.depth, s.processing, s.leases_expired) == (0, 0, 0)
    q.close()


def test_arun_workers_takes_each_shards_keys_with_that_shards_claims(
    valkey_url: str, name: str
) -> None:
    async def main() -> None:
        aclient = redis.asyncio.Redis.from_url(valkey_url)
        q = AsyncRedisWorkQueue(name, client=aclient, shards=SHARDS)
        try:
            s = await adrain_by_claims(q, [f"a{i}" for i in range(600)])
            assert (s.depth, s.processing, s.leases_expired) == (0, 0, 0)
        finally:
            await q.aclose()
            await aclient.aclose()

    asyncio.run(main())


def test_a_full_shard_does_not_starve_an_emptier_one_under_claims(
    client: redis.Redis, name: str
) -> None:
    """200 keys in shard 0, 5 in shard 1: the rounds take from the shards
    in turn, so shard 1's five are handled among the first 20 (FIFO per shard
    with shard 0 first would handle them last)."""
    q = RedisWorkQueue(name, client=client, shards=SHARDS)
    full, few = keys_of_shard(0, SHARDS, 200, "f"), keys_of_shard(1, SHARDS, 5, "e")
    q.add_many(full + few)
    handled = drain(q, full + few, workers=2)
    assert set(few) <= set(handled[:20]), handled[:20]
    q.close()


async def test_an_async_full_shard_does_not_starve_an_emptier_one_under_claims(
    valkey_url: str, name: str
) -> None:
    aclient = redis.asyncio.Redis.from_url(valkey_url)
    q = AsyncRedisWorkQueue(name, client=aclient, shards=SHARDS)
    try:
        full, few = keys_of_shard(2, SHARDS, 200, "f"), keys_of_shard(0, SHARDS, 5, "e")
        await q.add_many(full + few)
        handled = await adrain(q, full + few, workers=2)
        assert set(few) <= set(handled[:20]), handled[:20]
    finally:
        await q.aclose()
        await aclient.aclose()


def test_a_key_added_to_a_shard_passed_over_as_empty_is_asked_for_within_the_bound(
    client: redis.Redis, name: str
) -> None:
    """All keys in shard 0: the rounds find shards 1 and 2 empty and ask them
    after shard 0, so most rounds are one script; a key added to shard 1
    meanwhile is taken within ``PASSED_OVER`` rounds (of at most 2 keys:
    2 workers), not after the whole of shard 0."""
    q = RedisWorkQueue(name, client=client, shards=SHARDS)
    full = keys_of_shard(0, SHARDS, 300, "f")
    late = keys_of_shard(1, SHARDS, 1, "late")[0]
    q.add_many(full)
    scripts = Scripts(q)
    handled: list[str] = []
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            handled.append(key)
            count = len(handled)
        if count == 20:
            q.add(late)
        if count == len(full) + 1:
            threading.Thread(target=q.shutdown, kwargs={"drain": True}).start()

    keyqueue.run_workers(q, handle, workers=2)
    assert handled.index(late) < 20 + 2 * 2 * (PASSED_OVER + 2), handled.index(late)
    assert scripts.claims() < 1.6 * len(full) / 2  # N scripts a round would be 3 a round
    q.close()


def test_with_slow_handlers_each_done_is_sent_when_its_handler_returns(
    client: redis.Redis, name: str
) -> None:
    """Rounds far apart (handlers of 0.3 s): a round sends every shard's
    dones at once (``CARRY_GAP``), so each key's DONE event (its done's
    reply) comes within a round trip of its handler's return, as on one
    queue, not a round later."""
    q = RedisWorkQueue(name, client=client, shards=SHARDS)
    keys = [key for shard in range(SHARDS) for key in keys_of_shard(shard, SHARDS, 3, f"d{shard}-")]
    q.add_many(keys)
    returned: dict[str, float] = {}
    released: dict[str, float] = {}

    def on_event(event: keyqueue.Event[str]) -> None:
        if event.kind is keyqueue.EventKind.DONE and event.key is not None:
            released[event.key] = time.monotonic()

    q.subscribe(on_event)
    lock = threading.Lock()

    def handle(key: str) -> None:
        time.sleep(0.3)
        with lock:
            returned[key] = time.monotonic()
            if len(returned) == len(keys):
                threading.Thread(target=q.shutdown, kwargs={"drain": True}).start()

    keyqueue.run_workers(q, handle, workers=2)
    late = {key: released[key] - returned[key] for key in keys}
    assert max(late.values()) < 0.15, late
    q.close()


def test_idle_workers_wake_on_an_add_to_any_shard_and_stop_at_once(
    client: redis.Redis, name: str
) -> None:
    """Workers idle in run_workers (the claimant waiting for any shard) take
    a key added to each shard in turn, by that shard's claim; ``stop`` ends
    the run within a second."""
    q = RedisWorkQueue(name, client=client, shards=SHARDS)
    scripts = Scripts(q)
    handled: list[str] = []
    got = threading.Event()
    stop = threading.Event()

    def handle(key: str) -> None:
        handled.append(key)
        got.set()

    runner = threading.Thread(target=keyqueue.run_workers, args=(q, handle, 4, stop))
    runner.start()
    try:
        for shard in range(SHARDS):
            time.sleep(0.2)  # the workers idle: the claimant waits for any shard
            key = keys_of_shard(shard, SHARDS, 1, f"w{shard}-")[0]
            got.clear()
            q.add(key)
            assert got.wait(WAIT), f"the key of shard {shard} was not taken"
            assert scripts.taken[shard][key] == 1
    finally:
        stop.set()
        started = time.monotonic()
        runner.join(WAIT)
    assert not runner.is_alive()
    assert time.monotonic() - started < 1.0
    assert len(handled) == SHARDS
    assert sum(sent["get"] for sent in scripts.sent) == 0
    q.close()


# -- a worker process killed -----------------------------------------------------------------


@pytest.fixture
def procs() -> Iterator[Processes]:
    with processes() as owned:
        yield owned


@pytest.mark.parametrize("front", ["threads", "asyncio"])
def test_a_worker_process_killed_holding_keys_of_several_shards_loses_each_back_once(
    valkey_url: str, procs: Processes, name: str, client: redis.Redis, front: str
) -> None:
    """A process of four workers (threads under run_workers, or tasks under
    arun_workers) claims from the shards in turn; its four handlers block,
    so it holds four keys of at least two shards when it is killed (kill -9:
    no done, no put-back, no more renewals). Each comes back once its lease
    runs out, and a second client handles every key once: the four taken
    back, the two never taken."""
    lease = 1.0
    names = Names(name)
    keys = [key for shard in range(SHARDS) for key in keys_of_shard(shard, SHARDS, 2, f"s{shard}-")]
    q = RedisWorkQueue(name, client=client, shards=SHARDS, lease=lease)
    q.add_many(keys)
    if front == "threads":
        never = CONTEXT.Event()  # never set: the process is killed
        dying = procs.start(
            claiming_worker, valkey_url, names, never, lease=lease, block=True, shards=SHARDS
        )
    else:
        dying = procs.start(async_blocked_claimer, valkey_url, names, lease, SHARDS)
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    deadline = time.monotonic() + WAIT
    while raw.llen(names.begins) < 4:
        assert time.monotonic() < deadline, "the four handlers did not start"
        time.sleep(0.01)
    begun = [line.split()[0] for line in raw.lrange(names.begins, 0, -1)]
    assert len({shard_of(key, SHARDS) for key in begun}) >= 2, begun
    dying.kill()
    dying.join(WAIT)
    killed = time.monotonic()
    assert q.stats().processing == 4

    handled = drain(q, keys, workers=4)
    assert sorted(handled) == sorted(keys)  # each once
    assert time.monotonic() - killed < WAIT
    s = q.stats()
    assert (s.leases_expired, s.gets, s.dones) == (4, len(keys) + 4, len(keys))
    assert (s.depth, s.processing, s.delayed) == (0, 0, 0)
    raw.close()
    q.close()


# -- on a 3-primary cluster ------------------------------------------------------------------


def evalshas(client: redis.RedisCluster) -> dict[str, int]:
    """``EVALSHA`` calls so far on each primary (``INFO commandstats``)."""
    calls: dict[str, int] = {}
    for node in client.get_primaries():
        stats: Any = client.info("commandstats", target_nodes=node)
        calls[node.name] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return calls


def test_on_a_cluster_each_primary_runs_its_shards_claims(cluster: ValkeyCluster) -> None:
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        queue = spread_name(client, SHARDS)
        q = RedisWorkQueue(queue, client=client, shards=SHARDS)
        keys = [f"c{i}" for i in range(600)]
        q.add_many(keys)
        scripts = Scripts(q)
        before = evalshas(client)
        handled = drain(q, keys, workers=8)
        after = evalshas(client)
        assert sorted(handled) == sorted(keys)
        check_drained_by_claims(scripts, keys)
        ran = {node: after[node] - before[node] for node in after}
        assert len(ran) == SHARDS
        assert all(calls > 0 for calls in ran.values()), ran
        assert sum(ran.values()) < len(keys)  # not a get and a done script a key
        s = q.stats()
        assert s.gets == s.dones == len(keys)
        q.delete(force=True)
        q.close()
    finally:
        client.close()


def test_on_a_cluster_arun_workers_claims_per_shard(cluster: ValkeyCluster) -> None:
    async def main() -> None:
        aclient = redis.asyncio.RedisCluster.from_url(cluster.url)
        q = AsyncRedisWorkQueue("async-claims", client=aclient, shards=SHARDS)
        try:
            await adrain_by_claims(q, [f"ac{i}" for i in range(300)])
            await q.delete(force=True)
        finally:
            await q.aclose()
            await aclient.aclose()

    asyncio.run(main())
