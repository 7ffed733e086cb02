"""The operator's tools on a sharded queue (``shards=3``), on one server and on a 3-primary Cluster.

``inspect``, ``top`` and ``dashboard`` are never told the shard count: they
read the queue's map on the server (``keyqueue.redis._shard_map.read_map``) and show one
queue, its counters summed and its lists merged, with each shard's sizes and
server beside it. ``top`` and the dashboard read the map again on every
refresh, so a queue made again with another shard count is followed. The
commands run as the other operator's tests run them (CliRunner in process,
``top`` and the dashboard in processes of their own); the Cluster is the
session's (``valkey_cluster``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner, Result
from rich.console import Console

from keyqueue import ItemExponentialFailureRateLimiter, WorkQueue
from keyqueue._console.format import Mode, Output
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.ops import probe, render
from keyqueue.ops.health import Health, Probe, Reading
from keyqueue.ops.shards import ShardRow
from keyqueue.redis import RedisRateLimiter, RedisWorkQueue, shard_of
from keyqueue.redis._schema import KEY_NAMES, hash_tag, key_names
from keyqueue.redis._shard_map import ShardMap, aread_map, read_map
from keyqueue.redis._shards import shard_name
from keyqueue.testing import ValkeyCluster
from tests.support import valkey_server
from tests.support.dashboard import page_token, request, running, state_until
from tests.support.foreground import interrupt, running_top

name = valkey_server.name  # fixtures: a queue of this test's own

SHARDS = 3
KEYS = [f"k{i}" for i in range(12)]  # waiting: in every shard (checked below)


def shard_names(queue: str) -> tuple[str, ...]:
    """The queue names of ``queue``'s shards, shard 0 first."""
    return tuple(shard_name(queue, i) for i in range(SHARDS))


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


def fields_of(line: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in line.split()[1:])


class Where:
    """Where a test's sharded queue lives: the URL the commands take, and its clients."""

    def __init__(self, url: str, client: Any, cluster: bool) -> None:
        self.url = url
        self.client = client
        self.cluster = cluster
        self.made: list[RedisWorkQueue] = []

    def queue(self, queue_name: str, **kwargs: Any) -> RedisWorkQueue:
        q = RedisWorkQueue(queue_name, client=self.client, **kwargs)
        self.made.append(q)
        return q


def spread(client: redis.RedisCluster, base: str) -> str:
    """A name starting with ``base`` whose shards' slots are on three primaries."""
    for i in range(1000):
        candidate = f"{base}-{i}"
        slots = {hash_tag(shard) for shard in shard_names(candidate)}
        if len({client.get_node_from_key(slot).name for slot in slots}) == SHARDS:
            return candidate
    raise AssertionError("no name found")


@pytest.fixture(params=["server", "cluster"])
def where(request: pytest.FixtureRequest, valkey_url: str) -> Iterator[Where]:
    """One valkey-server, or the session's 3-primary Cluster."""
    if request.param == "server":
        client: Any = redis.Redis.from_url(valkey_url)
        at = Where(valkey_url, client, cluster=False)
    else:
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
        client = redis.RedisCluster.from_url(cluster.url)
        host, port = client.get_default_node().host, client.get_default_node().port
        at = Where(f"redis+cluster://{host}:{port}", client, cluster=True)
    yield at
    for q in at.made:
        q.close()
    client.close()


@pytest.fixture
def busy(where: Where, name: str) -> RedisWorkQueue:
    """A queue of 3 shards: ``KEYS`` waiting, ``held`` held by ``worker-1``,
    ``fail`` failing once and in backoff for a minute."""
    queue_name = spread(where.client, name) if where.cluster else name
    q = where.queue(
        queue_name,
        shards=SHARDS,
        holder="worker-1",
        rate_limiter=ItemExponentialFailureRateLimiter(60, 600),
    )
    q.add("fail")
    assert q.get_nowait() == "fail"
    assert q.retry("fail") is True
    q.done("fail")
    q.add("held")
    assert q.get_nowait() == "held"
    q.add_many(KEYS)
    assert {shard_of(k, SHARDS) for k in KEYS} == set(range(SHARDS))
    return q


