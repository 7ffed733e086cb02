"""Clients that follow a failover: URLs that name a Sentinel service or a Cluster, and messages
that name the server that answered.

``client_from_url`` reads each URL form without connecting (its errors name the problem, never
a password); on real servers (``ValkeySentinelSet``, ``ValkeyCluster``) both queues made from
those URLs work, and the errors, ``describe`` and ``inspect`` name the Sentinel service and the
primary it named, not redis-py's ``localhost:6379`` defaults. Through a ``kill -9`` of the
primary: adds ride it out, workers on both fronts follow, the dashboard reads the promoted
replica, and the old primary that comes back as a replica is sent no write.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.sentinel
from click.testing import CliRunner

from keyqueue import arun_workers, run_workers
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import (
    AsyncRedisWorkQueue,
    RedisWorkQueue,
    aclose_client,
    client_from_url,
    close_client,
    describe,
)
from keyqueue.redis._ride import Ride, misrouted, reroute
from keyqueue.testing import ValkeyCluster, ValkeyNode, ValkeySentinelSet
from tests.support.dashboard import running, state_until

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the harness reads /proc")


def sentinel_url(s: ValkeySentinelSet, scheme: str = "redis+sentinel") -> str:
    user, password = s.credentials
    hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
    return f"{scheme}://{user}:{password}@{hosts}/{s.service}"


def test_a_sentinel_that_does_not_answer_is_an_error_within_seconds() -> None:
    """Without a socket timeout in the URL, a sentinel gets 2 s to accept and 2 s
    to answer (redis-py's own default waits for ever); the URL's own wins."""
    for asyncio_client in (False, True):
        client = client_from_url("redis+sentinel://127.0.0.1:26380/orders", asyncio=asyncio_client)
        sentinel = client.connection_pool.sentinel_manager.sentinels[0]
        kwargs = sentinel.get_connection_kwargs()
        assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 2.0)
    client = client_from_url("redis+sentinel://127.0.0.1:26380/orders?socket_timeout=7")
    kwargs = client.connection_pool.sentinel_manager.sentinels[0].get_connection_kwargs()
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7.0, 2.0)
    close_client(client)


def test_a_sentinel_url_names_its_sentinels_service_database_and_credentials() -> None:
    url = (
        "redis+sentinel://app:secret@127.0.0.1:26380,127.0.0.2,[::1]:26381/orders/2"
        "?sentinel_username=watch&sentinel_password=s3&socket_timeout=2"
    )
    client = client_from_url(url)
    pool = client.connection_pool
    assert pool.service_name == "orders"
    kwargs = pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("app", "secret", 2)
    assert kwargs["socket_timeout"] == 2.0
    sentinels = pool.sentinel_manager.sentinels
    assert [
        (s.get_connection_kwargs()["host"], s.get_connection_kwargs()["port"]) for s in sentinels
    ] == [
        ("127.0.0.1", 26380),
        ("127.0.0.2", 26379),
        ("::1", 26381),
    ]
    first = sentinels[0].get_connection_kwargs()
    assert (first["username"], first["password"], first["socket_timeout"]) == ("watch", "s3", 2.0)
    assert describe(client) == "sentinel orders/2 via 127.0.0.1:26380,…"  # asked nothing yet
    close_client(client)
    tls = client_from_url("rediss+sentinel://127.0.0.1/orders", asyncio=True)
    assert isinstance(tls, redis.asyncio.Redis)
    assert tls.connection_pool.connection_class.__name__ == "SentinelManagedSSLConnection"
    assert (
        tls.connection_pool.sentinel_manager.sentinels[0].connection_pool.connection_class.__name__
        == "SSLConnection"
    )
    asyncio.run(aclose_client(tls))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+sentinel://u:hunter2@127.0.0.1:26379", "no service name"),
        ("redis+sentinel://127.0.0.1:26379/svc/x", "the database 'x' is not a number"),
        (
            "redis+sentinel://127.0.0.1:port/svc",
            "the port 'port' of '127.0.0.1:port' is not a number",
        ),
        ("redis+sentinel:///svc", "no host:port"),
        ("redis+sentinel://h/svc?socket_timeout=soon", "Invalid value for 'socket_timeout'"),
        ("redis+cluster://127.0.0.1:7000/3", "a Cluster has database 0 only"),
        ("redis+cluster://h?sentinel_password=hunter2", "sentinel_password is for redis+sentinel"),
        ("redis://h:6379/zero", "the database 'zero' is not a number"),
        ("http://h:6379", "is not a redis://host:port/db, rediss://, unix://, redis+sentinel://"),
    ],
)
def test_a_url_keyqueue_cannot_read_is_one_line_naming_the_problem(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]*$") as raised:
        client_from_url(url)
    assert problem in str(raised.value)
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ValueError, match="RedisWorkQueue"):
        RedisWorkQueue("q", url=url)


class _Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError("Connection refused"),
        redis.sentinel.MasterNotFoundError("No master found for 'keyqueue'"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.ReadOnlyError(
            "You can't write against a read only replica.", status_code="READONLY"
        ),
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
        redis.exceptions.ResponseError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterDownError("The cluster is down"),
    ],
    ids=lambda e: type(e).__name__ + ":" + str(e).split()[0],
)
def test_an_add_asks_again_with_a_doubling_pause_until_add_timeout(exc: Exception) -> None:
    now = _Now()
    ride = Ride(5.0, now)
    pauses = []
    while (pause := ride.pause(exc)) is not None:
        pauses.append(pause)
        now.t += pause
    assert 0.025 <= pauses[0] <= 0.05
    assert all(0.5 <= p <= 1.0 for p in pauses[6:-1])  # 0.05 doubled to 1 s, then 1 s
    assert now.t == pytest.approx(105.0)  # the last pause ends at add_timeout, not after
    assert misrouted(exc) == (
        str(exc).startswith("NOREPLICAS")
        or type(exc).__name__ in ("ReadOnlyError", "MasterDownError")
    )


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.AuthenticationError("invalid username-password pair"),
        redis.exceptions.ResponseError("ERR unknown command"),
        redis.exceptions.ResponseError("WRONGTYPE Operation against a key"),
        ValueError("a bug"),
    ],
)
def test_an_add_raises_at_once_what_asking_again_would_not_mend(exc: Exception) -> None:
    assert Ride(30.0).pause(exc) is None
    assert Ride(0.0).pause(redis.exceptions.ConnectionError("down")) is None  # add_timeout=0


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("5", TypeError),
        (True, TypeError),
    ],
)
def test_add_timeout_is_finite_seconds_at_least_zero(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="add_timeout must be a finite number of seconds >= 0"):
        RedisWorkQueue("q", url="redis://127.0.0.1:1/0", add_timeout=value)  # type: ignore[arg-type]


def test_a_command_that_cannot_reach_the_sentinels_names_them_in_one_line() -> None:
    url = "redis+sentinel://app:hunter2@127.0.0.1:1,127.0.0.1:2/orders?socket_connect_timeout=1"
    result = CliRunner().invoke(keyqueue_cli, ["inspect", "q", "--redis-url", url])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    assert "cannot reach the server at sentinel orders via 127.0.0.1:1,…" in lines[0]
    assert "No master found for 'orders'" in lines[0]
    assert "hunter2" not in lines[0]
    with pytest.raises(TypeError, match="url must be a str"):
        RedisWorkQueue("q", url=b"redis://127.0.0.1:1/0")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeySentinelSet]:
    with ValkeySentinelSet(tmp_path_factory.mktemp("set"), down_after=1.0) as s:
        yield s


@linux_only
def test_both_queues_on_a_sentinel_url_reach_the_primary_and_name_it(
    sentinel_set: ValkeySentinelSet,
) -> None:
    s = sentinel_set
    primary = s.wait_for_primary()
    via = f"sentinel {s.service} via {s.sentinels[0].host}:{s.sentinels[0].port},…"
    named = f"{via} (primary {primary.host}:{primary.port})"
    with RedisWorkQueue("follow-url", url=sentinel_url(s)) as q:
        q.add("k")
        assert q.get(timeout=5) == "k"
        q.done("k")
        assert describe(q._client) == named

    async def rounds() -> None:
        async with AsyncRedisWorkQueue("follow-url", url=sentinel_url(s)) as aq:
            await aq.add("k")
            assert await aq.get(timeout=5) == "k"
            await aq.done("k")
            assert describe(aq._client) == named

    asyncio.run(rounds())
    client = client_from_url(sentinel_url(s))
    client.ping()
    idle = client.connection_pool._available_connections
    assert len(idle) == 1
    reroute(client)  # as after NOREPLICAS: the next connection asks the sentinels
    assert idle[0]._sock is None
    assert client.ping()
    assert describe(client) == named
    close_client(client)
    result = CliRunner().invoke(
        keyqueue_cli, ["inspect", "follow-nothing", "--redis-url", sentinel_url(s)]
    )
    assert result.exit_code == 1
    assert f"no queue 'follow-nothing' at {named}" in result.output
    wrong = sentinel_url(s).replace(f"/{s.service}", "/nobody")
    with pytest.raises(
        redis.exceptions.ConnectionError, match=r"sentinel nobody via .*No master found"
    ):
        RedisWorkQueue("follow-url", url=wrong)


@linux_only
def test_both_queues_on_a_cluster_url_reach_the_queue_s_primary(tmp_path: Path) -> None:
    with ValkeyCluster(tmp_path, node_timeout=1.0) as c:
        hosts = ",".join(f"{h}:{p}" for h, p in c.addresses[:2])
        url = f"redis+cluster://{hosts}"
        with RedisWorkQueue("follow-url", url=url) as q:
            q.add("k")
            assert q.get(timeout=5) == "k"
            q.done("k")
            assert describe(q._client).startswith("the cluster at ")

        async def rounds() -> None:
            async with AsyncRedisWorkQueue("follow-url", url=url) as aq:
                await aq.add("j")
                assert await aq.get(timeout=5) == "j"
                await aq.done("j")

        asyncio.run(rounds())
        result = CliRunner().invoke(keyqueue_cli, ["inspect", "follow-url", "--redis-url", url])
        assert result.exit_code == 0, result.output


def _until(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _produce_through(client: Any, fail: Callable[[], ValkeyNode]) -> ValkeyNode:
    """A producer adding distinct keys every 5 ms and 2 workers, all on ``client``,
    while ``fail()`` causes a failover (and returns the new primary); then the
    producer stops and every acknowledged add must be processed. No add may raise."""
    q = RedisWorkQueue("follow-kill", client=client, lease=3.0, add_timeout=20.0)
    acked: list[str] = []
    processed: set[str] = set()
    errors: list[BaseException] = []
    producing, stop = threading.Event(), threading.Event()
    producing.set()

    def produce() -> None:
        while producing.is_set():
            key = f"k{len(acked)}"
            try:
                q.add(key)
            except BaseException as exc:
                errors.append(exc)
                return
            acked.append(key)
            time.sleep(0.005)

    def handle(key: str) -> None:
        processed.add(key)

    workers = threading.Thread(target=run_workers, args=(q, handle, 2, stop))
    producer = threading.Thread(target=produce)
    workers.start()
    producer.start()
    try:
        _until("the producer's first adds", lambda: len(acked) >= 20, 5)
        second = fail()
        at_failover = len(acked)
        _until("adds to the new primary", lambda: len(acked) >= at_failover + 20, 10)
    finally:
        producing.clear()
        producer.join(timeout=25)
    try:
        _until("every acknowledged add processed", lambda: processed >= set(acked), 15)
    finally:
        stop.set()
        workers.join(timeout=10)
        q.close()
    assert errors == []
    return second


@linux_only
def test_adds_ride_out_a_killed_primary_and_workers_on_the_same_client_process_them(
    tmp_path: Path,
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        assert first is s.nodes[0]
        assert first.role() == "master"
        client = client_from_url(sentinel_url(s) + "?socket_timeout=2")

        def kill() -> ValkeyNode:
            first.kill()
            return s.wait_for_failover(first, timeout=15)

        try:
            second = _produce_through(client, kill)
        finally:
            close_client(client)
        assert second in s.nodes[1:]
        assert second.role() == "master"
        assert first.role() == "down"
        assert describe(client).endswith(f"(primary {second.host}:{second.port})")


@linux_only
def test_adds_ride_out_a_killed_cluster_primary(tmp_path: Path) -> None:
    with ValkeyCluster(tmp_path, node_timeout=1.0) as c:
        tag = "{follow-kill}"
        first = c.primary_for(tag)
        assert first in c.nodes[:3]
        client = client_from_url(
            f"redis+cluster://{c.nodes[0].host}:{c.nodes[0].port}?socket_timeout=2"
        )

        def kill() -> ValkeyNode:
            assert first is not None
            first.kill()
            return c.wait_for_failover(tag, first, timeout=15)

        try:
            second = _produce_through(client, kill)
        finally:
            close_client(client)
        assert second in c.nodes[3:]
        assert second.role() == "master"


@linux_only
def test_async_adds_ride_out_a_killed_primary_and_async_workers_process_them(
    tmp_path: Path,
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        assert first is s.nodes[0]
        assert first.role() == "master"

        async def run() -> tuple[list[str], set[str], list[BaseException], object]:
            client = client_from_url(sentinel_url(s) + "?socket_timeout=2", asyncio=True)
            q = AsyncRedisWorkQueue("follow-kill", client=client, lease=3.0, add_timeout=20.0)
            acked: list[str] = []
            processed: set[str] = set()
            errors: list[BaseException] = []
            producing, stop = asyncio.Event(), asyncio.Event()

            async def produce() -> None:
                while not producing.is_set():
                    key = f"k{len(acked)}"
                    try:
                        await q.add(key)
                    except BaseException as exc:
                        errors.append(exc)
                        return
                    acked.append(key)
                    await asyncio.sleep(0.005)

            async def handle(key: str) -> None:
                processed.add(key)

            async def until(what: str, done: Callable[[], bool], timeout: float) -> None:
                async with asyncio.timeout(timeout):
                    while not done():
                        await asyncio.sleep(0.05)

            workers = asyncio.create_task(arun_workers(q, handle, 2, stop))
            producer = asyncio.create_task(produce())
            try:
                await until("the first adds", lambda: len(acked) >= 20, 5)
                first.kill()
                second = await asyncio.to_thread(s.wait_for_failover, first, 15)
                at_failover = len(acked)
                await until("adds to the new primary", lambda: len(acked) >= at_failover + 20, 10)
            finally:
                producing.set()
                await asyncio.wait_for(producer, 25)
            try:
                await until("every acknowledged add processed", lambda: processed >= set(acked), 15)
            finally:
                stop.set()
                await asyncio.wait_for(workers, 10)
                await q.aclose()
                await aclose_client(client)
            return acked, processed, errors, second

        acked, processed, errors, second = asyncio.run(run())
        assert errors == []
        assert processed >= set(acked)
        assert second in s.nodes[1:]
        assert isinstance(second, ValkeyNode)
        assert second.role() == "master"
        assert first.role() == "down"


@linux_only
def test_the_dashboard_on_a_sentinel_url_answers_through_a_promotion_and_names_the_new_primary(
    tmp_path: Path,
) -> None:
    """``keyqueue dashboard --redis-url redis+sentinel://…``: its API answers throughout a
    ``kill -9`` of the primary (a read that fails is the queue's error, naming the
    Sentinel service), then reads the queue on the promoted replica and names it."""
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        url = sentinel_url(s)
        # redis-py moves the sentinel that answered to the front of its list,
        # and describe names the first: any of the set's may be named.
        vias = [f"sentinel {s.service} via {n.host}:{n.port},…" for n in s.sentinels]
        with RedisWorkQueue("follow-dashboard", url=url) as q:
            q.add_many(["a", "b", "c"])
        with running(url, "follow-dashboard") as page:
            state, _ = state_until(page, lambda st: st["header"]["state"] == "ok")
            (item,) = state["queues"]
            assert item["now"]["stats"]["depth"] == 3
            assert item["server"] in [f"{via} (primary {first.host}:{first.port})" for via in vias]
            first.kill()
            second = s.wait_for_failover(first, timeout=15)
            with RedisWorkQueue("follow-dashboard", url=url, add_timeout=10.0) as q:
                q.add_many(["d", "e"])
            state, seen = state_until(
                page,
                lambda st: (
                    st["header"]["state"] == "ok" and st["queues"][0]["now"]["stats"]["depth"] == 5
                ),
            )
        (item,) = state["queues"]
        assert item["server"] in [f"{via} (primary {second.host}:{second.port})" for via in vias]
        assert {w["key"] for w in item["now"]["waiting"]} == {"a", "b", "c", "d", "e"}
        errors = [st["queues"][0]["error"] for st in seen if st["queues"][0]["error"]]
        assert all(
            any(e.startswith(f"cannot read the queue at {via}") for via in vias) for e in errors
        ), errors


def _replica_took_no_client_write(node: ValkeyNode) -> None:
    """``node`` ran no script, no doorbell ``BLPOP`` and refused nothing ``READONLY``
    since it started: no client sent it a write (its primary's stream is not scripts)."""
    commands = node.info("commandstats")
    assert not {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_blpop"} & commands.keys(), commands
    assert "errorstat_READONLY" not in node.info("errorstats")


@linux_only
def test_a_primary_back_as_a_replica_under_running_workers_loses_nothing_and_takes_no_write(
    tmp_path: Path,
) -> None:
    """``run_workers`` and ``arun_workers`` (each on a Sentinel client of its own, each
    on a queue of its own) through a ``kill -9`` of the primary and its return as a
    replica of the promoted one: they keep processing, every acknowledged add is
    processed, and the returned node is never sent a write."""
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        url = sentinel_url(s) + "?socket_timeout=2"
        client = client_from_url(url)
        names = ("follow-back-sync", "follow-back-async")
        producing = [RedisWorkQueue(n, client=client, lease=3.0, add_timeout=20.0) for n in names]
        acked: list[tuple[int, float]] = []  # (key number, when acknowledged)
        processed: dict[str, dict[str, float]] = {n: {} for n in names}
        errors: list[BaseException] = []
        adding, stop = threading.Event(), threading.Event()
        adding.set()

        def produce() -> None:
            while adding.is_set():
                i = len(acked)
                try:
                    producing[i % 2].add(f"k{i}")
                except BaseException as exc:
                    errors.append(exc)
                    return
                acked.append((i, time.monotonic()))
                time.sleep(0.005)

        def sync_handle(key: str) -> None:
            processed[names[0]][key] = time.monotonic()

        def async_side() -> None:
            async def main() -> None:
                aclient = client_from_url(url, asyncio=True)
                aq = AsyncRedisWorkQueue(names[1], client=aclient, lease=3.0)
                stopping = asyncio.Event()

                async def handle(key: str) -> None:
                    processed[names[1]][key] = time.monotonic()

                async def watch() -> None:
                    await asyncio.to_thread(stop.wait)
                    stopping.set()

                watcher = asyncio.create_task(watch())
                try:
                    await arun_workers(aq, handle, 2, stopping)
                finally:
                    await watcher
                    await aq.aclose()
                    await aclose_client(aclient)

            asyncio.run(main())

        workers = [
            threading.Thread(target=run_workers, args=(producing[0], sync_handle, 2, stop)),
            threading.Thread(target=async_side),
        ]
        producer = threading.Thread(target=produce)
        for thread in [*workers, producer]:
            thread.start()
        try:
            _until("the producer's first adds", lambda: len(acked) >= 20, 5)
            first.kill()
            second = s.wait_for_failover(first, timeout=15)
            s.restart_as_replica(first)
            _until(
                "the old primary replicating the new one",
                lambda: first.info().get("master_link_status") == "up",
                10,
            )
            back = time.monotonic()
            at_back = len(acked)
            _until("adds after its return", lambda: len(acked) >= at_back + 100, 10)
        finally:
            adding.clear()
            producer.join(timeout=25)
        try:
            wanted = {n: {f"k{i}" for i, _ in acked if i % 2 == j} for j, n in enumerate(names)}
            _until(
                "every acknowledged add processed",
                lambda: all(processed[n].keys() >= wanted[n] for n in names),
                15,
            )
        finally:
            stop.set()
            for thread in workers:
                thread.join(timeout=10)
            for q in producing:
                q.close()
            close_client(client)
        assert errors == []
        for n in names:  # each front took keys added after the old primary came back
            assert any(t > back for t in processed[n].values()), n
        assert first.role() == "slave"
        assert second.role() == "master"
        _replica_took_no_client_write(first)
