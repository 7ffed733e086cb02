"""The Redis queue on a 3-master Valkey Cluster, through redis-py's cluster clients.

Every Redis key of a queue carries the hash tag ``{name}``, so a queue lives in
one slot, on one master, and its scripts (which name all its keys) run there.
Three queues whose slots fall on the three masters each work; every key one of
them wrote is in one slot (``CLUSTER KEYSLOT``), on one node. The cluster
(tests/support/valkey_server.py ``ValkeyCluster``) is shared by this module's tests and
stopped at its end, also when a test fails.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.cluster import ClusterNode
from redis.crc import key_slot

import keyqueue
from keyqueue import ItemFastSlowRateLimiter, ShutDown
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from tests.support.valkey_server import ValkeyCluster

WAIT = 10.0
NOW = ItemFastSlowRateLimiter(0, 0, 1)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-cluster-") as directory,
        ValkeyCluster(directory, masters=3) as started,
    ):
        yield started


@pytest.fixture
def client(cluster: ValkeyCluster) -> Iterator[redis.RedisCluster]:
    c = redis.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    yield c
    c.close()


def names_on_each_master(cluster: ValkeyCluster, prefix: str) -> list[str]:
    """A queue name for each master: the slot of its hash tag is in that master's range."""
    found: list[str] = []
    for first, last in cluster.ranges():
        found.append(
            next(
                f"{prefix}{i}"
                for i in range(10_000)
                if first <= key_slot(f"{prefix}{i}".encode()) <= last
            )
        )
    return found


def queue_keys(client: redis.RedisCluster, name: str) -> dict[str, list[str]]:
    """Every Redis key of queue ``name`` on every node, by node."""
    keys: dict[str, list[str]] = {}
    for node in client.get_nodes():
        found = client.scan_iter(match=f"keyqueue:{{{name}}}:*", target_nodes=node)
        keys[node.name] = sorted(k.decode() for k in found)
    return keys


def wait_for_getter(q: RedisWorkQueue) -> None:
    """Wait until a thread of ``q`` blocks in get (BLPOP)."""
    deadline = time.monotonic() + WAIT
    while not q._getters:
        assert time.monotonic() < deadline, "the getter did not block"
        time.sleep(0.001)


def _until_shut_down(q: RedisWorkQueue, stopped: list[BaseException]) -> None:
    try:
        q.get(timeout=WAIT)
    except ShutDown as exc:
        stopped.append(exc)


def test_three_queues_each_work_on_their_own_master_through_redis_cluster(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    names = names_on_each_master(cluster, "sync")
    masters = {client.get_node_from_key(f"{{{name}}}").name for name in names}
    assert len(masters) == 3
    for name in names:
        producer = RedisWorkQueue(name, client=client, lease=5.0, rate_limiter=NOW)
        worker = RedisWorkQueue(name, client=client, lease=5.0, rate_limiter=NOW)
        producer.add("a")
        producer.add("a")  # coalesced
        assert worker.get(timeout=WAIT) == "a"
        producer.add("a")  # marked while held
        worker.done("a")  # redelivered once
        assert worker.get(timeout=WAIT) == "a"
        assert worker.retry("a") is True
        worker.done("a")
        assert worker.get(timeout=WAIT) == "a"  # the retry: marked while held, redelivered
        worker.forget("a")
        worker.done("a")

        woke: list[str] = []
        getter = threading.Thread(
            target=lambda w=worker, woke=woke: woke.append(w.get(timeout=WAIT))
        )
        getter.start()
        wait_for_getter(worker)
        producer.add("b")  # the doorbell (BLPOP on the queue's slot) wakes it
        getter.join(WAIT)
        assert woke == ["b"]
        worker.done("b")
        producer.add_after("c", 0.05)
        assert worker.get(timeout=WAIT) == "c"  # the getter's timer releases it on time
        worker.done("c")

        s = producer.stats()
        assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (6, 3, 1, 2)
        assert (s.gets, s.dones, s.redeliveries, s.depth, s.processing) == (5, 5, 2, 0, 0)

        stopped: list[BaseException] = []
        getter = threading.Thread(target=lambda w=worker, out=stopped: _until_shut_down(w, out))
        getter.start()
        wait_for_getter(worker)
        worker.shutdown()  # per client: rings its wake-up list through a cluster pipeline
        getter.join(WAIT)
        assert len(stopped) == 1
        producer.close()
        worker.close()


def test_every_redis_key_of_a_queue_is_in_one_slot_on_one_node_of_the_cluster(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    for name in names_on_each_master(cluster, "slots"):
        slot = key_slot(name.encode())
        q = RedisWorkQueue(name, client=client, lease=5.0, max_retries=5)
        # Every key the scripts and the client use (the get and claim records last).
        named = [*q._keys, q._wake, q._script_keys["get"][-1], q._script_keys["claim"][-1]]
        assert {client.cluster_keyslot(key) for key in named} == {slot}  # CLUSTER KEYSLOT
        q.add("a")
        q.add("b")
        q.add_after("c", 60)
        assert q.get(timeout=WAIT) == "a"
        q.add("a")
        assert q.retry("b") is True  # the failures, requeues and bucket hashes

        by_node = queue_keys(client, name)
        home = client.get_node_from_key(f"{{{name}}}").name
        written = by_node.pop(home)
        assert all(found == [] for found in by_node.values()), by_node
        assert len(written) >= 10, written
        assert set(written) <= set(named), written
        assert {client.cluster_keyslot(key) for key in written} == {slot}
        q.close()


async def test_async_queues_work_through_redis_asyncio_cluster(cluster: ValkeyCluster) -> None:
    client = redis.asyncio.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in cluster.startup_nodes]
    )
    try:
        for name in names_on_each_master(cluster, "async"):
            producer = AsyncRedisWorkQueue(name, client=client, lease=5.0, rate_limiter=NOW)
            worker = AsyncRedisWorkQueue(name, client=client, lease=5.0, rate_limiter=NOW)
            getter = asyncio.create_task(worker.get(timeout=WAIT))
            await asyncio.sleep(0.05)  # let it block in BLPOP (it would find the key anyway)
            await producer.add("a")
            assert await asyncio.wait_for(getter, WAIT) == "a"
            await producer.add("a")
            await worker.done("a")
            assert await worker.get(timeout=WAIT) == "a"
            await worker.done("a")
            s = await producer.stats()
            assert (s.adds, s.gets, s.dones, s.redeliveries, s.depth) == (2, 2, 2, 1, 0)
            await producer.aclose()
            await worker.aclose()
    finally:
        await client.aclose()


