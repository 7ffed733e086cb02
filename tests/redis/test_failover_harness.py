"""``ValkeySentinelSet`` and ``ValkeyCluster``: real replicated servers, faults that fail them over.

Each test starts a topology from the wheel's valkey-server, proves the roles
before, causes a failover the way a test of the queue would (``kill -9``,
isolation from the sentinels or from the other Cluster nodes, ``SIGSTOP``),
proves the roles after (the sentinels or the Cluster name another primary,
which says so; the old one, back, says it is a replica, or, isolated, still
says primary: two primaries), runs a queue through the failover with the
client a user would pass, and checks that nothing it started is left
running.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel

from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.testing import ValkeyCluster, ValkeyError, ValkeyNode, ValkeySentinelSet

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def _children() -> set[int]:
    me = os.getpid()
    path = Path(f"/proc/{me}/task/{me}/children")
    return {int(p) for p in path.read_text().split()} if path.exists() else set()


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    before = _children()
    yield
    assert _children() == before


def _queue_round(q: RedisWorkQueue, key: str) -> None:
    q.add(key)
    assert q.get(timeout=5) == key
    q.done(key)


def _eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _sentinels_reach(s: ValkeySentinelSet, node: ValkeyNode) -> bool:
    """Whether every sentinel's record of ``node`` (a replica now, to them) is neither
    down nor disconnected."""
    for sentinel in s.sentinels:
        records = sentinel.command("SENTINEL", "REPLICAS", s.service)
        assert isinstance(records, list)
        for record in records:
            assert isinstance(record, list)
            fields = dict(zip(map(str, record[::2]), map(str, record[1::2]), strict=True))
            if fields["port"] == str(node.port) and (
                "s_down" in fields["flags"] or "disconnected" in fields["flags"]
            ):
                return False
    return True


def _links(s: ValkeySentinelSet, primary: ValkeyNode) -> set[str]:
    """The replication link states of the running nodes other than ``primary``."""
    others = [n for n in s.nodes if n is not primary and n.running]
    return {n.info().get("master_link_status", "?") for n in others}


async def _async_queue_round(s: ValkeySentinelSet, key: str) -> None:
    sentinel = redis.asyncio.sentinel.Sentinel(s.sentinel_addresses, socket_timeout=1.0)
    client = sentinel.master_for(s.service, socket_timeout=2.0, **s.client_kwargs)
    async with AsyncRedisWorkQueue("harness", client=client, lease=5.0) as q:
        await q.add(key)
        assert await q.get(timeout=5) == key
        await q.done(key)
    await client.aclose()
    for each in sentinel.sentinels:
        await each.aclose()


def test_a_sentinel_set_fails_over_a_killed_primary_and_an_isolated_one(
    tmp_path: Path, no_leftovers: None
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        assert s.roles() == {
            "sentinel-0": "sentinel",
            "sentinel-1": "sentinel",
            "sentinel-2": "sentinel",
            "primary": "master",
            "replica-1": "slave",
            "replica-2": "slave",
        }
        first = s.primary()
        assert first is s.nodes[0]
        sentinel = redis.sentinel.Sentinel(s.sentinel_addresses, socket_timeout=1.0)
        client = sentinel.master_for(s.service, socket_timeout=2.0, **s.client_kwargs)
        with RedisWorkQueue("harness", client=client, lease=5.0) as q:
            _queue_round(q, "before")

            first.kill()
            second = s.wait_for_failover(first)
            assert second in s.nodes[1:]
            assert second.role() == "master"
            assert first.role() == "down"
            _queue_round(q, "after-kill")
            asyncio.run(_async_queue_round(s, "after-kill-async"))
            s.restart_as_replica(first)
            assert first.role() == "slave"  # at once: it follows the primary it was given

            s.cut_replication(second)  # its replicas lag it until restored
            assert _eventually(lambda: _links(s, second) == {"down"})
            s.restore_replication(second)
            assert _eventually(lambda: _links(s, second) == {"up"})

            s.isolate_from_sentinels(second)
            third = s.wait_for_failover(second)
            assert third is not second  # either replica: the restarted one is one too
            assert third.role() == "master"
            assert second.role() == "master"  # two primaries: the sentinels cannot reach it
            assert s.sentinel_view() == [third.address] * 3

            time.sleep(1.5)  # the cut outlasts the failover: the sentinels' new links are refused
            s.rejoin_sentinels(second)
            # every sentinel reaches it again at once (none keeps a link its login failed on)
            assert _eventually(lambda: _sentinels_reach(s, second), timeout=3.0)
            s.wait_for_role(second, "slave", timeout=20)
            assert s.primary() is third
        client.close()


def test_a_cluster_fails_over_a_killed_a_frozen_and_a_cut_off_primary(
    tmp_path: Path, no_leftovers: None
) -> None:
    # 2 s: the relays are threads of this process, which also runs the queue
    with ValkeyCluster(tmp_path, node_timeout=2.0, partitionable=True) as c:
        roles = c.roles()
        assert sorted(roles.values()) == ["master"] * 3 + ["slave"] * 3
        tag = "{harness}"
        first = c.primary_for(tag)
        assert first is not None
        assert first in c.nodes[:3]
        client = redis.RedisCluster.from_url(c.url, socket_timeout=2.0)
        with RedisWorkQueue("harness", client=client, lease=5.0) as q:
            _queue_round(q, "before")

            first.kill()
            second = c.wait_for_failover(tag, first)
            assert second in c.nodes[3:]
            first.start()
            c.wait_for_role(first, "slave")  # back from nodes.conf, as a replica
            c.wait_until_ok()

            second.freeze()
            try:
                third = c.wait_for_failover(tag, second)
            finally:
                second.thaw()
            assert third is first
            c.wait_for_role(second, "slave")
            c.wait_until_ok()
            _queue_round(q, "after-freeze")

            c.isolate(third)
            fourth = c.wait_for_failover(tag, third)
            assert fourth is second
            assert third.role() == "master"  # cut off, it still says so; it refuses writes
            direct = redis.Redis(host=third.host, port=third.port)
            with pytest.raises(redis.exceptions.ClusterDownError):
                direct.set("{harness}x", "1")
            direct.close()
            c.rejoin(third)
            c.wait_for_role(third, "slave")
            c.wait_until_ok()
            _queue_round(q, "after-partition")
        client.close()


def test_a_node_that_does_not_come_up_is_an_error_within_seconds(
    tmp_path: Path, no_leftovers: None
) -> None:
    fake = tmp_path / "valkey-server"
    fake.write_text("#!/bin/sh\necho 'bad config' > server.log\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ValkeyError, match="did not answer PING"):
        ValkeySentinelSet(tmp_path / "set", binary=str(fake)).start()
    node = ValkeyNode("lonely", tmp_path / "node")
    with pytest.raises(ValkeyError, match="never started"):
        _ = node.url