# -- the map --------------------------------------------------------------------------


def test_read_map_finds_a_sharded_queues_map_and_none_for_any_other_name(
    where: Where, name: str
) -> None:
    assert read_map(where.client, name) is None  # no queue at all
    plain = where.queue(name)
    plain.add("a")
    assert read_map(where.client, name) is None  # an unsharded queue has no map
    sharded = where.queue(f"{name}-s", shards=SHARDS)
    found = read_map(where.client, sharded.name)
    assert found is not None
    assert (found.shards, found.moving_from, found.width) == (SHARDS, None, SHARDS)
    assert found.names(sharded.name) == shard_names(sharded.name)
    for shard in found.names(sharded.name)[1:]:  # an ordinary queue, even with a copy of the map
        assert read_map(where.client, shard) is None


def test_a_map_while_keys_move_names_the_shards_of_both_counts(valkey_url: str, name: str) -> None:
    """As a reshard writes it (``map_from``), and each shard's copy of it:
    a shard is still told apart from a sharded queue."""
    client = redis.Redis.from_url(valkey_url)
    try:
        stats = [key_names(shard_name(name, i))[KEY_NAMES.index("stats")] for i in range(5)]
        for key in stats:
            client.hset(key, mapping={"map_shards": 3, "map_epoch": 2, "map_from": 5})
        found = read_map(client, name)
        assert found == ShardMap(3, 2, 5)
        assert found.width == 5
        assert found.names(name) == tuple(shard_name(name, i) for i in range(5))
        assert all(read_map(client, shard) is None for shard in found.names(name)[1:])
        client.hdel(stats[0], "map_from")
        assert read_map(client, name) == ShardMap(3, 2, None)
    finally:
        client.delete(*stats)
        client.close()


def test_aread_map_reads_the_same_map(valkey_url: str, name: str) -> None:
    q = RedisWorkQueue(name, url=valkey_url, shards=SHARDS)

    async def main() -> ShardMap | None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        try:
            return await aread_map(client, name)
        finally:
            await client.aclose()

    try:
        assert asyncio.run(main()) == read_map(q._client, name)  # type: ignore[attr-defined]
    finally:
        q.close()


# -- inspect ----------------------------------------------------------------------------


def test_inspect_reads_a_sharded_queue_as_one_with_each_shards_sizes_and_server(
    busy: RedisWorkQueue, where: Where
) -> None:
    result = invoke("inspect", busy.name, "--redis-url", where.url, "--json")
    assert result.exit_code == 0, result.output
    shape = json.loads(result.output)
    stats = busy.stats()
    assert shape["stats"]["depth"] == stats.depth == len(KEYS)
    assert shape["stats"]["processing"] == 1
    assert shape["stats"]["gets"] == stats.gets == 2
    assert sorted(w["key"] for w in shape["waiting"]) == sorted(KEYS)
    (held,) = shape["processing"]
    assert (held["key"], held["holder"]) == ("held", "worker-1")
    assert [(f["key"], f["failures"]) for f in shape["failing"]] == [("fail", 1)]
    assert [d["key"] for d in shape["delayed"]] == ["fail"]
    shards = shape["shards"]
    assert [s["name"] for s in shards] == list(shard_names(busy.name))
    assert sum(s["depth"] for s in shards) == len(KEYS)
    assert shards[shard_of("held", SHARDS)]["processing"] == 1
    assert sum(s["delayed"] for s in shards) == sum(s["failing"] for s in shards) == 1
    servers = {s["server"] for s in shards}
    assert len(servers) == (SHARDS if where.cluster else 1)
    if where.cluster:  # each shard names the primary that serves its slot
        primaries = {node.name for node in where.client.get_primaries()}
        assert servers == primaries

    one = invoke("inspect", f"{busy.name}/1", "--redis-url", where.url, "--json")
    alone = json.loads(one.output)  # a shard is an ordinary queue of its own
    assert alone["stats"]["depth"] == shards[1]["depth"]
    assert "shards" not in alone

    out = invoke("inspect", busy.name, "--redis-url", where.url).output
    assert f"queue {busy.name} ({SHARDS} shards) at " in out
    assert f"{len(KEYS)} waiting, 1 processing, 1 delayed, 1 failing" in out
    assert "Shards: 3" in out
    assert "Waiting: 12" in out
    assert "worker-1" in out


