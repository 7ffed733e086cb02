"""Placing a sharded queue's shards on distinct primaries of a 3-primary Valkey Cluster.

The queue names are searched until shards share a primary (CRC16 spreads
three shards over three primaries for about one name in four), so there is
something to place. The Cluster is this module's own: the tests move slots.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner, Result

import keyqueue
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.ops.placement import Move, NotACluster, move_slot, place_shards, plan_moves
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import ValkeyCluster
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

SHARDS = 3
WAIT = 10.0


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-place-") as directory,
        ValkeyCluster(directory, primaries=3, replicas=0) as started,
    ):
        yield started


@pytest.fixture
def client(cluster: ValkeyCluster) -> Iterator[redis.RedisCluster]:
    made = redis.RedisCluster.from_url(cluster.url)
    yield made
    made.close()


def cluster_url(cluster: ValkeyCluster) -> str:
    host, port = cluster.addresses[0]
    return f"redis+cluster://{host}:{port}"


def owners(url: str, queue: str, shards: int = SHARDS) -> list[str]:
    """Each shard's primary as a fresh client of the Cluster sees it."""
    fresh = redis.RedisCluster.from_url(url)
    try:
        return [fresh.get_node_from_key(hash_tag(shard_name(queue, i))).name for i in range(shards)]
    finally:
        fresh.close()


def crowded_name(client: redis.RedisCluster, prefix: str, on_one: int = 2) -> str:
    """A queue name with at least ``on_one`` of its shards on one primary."""
    for i in range(10_000):
        queue = f"{prefix}{i}"
        where = Counter(
            client.get_node_from_key(hash_tag(shard_name(queue, s))).name for s in range(SHARDS)
        )
        if max(where.values()) >= on_one:
            return queue
    raise AssertionError("no name found")


# -- the plan, without I/O -----------------------------------------------------------------


def test_the_plan_moves_the_shards_that_share_a_primary_to_the_emptiest() -> None:
    owners_ = {10: "a", 20: "a", 30: "a"}
    assert plan_moves([10, 20, 30], owners_, ["a", "b", "c"]) == [
        Move(30, (2,), "a", "b"),
        Move(20, (1,), "a", "c"),
    ]
    assert plan_moves([10, 20, 30], {10: "a", 20: "b", 30: "c"}, ["a", "b", "c"]) == []
    # two shards in one slot move together; nothing to gain: no move
    assert plan_moves([10, 10, 30], {10: "a", 30: "b"}, ["a", "b", "c"]) == []
    # more shards than primaries: spread to within one of each other
    six = plan_moves(list(range(6)), dict.fromkeys(range(6), "a"), ["a", "b", "c"])
    after = Counter({"a": 6})
    for move in six:
        after[move.source] -= 1
        after[move.target] += 1
    assert sorted(after.values()) == [2, 2, 2]


# -- on the Cluster ------------------------------------------------------------------------


