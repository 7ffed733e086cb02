"""Clients that follow a failover: URLs that name a Sentinel service or a Cluster, and messages
that name the server that answered.

``client_from_url`` reads each URL form without connecting (its errors name the problem, never
a password); on real servers (``ValkeySentinelSet``, ``ValkeyCluster``) both queues made from
those URLs work, and the errors, ``describe`` and ``inspect`` name the Sentinel service and the
primary it named, not redis-py's ``localhost:6379`` defaults.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import (
    AsyncRedisWorkQueue,
    RedisWorkQueue,
    aclose_client,
    client_from_url,
    close_client,
    describe,
)
from keyqueue.testing import ValkeyCluster, ValkeySentinelSet

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the harness reads /proc")


def sentinel_url(s: ValkeySentinelSet, scheme: str = "redis+sentinel") -> str:
    user, password = s.credentials
    hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
    return f"{scheme}://{user}:{password}@{hosts}/{s.service}"


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
