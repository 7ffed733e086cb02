"""A sharded queue (``shards=N``) on one server and on a 3-primary Valkey Cluster.

Shard 0 of queue ``name`` is the unsharded queue ``name`` (slot ``{name}``),
shard ``i`` > 0 the ordinary queue ``name/i`` (slot ``{name/i}``); a key's
shard is ``shard_of(key, N)``. Every per-key rule holds
across shards (coalescing, one holder, one redelivery, delays), the getters
take from the shards in turn, and the whole-queue reads add the shards up.
The cluster (``keyqueue.testing.ValkeyCluster``, 3 primaries, no replicas)
is shared by this module's tests and stopped at its end.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import keyqueue
from keyqueue import Empty, EventKind, ShutDown
from keyqueue.redis import AsyncRedisWorkQueue, RedisRateLimiter, RedisWorkQueue, shard_of
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import FakeClock, ValkeyCluster
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

WAIT = 10.0


def keys_where(wanted: Callable[[str], bool], count: int, prefix: str) -> list[str]:
    """The first ``count`` keys ``prefix0``, ``prefix1``... that are ``wanted``."""
    candidates = (f"{prefix}{i}" for i in itertools.count())
    return list(itertools.islice(filter(wanted, candidates), count))


def keys_of_shard(shard: int, shards: int, count: int, prefix: str = "k") -> list[str]:
    """``count`` keys whose shard is ``shard``."""
    return keys_where(lambda key: shard_of(key, shards) == shard, count, prefix)


def drain(q: RedisWorkQueue, keys: list[str], workers: int) -> list[str]:
    """``run_workers`` until every key of ``keys`` was handled; the keys in the
    order the handlers started."""
    handled: list[str] = []
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            handled.append(key)
            if len(handled) == len(keys):
                threading.Thread(target=q.shutdown, kwargs={"drain": True}).start()

    stats = keyqueue.run_workers(q, handle, workers=workers)
    assert stats.processed == len(keys)
    return handled


async def adrain(q: AsyncRedisWorkQueue, keys: list[str], workers: int) -> list[str]:
    """As ``drain``, with ``arun_workers``."""
    handled: list[str] = []

    async def handle(key: str) -> None:
        handled.append(key)
        await asyncio.sleep(0)
        if len(handled) == len(keys):
            asyncio.get_running_loop().create_task(q.shutdown(drain=True))

    stats = await keyqueue.arun_workers(q, handle, workers=workers)
    assert stats.processed == len(keys)
    return handled


def reference_jump(key: str, buckets: int) -> int:
    """Lamping and Veach's jump hash as their paper writes it (floating point)."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    b, j = -1, 0
    while j < buckets:
        b = j
        h = (h * 2862933555777941757 + 1) % 2**64
        j = int((b + 1) * (float(1 << 31) / float((h >> 33) + 1)))
    return b


@pytest.fixture
def sharded(make: Callable[..., RedisWorkQueue]) -> RedisWorkQueue:
    return make(shards=3, rate_limiter=keyqueue.ItemFastSlowRateLimiter(0, 0, 1))


# -- the hash ---------------------------------------------------------------------


def test_shard_of_is_jump_hash_over_the_first_8_bytes_of_sha256() -> None:
    keys = [f"key-{i}" for i in range(2000)] + ["", "é", "a/b{c}"]
    for shards in (1, 2, 3, 7, 64):
        assert [shard_of(k, shards) for k in keys] == [reference_jump(k, shards) for k in keys]
    # pinned: every client, in any language, computes these
    assert [shard_of(f"key-{i}", 3) for i in range(8)] == [
        reference_jump(f"key-{i}", 3) for i in range(8)
    ]
    assert shard_of("anything", 1) == 0


def test_growing_the_shards_moves_keys_only_to_the_new_shard() -> None:
    keys = [f"key-{i}" for i in range(3000)]
    for n in (1, 2, 3, 5):
        moved = [k for k in keys if shard_of(k, n) != shard_of(k, n + 1)]
        assert all(shard_of(k, n + 1) == n for k in moved)
        assert abs(len(moved) / len(keys) - 1 / (n + 1)) < 0.04


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, 2.5, "3", None])
def test_a_bad_shard_count_is_one_value_error_before_connecting(bad: object) -> None:
    for kind in (RedisWorkQueue, AsyncRedisWorkQueue):
        with pytest.raises(ValueError, match=r"^\w+\(\): shards must be an int >= 1, got ") as e:
            kind("q", url="redis://127.0.0.1:1/0", shards=bad)  # nothing listens there
        assert "\n" not in str(e.value)