@pytest.mark.parametrize("atomic", [True, False], ids=["migrateslots", "protocol"])
def test_placed_under_load_each_shard_on_its_own_primary_nothing_lost_nothing_held_twice(
    cluster: ValkeyCluster, client: redis.RedisCluster, atomic: bool
) -> None:
    """Workers run, a producer adds, keys are held across the moves: each
    slot moves by ``CLUSTER MIGRATESLOTS`` or by the migration protocol
    (whose ``ASK`` and ``TRYAGAIN`` the clients follow)."""
    queue = crowded_name(client, f"load-{atomic}-", on_one=3)
    assert len(set(owners(cluster.url, queue))) == 1
    q = RedisWorkQueue(queue, client=client, shards=SHARDS)
    holder = RedisWorkQueue(queue, client=client, shards=SHARDS)
    first = [f"w{i}" for i in range(300)]
    q.add_many(first)
    held = [holder.get_nowait() for _ in range(6)]  # held across the move, done after it
    added = list(first)
    handled: Counter[str] = Counter()
    running: set[str] = set()
    twice: list[str] = []
    lock = threading.Lock()
    started = threading.Event()

    def handle(key: str) -> None:
        with lock:
            if key in running:
                twice.append(key)
            running.add(key)
            handled[key] += 1
            if sum(handled.values()) >= 50:
                started.set()
        time.sleep(0.002)
        with lock:
            running.discard(key)

    placed = threading.Event()

    def produce() -> None:
        i = 0
        while not placed.is_set():
            key = f"p{i}"
            q.add(key)
            added.append(key)
            i += 1
            time.sleep(0.001)

    stop = threading.Event()
    result: list[keyqueue.RunStats] = []
    workers = threading.Thread(
        target=lambda: result.append(keyqueue.run_workers(q, handle, workers=4, stop=stop))
    )
    producer = threading.Thread(target=produce)
    workers.start()
    producer.start()
    try:
        assert started.wait(WAIT)
        moves = place_shards(client, queue, atomic=atomic)
        placed.set()
        producer.join(WAIT)
        assert len(moves) == 2
        assert len(set(owners(cluster.url, queue))) == SHARDS
        for key in held:
            holder.done(key)
        expected = set(added) - set(held)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with lock:
                if set(handled) >= expected:
                    break
            time.sleep(0.01)
    finally:
        placed.set()
        stop.set()
        workers.join(WAIT)
    assert set(handled) == set(added) - set(held)  # nothing lost (the held keys: done)
    assert max(handled.values()) == 1
    assert not twice
    s = q.stats()
    assert (s.depth, s.processing, s.leases_expired) == (0, 0, 0)
    assert s.gets == s.dones == len(added)
    assert result
    assert result[0].errors == 0
    q.delete(force=True)
    q.close()
    holder.close()


def test_the_command_prints_the_plan_with_dry_run_then_places(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    queue = crowded_name(client, "cmd")
    q = RedisWorkQueue(queue, client=client, shards=SHARDS)
    q.add_many([f"k{i}" for i in range(30)])
    url = cluster_url(cluster)
    before = owners(cluster.url, queue)
    plan = invoke("place", queue, "--redis-url", url, "--dry-run", "--json")
    assert plan.exit_code == 0, plan.output
    doc = json.loads(plan.output)
    assert doc["dry_run"] is True
    assert doc["moves"]
    assert owners(cluster.url, queue) == before  # nothing moved
    text = invoke("place", queue, "--redis-url", url, "--dry-run")
    assert "would move" in text.output
    assert "->" in text.output
    done = invoke("place", queue, "--redis-url", url)
    assert done.exit_code == 0, done.output
    assert "moved" in done.output
    assert len(set(owners(cluster.url, queue))) == SHARDS
    assert q.stats().depth == 30  # the keys moved with their slots
    again = invoke("place", queue, "--redis-url", url, "--json")
    assert json.loads(again.output)["moves"] == []
    q.delete(force=True)
    q.close()


def test_an_unsharded_queue_on_a_cluster_has_nothing_to_place(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    q = RedisWorkQueue("single", client=client)
    q.add("k")
    assert place_shards(client, "single") == []
    q.delete(force=True)
    q.close()


def test_a_queue_on_one_server_is_refused_in_one_line(
    make: Callable[..., RedisWorkQueue], valkey_url: str
) -> None:
    q = make(shards=SHARDS)
    q.add("k")
    plain = redis.Redis.from_url(valkey_url)
    with pytest.raises(NotACluster):
        place_shards(plain, q.name)
    plain.close()
    result = invoke("place", q.name, "--redis-url", valkey_url)
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"keyqueue place: error: not a Cluster: the queue {q.name!r} is on one server, "
        "nothing to place"
    ]


def test_an_add_rides_out_a_slot_migrating_longer_than_redis_py_follows_tryagain(
    client: redis.RedisCluster,
) -> None:
    """While the slot migrates by the protocol with its keys on the source,
    the queue's scripts are answered ``TRYAGAIN`` (some of their keys exist,
    some not); redis-py asks again for about 0.4 s, then raises
    ``ClusterError``, which an add rides out until the slot has moved."""
    q = RedisWorkQueue("ride", client=client)
    q.add("first")
    tag = hash_tag("ride")
    slot, source = client.keyslot(tag), client.get_node_from_key(tag)
    target = next(n for n in client.get_primaries() if n.name != source.name)
    ids = [client.execute_command("CLUSTER", "MYID", target_nodes=n) for n in (source, target)]
    client.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[0], target_nodes=target)
    client.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[1], target_nodes=source)
    failed: list[BaseException] = []

    def add() -> None:
        try:
            q.add("second")
        except BaseException as exc:
            failed.append(exc)

    adding = threading.Thread(target=add)
    adding.start()
    time.sleep(1.0)  # the window: longer than redis-py follows TRYAGAIN
    assert adding.is_alive()
    move_slot(client, slot, source, target, atomic=False)
    adding.join(WAIT)
    assert failed == []
    assert q.stats().depth == 2
    q.delete(force=True)
    q.close()