async def test_a_queue_holding_only_dead_keys_exists_through_a_cluster_client(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    """``exists`` reads the stats hash and the dead set in one EXISTS, both in
    the queue's slot: a give-up alone makes the queue exist, also on a Cluster."""
    [name, *_] = names_on_each_master(cluster, "dead")
    q = RedisWorkQueue(name, client=client)
    assert not q.exists()
    q.give_up("k", "manual")
    client.delete(f"keyqueue:{{{name}}}:stats")  # the dead set alone
    assert q.exists()
    aclient = redis.asyncio.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in cluster.startup_nodes]
    )
    try:
        aq = AsyncRedisWorkQueue(name, client=aclient)
        assert await aq.exists()
        assert await aq.delete() is True
        assert not await aq.exists()
        await aq.aclose()
    finally:
        await aclient.aclose()
    q.close()


def test_run_workers_on_a_cluster_queue(cluster: ValkeyCluster, client: redis.RedisCluster) -> None:
    [name, *_] = names_on_each_master(cluster, "runner")
    q = RedisWorkQueue(name, client=client, lease=5.0)
    handled: list[str] = []
    for i in range(20):
        q.add(f"k{i}")
    stop = threading.Event()
    runner = threading.Thread(
        target=keyqueue.run_workers, args=(q, handled.append), kwargs={"workers": 4, "stop": stop}
    )
    runner.start()
    deadline = time.monotonic() + WAIT
    while len(handled) < 20:
        assert time.monotonic() < deadline, handled
        time.sleep(0.005)
    stop.set()
    runner.join(WAIT)
    assert sorted(handled) == sorted(f"k{i}" for i in range(20))
    q.close()


async def test_arun_workers_claims_in_batches_on_a_cluster_queue(cluster: ValkeyCluster) -> None:
    client = redis.asyncio.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in cluster.startup_nodes]
    )
    try:
        [name, *_] = names_on_each_master(cluster, "arunner")
        q = AsyncRedisWorkQueue(name, client=client, lease=5.0)
        keys = [f"k{i}" for i in range(40)]
        await q.add_many(keys)
        handled: list[str] = []
        stop = asyncio.Event()

        async def handle(key: str) -> None:
            handled.append(key)
            if len(handled) == len(keys):
                stop.set()

        stats = await asyncio.wait_for(keyqueue.arun_workers(q, handle, 8, stop), WAIT)
        assert sorted(handled) == sorted(keys)
        assert stats.succeeded == len(keys)
        s = await q.stats()
        assert (s.gets, s.dones, s.processing, s.depth) == (40, 40, 0, 0)
        await q.aclose()
    finally:
        await client.aclose()