def test_add_forget_and_delete_act_on_a_sharded_queue_key_by_key(
    busy: RedisWorkQueue, where: Where
) -> None:
    result = invoke("add", busy.name, "new", "--redis-url", where.url)
    assert result.exit_code == 0, result.output
    assert "waiting now" in result.output
    result = invoke("add", busy.name, "held", "--redis-url", where.url)
    assert "handed out again after its done" in result.output
    assert busy.stats().depth == len(KEYS) + 1
    result = invoke("forget", busy.name, "fail", "--redis-url", where.url)
    assert "forgot 1 failure of fail" in result.output, result.output
    assert busy.snapshot().failing == ()
    result = invoke("delete", busy.name, "--redis-url", where.url, "--yes")
    assert result.exit_code == 1
    assert "1 key(s) are held (by worker-1)" in result.output
    result = invoke("delete", busy.name, "--redis-url", where.url, "--yes", "--force")
    assert result.exit_code == 0, result.output
    assert not busy.exists()
    assert read_map(where.client, busy.name) is None


# -- top ------------------------------------------------------------------------------


def test_top_sums_the_shards_and_follows_the_queue_made_again_with_other_shards(
    valkey_url: str, name: str
) -> None:
    q = RedisWorkQueue(name, url=valkey_url, shards=SHARDS)
    q.add_many(KEYS)
    try:
        with running_top(valkey_url, name, "--interval", "0.2") as proc:
            assert proc.stdout is not None
            first = fields_of(proc.stdout.readline())
            q.delete()
            q.close()
            q = RedisWorkQueue(name, url=valkey_url, shards=2)  # another map: a reshard's stand-in
            q.add_many(["x", "y", "z"])
            while True:
                line = proc.stdout.readline()
                assert line, "top ended before it showed the queue's 2 shards"
                later = fields_of(line)
                if len(later.get("shard_waiting", "").split(",")) == 2:
                    break
            err = interrupt(proc)
    finally:
        q.close()
    assert proc.returncode == 130, err
    assert first["depth"] == str(len(KEYS))
    waiting = [int(n) for n in first["shard_waiting"].split(",")]
    assert len(waiting) == SHARDS
    assert sum(waiting) == len(KEYS)
    assert all(waiting)
    assert first["shard_held"] == "0,0,0"
    assert later["depth"] == "3"
    assert sum(int(n) for n in later["shard_waiting"].split(",")) == 3


# -- the dashboard --------------------------------------------------------------------


def test_the_dashboard_lists_a_sharded_queue_once_with_its_shards_and_acts_on_its_keys(
    busy: RedisWorkQueue, where: Where
) -> None:
    with running(where.url, busy.name) as url:
        state, _ = state_until(url, lambda s: bool(s["queues"][0]["now"]))
        token = page_token(url)
        good = {"Content-Type": "application/json", "X-Keyqueue-Token": token}
        status, answer = request(f"{url}api/retry", {"queue": busy.name, "key": "fail"}, good)
        assert (status, answer["ok"]) == (200, True), answer
        assert "waiting now" in answer["message"]
        after, _ = state_until(
            url, lambda s: "fail" in [r["key"] for r in s["queues"][0]["now"]["waiting"]]
        )
    assert [q["name"] for q in state["queues"]] == [busy.name]  # not name/0 .. name/2
    (queue,) = state["queues"]
    now = queue["now"]
    assert now["stats"]["depth"] == len(KEYS)
    assert now["stats"]["processing"] == 1
    assert [r["key"] for r in now["processing"]] == ["held"]
    assert [s["name"] for s in now["shards"]] == list(shard_names(busy.name))
    assert sum(s["depth"] for s in now["shards"]) == len(KEYS)
    line = now["shown"]["shards"]
    assert line.startswith("shards (waiting/held): 0: ")
    assert line.count(" on ") == (SHARDS if where.cluster else 0)
    assert queue["health"]["state"] in ("starting", "keeping-up", "no-workers")
    assert after["queues"][0]["now"]["failing"] == []
    assert busy.snapshot().failing == ()