def test_one_shard_is_todays_queue_unchanged(make: Callable[..., RedisWorkQueue]) -> None:
    q = make(shards=1)
    assert type(q) is RedisWorkQueue
    assert q.shards == 1
    q.add("a")
    assert q._stats_key == f"keyqueue:{{{q.name}}}:stats"


def test_a_client_follows_the_map_on_the_server(
    make: Callable[..., Any], valkey_url: str, name: str
) -> None:
    q = make(shards=3)
    assert q.exists()  # the map of shards is written by the first client
    other = make(shards=4)  # shards= is what a new queue starts with
    assert other.shards == 3
    other.add("a")
    assert q.get_nowait() == "a"
    q.done("a")

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        aq = AsyncRedisWorkQueue(name, client=client, shards=2)
        try:
            await aq.add("b")
            assert aq.shards == 3
        finally:
            await aq.aclose()
            await client.aclose()

    asyncio.run(main())
    assert q.get_nowait() == "b"
    assert q.stats().adds == 2


def test_an_unsharded_client_is_refused_by_a_sharded_queue(make: Callable[..., Any]) -> None:
    q = make(shards=3)
    plain = make()  # shard 0 is the unsharded queue's slot: it must not add there
    with pytest.raises(redis.exceptions.ResponseError, match=r"^MAPCHANGED .*shards=3"):
        plain.add("a")
    with pytest.raises(redis.exceptions.ResponseError, match=r"^MAPCHANGED"):
        plain.get_nowait()
    assert q.stats().adds == 0


def test_a_sharded_client_of_an_unsharded_queue_follows_its_one_shard(
    make: Callable[..., Any],
) -> None:
    plain = make()
    plain.add("a")
    q = make(shards=3)
    assert q.shards == 1
    q.add("b")
    assert plain.get_nowait() == "a"
    assert q.get_nowait() == "b"
    plain.done("a")
    q.done("b")
    assert plain.stats().adds == 2


# -- per-key rules across shards ------------------------------------------------------------


def test_keys_spread_over_the_shards_each_in_its_own_slot(
    sharded: RedisWorkQueue, valkey_url: str
) -> None:
    assert type(sharded) is not RedisWorkQueue
    assert isinstance(sharded, RedisWorkQueue)
    assert sharded.shards == 3
    sharded.add_many([f"key-{i}" for i in range(600)])
    depths = [shard.stats().depth for shard in sharded._shards]  # type: ignore[attr-defined]
    assert sum(depths) == 600
    assert all(150 < d < 250 for d in depths), depths
    client = redis.Redis.from_url(valkey_url)
    try:
        tags = {k.decode().split("}")[0] + "}" for k in client.keys(f"keyqueue:{{{sharded.name}*")}
    finally:
        client.close()
    shard_tags = [f"{{{sharded.name}}}"] + [f"{{{sharded.name}/{i}}}" for i in (1, 2)]
    assert tags == {f"keyqueue:{tag}" for tag in shard_tags}


def test_coalescing_one_holder_and_one_redelivery_across_shards(sharded: RedisWorkQueue) -> None:
    keys = [keys_of_shard(i, 3, 1, "c")[0] for i in range(3)]
    for key in keys * 2:
        sharded.add(key)
    assert sharded.stats().depth == 3
    assert sharded.stats().coalesced == 3
    held = sorted(sharded.get_nowait() for _ in keys)
    assert held == sorted(keys)
    for key in keys:
        sharded.add(key)  # marked while held: not handed out again
    with pytest.raises(Empty):
        sharded.get_nowait()
    for key in keys:
        sharded.done(key)
    again = sorted(sharded.get_nowait() for _ in keys)
    assert again == sorted(keys)  # exactly one redelivery each
    for key in keys:
        sharded.done(key)
    with pytest.raises(Empty):
        sharded.get_nowait()
    tokens = {k: sharded._shard(k) for k in keys}  # type: ignore[attr-defined]
    assert len({id(s) for s in tokens.values()}) == 3


