"""A queue of 6 shards on a 6-primary Valkey Cluster, each shard on a primary of its own.

Few queue names put 6 shards on 6 evenly split primaries (CRC16 is linear:
the slots of ``{name/1}`` ... ``{name/5}`` are one slot XOR fixed offsets;
shard 0 is ``{name}``), so the fixture
places shard ``i``'s empty slot on primary ``i`` (``ValkeyCluster.move_slot``),
as an operator would. On it: the per-key rules (coalescing, one holder,
exactly one redelivery after done) for a key of every shard, and a drain by
``run_workers``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from keyqueue import Empty
from keyqueue.redis import RedisWorkQueue, shard_of
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import ValkeyCluster
from tests.redis.test_shards import drain

SHARDS = 6
NAME = "six"


@pytest.fixture(scope="module")
def placed(valkey_cluster6: ValkeyCluster) -> ValkeyCluster:
    """The cluster with shard ``i`` of ``NAME`` on primary ``i``."""
    for i in range(SHARDS):
        valkey_cluster6.move_slot(
            valkey_cluster6.slot(hash_tag(shard_name(NAME, i))), valkey_cluster6.nodes[i]
        )
    return valkey_cluster6


@pytest.fixture
def client(placed: ValkeyCluster) -> Iterator[redis.RedisCluster]:
    client = redis.RedisCluster.from_url(placed.url)
    yield client
    client.close()


@pytest.fixture
def queues(client: redis.RedisCluster) -> Iterator[list[RedisWorkQueue]]:
    """Two clients of the queue (two holders); emptied and closed after the test."""
    made = [RedisWorkQueue(NAME, client=client, shards=SHARDS) for _ in range(2)]
    yield made
    made[0].delete(force=True)
    for q in made:
        q.close()


def one_key_per_shard() -> list[str]:
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < SHARDS:
        keys.setdefault(shard_of(f"k{i}", SHARDS), f"k{i}")
        i += 1
    return [keys[s] for s in range(SHARDS)]


def test_each_shard_is_on_a_primary_of_its_own(
    placed: ValkeyCluster, client: redis.RedisCluster, queues: list[RedisWorkQueue]
) -> None:
    keys = one_key_per_shard()
    queues[0].add_many(keys)
    owners = [client.get_node_from_key(hash_tag(shard_name(NAME, i))).port for i in range(SHARDS)]
    assert owners == [node.port for node in placed.nodes[:SHARDS]]
    assert all(client.dbsize(target_nodes=node) > 0 for node in client.get_primaries())


def test_per_key_rules_hold_on_every_shard(queues: list[RedisWorkQueue]) -> None:
    a, b = queues
    keys = one_key_per_shard()
    for key in keys * 2:
        a.add(key)
    s = a.stats()
    assert (s.depth, s.coalesced) == (SHARDS, SHARDS)
    held = sorted(a.get_nowait() for _ in keys)
    assert held == sorted(keys)
    for key in keys:
        b.add(key)  # marked while held: neither client gets it again now
    with pytest.raises(Empty):
        b.get_nowait()
    for key in keys:
        a.done(key)
    assert sorted(b.get_nowait() for _ in keys) == sorted(keys)  # exactly one redelivery
    for key in keys:
        b.done(key)
    with pytest.raises(Empty):
        a.get_nowait()
    s = a.stats()
    assert (s.gets, s.dones, s.redeliveries) == (2 * SHARDS, 2 * SHARDS, SHARDS)


def test_run_workers_drains_all_six_shards(queues: list[RedisWorkQueue]) -> None:
    q = queues[0]
    keys = [f"r{i}" for i in range(600)]
    q.add_many(keys)
    assert sorted(drain(q, keys, workers=6)) == sorted(keys)
    s = q.stats()
    assert s.gets == s.dones + s.processing + s.leases_expired == len(keys)
    assert (s.depth, s.processing) == (0, 0)