# -- the verdict on the summed figures ---------------------------------------------------


def test_the_shards_probes_merge_into_one_debt_and_the_latest_backoff() -> None:
    none = Probe()
    calm = Probe(bucket_tokens=4.0, bucket_last=10.0, last_due=50.0)
    owing = Probe(bucket_tokens=-3.0, bucket_last=12.0, last_due=40.0)
    more = Probe(bucket_tokens=-2.0, bucket_last=11.0, last_due=None)
    assert probe.merge([calm]) is calm
    merged = probe.merge([calm, owing, more, none])
    assert (merged.bucket_tokens, merged.bucket_last, merged.last_due) == (-5.0, 12.0, 50.0)
    assert merged.buckets == 4
    quiet = probe.merge([calm, Probe(bucket_tokens=1.0, bucket_last=9.0), none])
    assert (quiet.bucket_tokens, quiet.bucket_last) == (1.0, 10.0)
    assert probe.merge([none, none]) == Probe(buckets=2)


def test_the_verdict_reads_the_summed_figures_and_every_shards_bucket(
    valkey_url: str, name: str
) -> None:
    """Failures beyond every shard's split bucket (qps/3, burst 1 each) put the
    buckets in debt: the probe reads each shard's and the verdict says so of
    the whole queue, over its summed delayed keys."""
    q = RedisWorkQueue(
        name,
        url=valkey_url,
        shards=SHARDS,
        rate_limiter=RedisRateLimiter(base_delay=60.0, max_delay=600.0, qps=0.3, burst=3),
    )
    client = redis.Redis.from_url(valkey_url)
    try:
        for key in KEYS:
            q.retry(key)
        found = read_map(client, name)
        assert found is not None
        snap = q.snapshot()
        probed = probe.read(client, found.names(name))
        assert probed.buckets == SHARDS
        assert probed.bucket_tokens is not None
        assert probed.bucket_tokens < 0.5 - (len(KEYS) - SHARDS)  # one token each, refilling slowly
        verdict = Health().update(Reading.of(snap, probed))
        assert snap.stats.delayed == len(KEYS)
        assert "retry-debt" in verdict.states
        (debt,) = [f.text for f in verdict.findings if f.state == "retry-debt"]
        assert f"{len(KEYS)} keys delayed" in debt
        assert f"the shards' retry buckets ({SHARDS}) are" in debt
        assert fields_of(render.plain_line(snap, verdict))["delayed"] == str(len(KEYS))
    finally:
        q.close()
        client.close()


def test_tops_frame_and_plain_line_show_each_shard_and_its_primary_when_they_differ() -> None:
    empty = WorkQueue[str]().snapshot()
    snap = dataclasses.replace(empty, stats=dataclasses.replace(empty.stats, depth=5, processing=1))
    verdict = Health().update(Reading.of(snap))
    rows = [
        ShardRow(0, "q", "127.0.0.1:7001", 4, 0, 0, 0),
        ShardRow(1, "q/1", "127.0.0.1:7002", 1, 1, 0, 0),
    ]
    out = Output(Mode.PLAIN)
    out.console = Console(record=True, width=400, color_system=None)
    out.console.print(render.frame("q", "the cluster", snap, verdict, out, 5, None, rows))
    text = out.console.export_text()
    assert "queue q (2 shards) at the cluster: 5 waiting, 1 processing" in text
    assert "shards (waiting/held): 0: 4/0 on 127.0.0.1:7001, 1: 1/1 on 127.0.0.1:7002" in text
    fields = fields_of(render.plain_line(snap, verdict, rows))
    assert (fields["shard_waiting"], fields["shard_held"]) == ("4,1", "0,1")
    one_server = [ShardRow(i, f"q/{i}", "127.0.0.1:6379/0", 1, 0, 0, 0) for i in range(2)]
    assert render.shard_line(one_server) == "shards (waiting/held): 0: 1/0, 1: 1/0"