def test_delays_retries_and_tokens_route_to_the_keys_shard(make: Callable[..., Any]) -> None:
    clock = FakeClock()
    q = make(shards=3, clock=clock, max_retries=2)
    keys = [keys_of_shard(i, 3, 1, "d")[0] for i in range(3)]
    for key in keys:
        q.add_after(key, 10)
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().delayed == 3
    clock.step(11)
    got = sorted(q.get_nowait() for _ in keys)
    assert got == sorted(keys)
    for key in keys:
        assert q.token(key) >= 1
        assert q.retry(key) is True  # backs off on its shard
        q.done(key)
        assert q.num_requeues(key) == 1
    clock.step(1000)
    for _ in keys:
        key = q.get_nowait()
        assert q.retry(key) is False  # max_retries counted in its shard
        q.forget(key)
        q.done(key)
    assert q.stats().given_up_retries == 3


def test_stats_identities_hold_for_the_sum(sharded: RedisWorkQueue) -> None:
    sharded.add_many([f"s{i}" for i in range(60)])
    sharded.add_many([f"s{i}" for i in range(30)])  # coalesced
    held = [sharded.get_nowait() for _ in range(20)]
    for key in held[:5]:
        sharded.add(key)  # marked while processing
    for key in held[:12]:
        sharded.done(key)
    s = sharded.stats()
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing == 95
    assert s.gets == s.dones + s.processing + s.leases_expired
    assert (s.gets, s.dones, s.processing) == (20, 12, 8)
    assert s.depth == 60 - 20 + 5
    assert s.waiting_by_priority == {0: s.depth}
    assert len(sharded) == s.depth


def test_snapshot_merges_the_shards_rows_in_each_lists_order(sharded: RedisWorkQueue) -> None:
    for i in range(12):
        sharded.add(f"p{i}", priority=i % 3)
    held = [sharded.get_nowait() for _ in range(3)]
    snap = sharded.snapshot(limit=5)
    assert snap.limit == 5
    assert len(snap.waiting) == 5
    assert len(snap.processing) == 3
    assert [row.priority for row in snap.waiting] == sorted(
        (row.priority for row in snap.waiting), reverse=True
    )
    assert snap.waiting[0].priority == 2
    assert {row.key for row in snap.processing} == set(held)
    assert snap.stats.depth == 9
    assert snap.stats.processing == 3
    everything = sharded.snapshot(limit=100)
    assert len(everything.waiting) == 9
    lease_left = [row.lease_left for row in everything.processing]
    assert lease_left == sorted(lease_left)  # type: ignore[type-var]


def test_a_full_shard_does_not_starve_an_emptier_one(sharded: RedisWorkQueue) -> None:
    full, few = keys_of_shard(0, 3, 200, "f"), keys_of_shard(1, 3, 5, "e")
    sharded.add_many(full)
    sharded.add_many(few)
    first = [sharded.get_nowait() for _ in range(10)]
    counts = Counter(shard_of(key, 3) for key in first)
    assert (counts[0], counts[1]) == (5, 5), counts


def test_events_and_the_server_bucket_are_the_queues(make: Callable[..., Any]) -> None:
    q = make(shards=3, rate_limiter=RedisRateLimiter(qps=30.0, burst=10))
    assert q.rate_limiter.qps == 30.0
    assert [s.rate_limiter.qps for s in q._shards] == [10.0] * 3
    assert [s.rate_limiter.burst for s in q._shards] == [3] * 3
    seen: list[tuple[EventKind, Any]] = []
    q.subscribe(lambda e: seen.append((e.kind, e.key)))
    keys = [keys_of_shard(i, 3, 1, "v")[0] for i in range(3)]
    for key in keys:
        q.add(key)
    for _ in keys:
        q.done(q.get_nowait())
    assert Counter(kind for kind, _ in seen) == {
        EventKind.ENQUEUE: 3,
        EventKind.GET: 3,
        EventKind.DONE: 3,
    }
    q.shutdown()
    assert [kind for kind, _ in seen].count(EventKind.SHUTDOWN) == 1