def test_a_placement_interrupted_mid_move_is_completed_by_running_it_again(
    cluster: ValkeyCluster, client: redis.RedisCluster
) -> None:
    """A move by the protocol stopped with some of its slot's keys on each
    side: the same plan again (it is a function of the slots' owners, which
    change only at a move's end) takes the rest across."""
    queue = crowded_name(client, "resume")
    q = RedisWorkQueue(queue, client=client, shards=SHARDS)
    q.add_many([f"k{i}" for i in range(60)])
    (first, *_) = plan = place_shards(client, queue, dry_run=True)
    nodes = {n.name: n for n in client.get_primaries()}
    source, target = nodes[first.source], nodes[first.target]
    ids = [client.execute_command("CLUSTER", "MYID", target_nodes=n) for n in (source, target)]
    client.execute_command(
        "CLUSTER", "SETSLOT", first.slot, "IMPORTING", ids[0], target_nodes=target
    )
    client.execute_command(
        "CLUSTER", "SETSLOT", first.slot, "MIGRATING", ids[1], target_nodes=source
    )
    (one, *rest) = client.execute_command(
        "CLUSTER", "GETKEYSINSLOT", first.slot, 100, target_nodes=source
    )
    assert rest  # some keys stay behind
    client.execute_command(
        "MIGRATE", target.host, target.port, one, 0, 5000, target_nodes=source
    )  # the run stopped here
    assert place_shards(client, queue, dry_run=True) == plan
    assert place_shards(client, queue, atomic=False) == plan
    assert len(set(owners(cluster.url, queue))) == SHARDS
    assert q.stats().depth == 60
    q.delete(force=True)
    q.close()


@pytest.mark.parametrize("atomic", [True, False], ids=["migrateslots", "protocol"])
def test_placed_under_asyncio_workers_nothing_lost_nothing_handled_twice(
    cluster: ValkeyCluster, client: redis.RedisCluster, atomic: bool
) -> None:
    """``arun_workers`` on an asyncio Cluster client (its claims and its
    doorbell waits) while the placement moves the slots from a thread."""
    queue = crowded_name(client, f"async-{atomic}-", on_one=3)

    async def main() -> None:
        aclient = redis.asyncio.RedisCluster.from_url(cluster.url)
        q = AsyncRedisWorkQueue(queue, client=aclient, shards=SHARDS)
        keys = [f"a{i}" for i in range(300)]
        await q.add_many(keys)
        handled: Counter[str] = Counter()
        stop = asyncio.Event()

        async def handle(key: str) -> None:
            handled[key] += 1
            await asyncio.sleep(0.002)
            if set(handled) >= set(keys):
                stop.set()

        placing = asyncio.ensure_future(
            asyncio.to_thread(place_shards, client, queue, atomic=atomic)
        )
        try:
            result = await asyncio.wait_for(keyqueue.arun_workers(q, handle, 4, stop), WAIT)
            assert len(await placing) == 2
            assert set(handled) == set(keys)
            assert max(handled.values()) == 1
            assert result.errors == 0
            s = await q.stats()
            assert s.gets == s.dones == len(keys)
            await q.delete(force=True)
        finally:
            await q.aclose()
            await aclient.aclose()

    asyncio.run(main())
    assert len(set(owners(cluster.url, queue))) == SHARDS