# -- waiting for any shard ---------------------------------------------------------------


def test_a_blocked_get_wakes_on_an_add_to_any_shard(sharded: RedisWorkQueue) -> None:
    for shard in range(3):
        key = keys_of_shard(shard, 3, 1, f"w{shard}-")[0]
        timer = threading.Timer(0.1, sharded.add, (key,))
        timer.start()
        started = time.monotonic()
        assert sharded.get(timeout=WAIT) == key
        assert time.monotonic() - started < 2.0
        sharded.done(key)


def test_interrupt_and_shutdown_wake_a_blocked_get(sharded: RedisWorkQueue) -> None:
    threading.Timer(0.1, sharded.interrupt).start()
    with pytest.raises(Empty):
        sharded.get(timeout=WAIT)
    with pytest.raises(Empty):
        sharded.get(timeout=0.05)
    threading.Timer(0.1, sharded.shutdown).start()
    with pytest.raises(ShutDown):
        sharded.get(timeout=WAIT)
    assert sharded.shutting_down


def test_run_workers_drains_a_sharded_queue(sharded: RedisWorkQueue) -> None:
    keys = [f"r{i}" for i in range(150)]
    sharded.add_many(keys)
    assert sorted(drain(sharded, keys, workers=4)) == sorted(keys)
    s = sharded.stats()
    assert (s.depth, s.processing, s.dones) == (0, 0, len(keys))


def test_arun_workers_drains_a_sharded_queue(valkey_url: str, name: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        q = AsyncRedisWorkQueue(name, client=client, shards=3)
        try:
            keys = [f"a{i}" for i in range(150)]
            await q.add_many(keys)
            assert sorted(await adrain(q, keys, workers=4)) == sorted(keys)
            s = await q.stats()
            assert (s.depth, s.processing, s.dones) == (0, 0, len(keys))
            late = asyncio.get_running_loop().call_later(0.1, asyncio.ensure_future, q.add("z"))
            q2 = AsyncRedisWorkQueue(name, client=client, shards=3)
            assert await q2.get(timeout=WAIT) == "z"
            await q2.done("z")
            late.cancel()
            await q2.aclose()
        finally:
            await q.aclose()
            await client.aclose()

    asyncio.run(main())


# -- on a 3-primary cluster ------------------------------------------------------------------


def spread_name(client: redis.RedisCluster, shards: int) -> str:
    """A queue name whose shards' slots are on as many primaries as can be."""
    for i in range(1000):
        name = f"spread{i}"
        tags = [hash_tag(shard_name(name, s)) for s in range(shards)]
        nodes = {client.get_node_from_key(tag).name for tag in tags}
        if len(nodes) == min(shards, 3):
            return name
    raise AssertionError("no name found")


def test_on_a_cluster_each_shard_is_on_its_own_primary_and_workers_drain_it(
    cluster: ValkeyCluster,
) -> None:
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        name = spread_name(client, 3)
        q = RedisWorkQueue(name, client=client, shards=3)
        keys = [f"c{i}" for i in range(300)]
        q.add_many(keys)
        where = {node.name: client.dbsize(target_nodes=node) for node in client.get_primaries()}
        assert len(where) == 3
        assert all(count > 0 for count in where.values()), where
        assert sorted(drain(q, keys, workers=4)) == sorted(keys)
        s = q.stats()
        assert s.gets == s.dones + s.processing + s.leases_expired == len(keys)
        q.close()
    finally:
        client.close()


def test_on_a_cluster_an_async_get_waits_for_any_primary(cluster: ValkeyCluster) -> None:
    async def main() -> None:
        client = redis.asyncio.RedisCluster.from_url(cluster.url)
        q = AsyncRedisWorkQueue("async-spread", client=client, shards=3)
        try:
            for shard in range(3):
                key = keys_of_shard(shard, 3, 1, f"cw{shard}-")[0]
                loop = asyncio.get_running_loop()
                loop.call_later(0.1, asyncio.ensure_future, q.add(key))
                assert await q.get(timeout=WAIT) == key
                await q.done(key)
            assert (await q.stats()).dones == 3
        finally:
            await q.aclose()
            await client.aclose()

    asyncio.run(main())
