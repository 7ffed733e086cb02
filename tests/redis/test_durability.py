"""Durability modes on real replicated servers: ``durability="replicated"`` waits for every
replica, and a holder keeps a local deadline.

On a Sentinel set (1 primary, 2 replicas, 3 sentinels, down-after 1 s) and a Cluster (3
primaries with a replica each), the replicated mode's writes each carry one ``WAIT`` (counted
from the primary's ``INFO commandstats``) and the default mode's none; a frozen replica makes
every write wait and be asked again, said once, nothing lost; a primary with fewer replicas
than asked is said at start; a hand-out whose ``WAIT`` came short is not acted on and its key
is handed out again; a holder whose renewals cannot be confirmed loses its hold before the
server's lease ends; and a ``kill -9`` of the primary under load loses no acknowledged add.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner

from keyqueue import EventKind, arun_workers, run_workers
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import (
    AsyncRedisWorkQueue,
    LeaseLost,
    NotReplicated,
    RedisWorkQueue,
    aclose_client,
    client_from_url,
    close_client,
)
from keyqueue.redis._durability import Replication
from keyqueue.redis._send import ReplicatedScript, Script
from keyqueue.testing import (
    AddRecord,
    HoldRecord,
    MemoryFence,
    ValkeyCluster,
    ValkeyNode,
    ValkeySentinelSet,
    check_history,
)
from tests.support.valkey_server import name

__all__ = ["name"]  # a fixture

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the harness reads /proc")

EPISODE = "durability 'replicated' waits for within"
"""Words of the once-per-episode warning."""


def sentinel_url(s: ValkeySentinelSet) -> str:
    user, password = s.credentials
    hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
    return f"redis+sentinel://{user}:{password}@{hosts}/{s.service}?socket_timeout=3"


def waits(node: ValkeyNode) -> int:
    """``WAIT`` calls ``node`` has run (``INFO commandstats``)."""
    stat = node.info("commandstats").get("cmdstat_wait", "")
    return int(stat.split("calls=")[1].split(",")[0]) if stat else 0


def until(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeySentinelSet]:
    with ValkeySentinelSet(tmp_path_factory.mktemp("set"), down_after=1.0) as s:
        yield s


@pytest.fixture
def client(sentinel_set: ValkeySentinelSet) -> Iterator[Any]:
    c = client_from_url(sentinel_url(sentinel_set))
    yield c
    close_client(c)


@pytest.fixture
def replica(sentinel_set: ValkeySentinelSet) -> Iterator[ValkeyNode]:
    """A replica of the set's primary, thawed whatever the test did to it."""
    primary = sentinel_set.wait_for_primary()
    node = next(n for n in sentinel_set.nodes if n is not primary)
    yield node
    if node.frozen:
        node.thaw()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"durability": "quorum"}, "durability must be 'primary' or 'replicated', got 'quorum'"),
        ({"durability": None}, "durability must be 'primary' or 'replicated', got None"),
        ({"replicas": 1}, "replicas= is for durability='replicated'"),
        ({"durability": "replicated", "replicas": -1}, "replicas must be an int >= 0"),
        ({"durability": "replicated", "replicas": True}, "replicas must be an int >= 0"),
        ({"durability": "replicated", "replicas": 1.0}, "replicas must be an int >= 0"),
    ],
)
def test_a_bad_durability_is_one_line_before_anything_connects(
    kwargs: dict[str, Any], problem: str
) -> None:
    for kind in (RedisWorkQueue, AsyncRedisWorkQueue):
        with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(")) as raised:
            kind("q", url="redis://127.0.0.1:1/0", **kwargs)
        assert "\n" not in str(raised.value)


def test_the_default_mode_says_so_and_waits_for_nothing(valkey_url: str, name: str) -> None:
    with RedisWorkQueue(name, url=valkey_url) as q:
        assert (q.durability, q.replicas) == ("primary", None)
        assert q.stats().writes_not_replicated == 0


def test_a_primary_without_replicas_is_said_once_at_start(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "keyqueue")
    with RedisWorkQueue(name, url=valkey_url, durability="replicated") as q:
        assert q.replicas == 0
        q.add("a")
        assert q.get(timeout=1) == "a"
        q.done("a")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1
    assert "durability 'replicated' has no replica to wait for" in said[0]


@linux_only
def test_each_write_carries_one_wait_in_the_replicated_mode_and_none_by_default(
    sentinel_set: ValkeySentinelSet, client: Any, name: str
) -> None:
    primary = sentinel_set.wait_for_primary()
    with RedisWorkQueue(name, client=client) as q:
        before = waits(primary)
        q.add("a")
        assert q.get(timeout=5) == "a"
        q.done("a")
        assert waits(primary) == before  # the default mode: not one command more
    with RedisWorkQueue(name, client=client, durability="replicated") as q:
        assert q.replicas == 2  # the primary's replicas at start
        before = waits(primary)
        q.add("a")
        assert q.get(timeout=5) == "a"
        q.done("a")
        q.add_many(["b", "c", "d"])
        assert waits(primary) == before + 4  # add, get, done, one add_many batch
        seen: list[str] = []
        stop = threading.Event()

        def handle(key: str) -> None:
            seen.append(key)
            if len(seen) == 3:
                stop.set()

        stats = run_workers(q, handle, workers=2, stop=stop)
        assert sorted(seen) == ["b", "c", "d"]
        assert stats.succeeded == 3
        assert q.stats().writes_not_replicated == 0

    async def rounds() -> int:
        aclient = client_from_url(sentinel_url(sentinel_set), asyncio=True)
        async with AsyncRedisWorkQueue(name, client=aclient, durability="replicated") as aq:
            assert aq.replicas == 2
            first = waits(primary)
            await aq.add("e")
            assert await aq.get(timeout=5) == "e"
            await aq.done("e")
            sent = waits(primary) - first
        await aclose_client(aclient)
        return sent

    assert asyncio.run(rounds()) == 3


@linux_only
def test_fewer_replicas_than_asked_are_said_once_at_start(
    sentinel_set: ValkeySentinelSet, client: Any, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "keyqueue")
    primary = sentinel_set.wait_for_primary()
    with RedisWorkQueue(name, client=client, durability="replicated", replicas=3, lease=2) as q:
        assert q.replicas == 3
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"keyqueue {name!r}: durability 'replicated' needs 3 replicas; this primary "
        f"(sentinel {sentinel_set.service} via {sentinel_set.sentinels[0].host}:"
        f"{sentinel_set.sentinels[0].port},… (primary {primary.host}:{primary.port})) has 2: "
        "until it has, each write waits 0.1 s and is not acknowledged"
    ]


@linux_only
def test_a_frozen_replica_makes_writes_wait_and_be_asked_again_said_once_nothing_lost(
    client: Any, replica: ValkeyNode, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "keyqueue")
    q = RedisWorkQueue(name, client=client, durability="replicated", lease=3.0)
    acked: list[str] = []
    processed: set[str] = set()
    stop = threading.Event()
    workers = threading.Thread(target=run_workers, args=(q, processed.add, 2, stop))
    workers.start()
    try:
        for i in range(10):
            q.add(f"k{i}")
            acked.append(f"k{i}")
        replica.freeze()
        thaw = threading.Timer(1.5, replica.thaw)
        thaw.start()
        began = time.monotonic()
        for i in range(10, 20):
            q.add(f"k{i}")  # waits, is asked again, returns once the replica is back
            acked.append(f"k{i}")
        assert time.monotonic() - began >= 1.0
        thaw.join()
        until("every acknowledged add processed", lambda: processed >= set(acked), 10)
        assert q.stats().writes_not_replicated > 0
    finally:
        stop.set()
        workers.join(timeout=10)
        q.close()
    episodes = [r for r in caplog.records if EPISODE in r.getMessage()]
    assert len(episodes) == 1
    assert episodes[0].levelno == logging.WARNING
    assert any("reach 2 replica(s) again" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r not in episodes]


@linux_only
def test_a_hand_out_whose_wait_came_short_is_not_acted_on_and_its_key_is_handed_out_again(
    sentinel_set: ValkeySentinelSet, client: Any, replica: ValkeyNode, name: str
) -> None:
    q = RedisWorkQueue(name, client=client, durability="replicated", lease=5.0)
    try:
        q.add("h")
        replica.freeze()
        with pytest.raises(NotReplicated) as short:
            q.get_nowait()
        reply = short.value.reply
        assert (reply[2], short.value.acked) == (b"h", 1)  # the primary handed it out
        first_token = int(reply[3])
        assert "h" not in q._holds  # not acted on: this client holds nothing
        assert q.stats().processing == 1  # the server: held by the unanswered get
        replica.thaw()
        key = None
        while key is None:  # the next get hands it back (the get record), then out again
            try:
                key = q.get(timeout=5)
            except NotReplicated:
                time.sleep(0.05)  # the replica still catching up
        assert key == "h"
        assert q.token("h") > first_token
        q.done("h")
        stats = q.stats()
        assert (stats.processing, stats.depth, stats.leases_expired, stats.stalls) == (0, 0, 0, 0)
    finally:
        q.close()

    async def asynchronous() -> None:
        aclient = client_from_url(sentinel_url(sentinel_set), asyncio=True)
        aq = AsyncRedisWorkQueue(name, client=aclient, durability="replicated", lease=5.0)
        try:
            await aq.add("a")
            replica.freeze()
            with pytest.raises(NotReplicated) as short:
                await aq.get_nowait()
            assert short.value.reply[2] == b"a"
            replica.thaw()
            key = None
            while key is None:
                try:
                    key = await aq.get(timeout=5)
                except NotReplicated:
                    await asyncio.sleep(0.05)
            assert key == "a"
            assert aq.token("a") > int(short.value.reply[3])
            await aq.done("a")
        finally:
            await aq.aclose()
            await aclose_client(aclient)

    asyncio.run(asynchronous())


def _held_left(client: Any, name: str, key: str) -> float:
    """The server's lease left on ``key`` (a default-mode client reads it)."""
    with RedisWorkQueue(name, client=client) as reader:
        rows = [row for row in reader.snapshot().processing if row.key == key]
    assert rows, f"{key!r} is not held on the server"
    return rows[0].lease_left


@linux_only
def test_a_holder_whose_renewals_cannot_be_confirmed_loses_its_hold_before_the_server_lease(
    sentinel_set: ValkeySentinelSet, client: Any, replica: ValkeyNode, name: str
) -> None:
    lease = 2.0
    q = RedisWorkQueue(name, client=client, durability="replicated", lease=lease)
    lost: list[float] = []
    q.subscribe(lambda e: lost.append(time.monotonic()) if e.kind is EventKind.LEASE_LOST else None)
    try:
        q.add("d")
        sent = time.monotonic()
        assert q.get(timeout=5) == "d"
        replica.freeze()  # from now on no renewal is confirmed
        until("the hold lost by its local deadline", lambda: bool(lost), 2 * lease)
        assert sent + 0.8 * lease <= lost[0] <= sent + lease  # deadline: lease less a tenth
        assert _held_left(client, name, "d") > 0  # the server's lease still runs
        with pytest.raises(LeaseLost):
            q.done("d")
    finally:
        replica.thaw()
        q.close()

    async def asynchronous() -> None:
        aclient = client_from_url(sentinel_url(sentinel_set), asyncio=True)
        aq = AsyncRedisWorkQueue(name, client=aclient, durability="replicated", lease=lease)
        alost: list[float] = []
        aq.subscribe(
            lambda e: alost.append(time.monotonic()) if e.kind is EventKind.LEASE_LOST else None
        )
        try:
            await aq.add("e")
            began = time.monotonic()
            assert await aq.get(timeout=5) == "e"
            replica.freeze()
            async with asyncio.timeout(2 * lease):
                while not alost:
                    await asyncio.sleep(0.02)
            assert began + 0.8 * lease <= alost[0] <= began + lease
            assert await asyncio.to_thread(_held_left, client, name, "e") > 0
            with pytest.raises(LeaseLost):
                await aq.retry("e")
        finally:
            replica.thaw()
            await aq.aclose()
            await aclose_client(aclient)

    asyncio.run(asynchronous())


@linux_only
def test_each_write_carries_one_wait_on_the_queue_s_cluster_primary(tmp_path: Path) -> None:
    with ValkeyCluster(tmp_path, node_timeout=1.0) as c:
        name = "durable"
        primary = c.primary_for("{" + name + "}")
        assert primary is not None
        url = f"redis+cluster://{c.nodes[0].host}:{c.nodes[0].port}"
        with RedisWorkQueue(name, url=url) as q:  # loads the scripts: no NOSCRIPT below
            q.add("a")
            assert q.get(timeout=5) == "a"
            q.done("a")
            assert waits(primary) == 0
        with RedisWorkQueue(name, url=url, durability="replicated") as q:
            assert q.replicas == 1
            before = waits(primary)
            q.add("a")
            assert q.get(timeout=5) == "a"
            q.done("a")
            assert waits(primary) == before + 3
            q.add_many(["b", "c"])
            seen: list[str] = []
            stop = threading.Event()

            def handle(key: str) -> None:
                seen.append(key)
                if len(seen) == 2:
                    stop.set()

            run_workers(q, handle, workers=2, stop=stop)
            assert sorted(seen) == ["b", "c"]

        async def rounds() -> int:
            async with AsyncRedisWorkQueue(name, url=url, durability="replicated") as aq:
                assert aq.replicas == 1
                first = waits(primary)
                await aq.add("d")
                assert await aq.get(timeout=5) == "d"
                await aq.done("d")
                await aq.add_many(["e", "f"])
                astop = asyncio.Event()
                aseen: list[str] = []

                async def ahandle(key: str) -> None:
                    aseen.append(key)
                    if len(aseen) == 2:
                        astop.set()

                await arun_workers(aq, ahandle, workers=2, stop=astop)
                assert sorted(aseen) == ["e", "f"]
                return waits(primary) - first

        assert asyncio.run(rounds()) >= 5  # add, get, done, add_many; the claims' own

        # A slot map that names the wrong primary: its MOVED is "did not run", the map
        # reloaded and the script sent to the slot's primary, with its WAIT.
        other = next(n for n in c.nodes[:3] if n is not primary)
        slot = c.slot("{" + name + "}")
        rejected = _rejected_scripts(other)
        with RedisWorkQueue(name, url=url, durability="replicated") as q:
            cluster: Any = q._client
            cluster.nodes_manager.slots_cache[slot] = [cluster.get_node(other.host, other.port)]
            before = waits(primary)
            q.add("moved")
            assert waits(primary) == before + 1
            assert _rejected_scripts(other) == rejected + 1
            assert q.get(timeout=5) == "moved"
            q.done("moved")

        async def moved() -> None:
            async with AsyncRedisWorkQueue(name, url=url, durability="replicated") as aq:
                acluster: Any = aq._client
                wrong = acluster.get_node(other.host, other.port)
                acluster.nodes_manager.slots_cache[slot] = [wrong]
                first = waits(primary)
                await aq.add("amoved")
                assert waits(primary) == first + 1
                assert await aq.get(timeout=5) == "amoved"
                await aq.done("amoved")

        asyncio.run(moved())
        assert _rejected_scripts(other) == rejected + 2


def _rejected_scripts(node: ValkeyNode) -> int:
    """Scripts ``node`` refused before running them (``MOVED``)."""
    stat = node.info("commandstats").get("cmdstat_evalsha", "")
    return int(stat.split("rejected_calls=")[1].split(",")[0]) if stat else 0


@linux_only
def test_a_killed_primary_loses_no_acknowledged_add_in_the_replicated_mode(
    tmp_path: Path,
) -> None:
    """kill -9 of the primary under a producer of hot keys and workers writing a fenced
    store; the killed node comes back as a replica (the mode waits for both). Judged by
    ``check_history``: no token twice, per key increasing, no overlapping valid holds, every
    acknowledged add processed, nothing left held."""
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        client = client_from_url(sentinel_url(s))
        producer_client = client_from_url(sentinel_url(s))
        q = RedisWorkQueue("chaos", client=client, durability="replicated", lease=3.0)
        producer = RedisWorkQueue("chaos", client=producer_client, durability="replicated")
        fence = MemoryFence()
        holds: list[HoldRecord] = []
        adds: list[AddRecord] = []
        errors: list[BaseException] = []
        producing, stop = threading.Event(), threading.Event()
        producing.set()

        def handle(key: str) -> None:
            start = time.monotonic()
            token = q.token(key)
            time.sleep(0.003)
            accepted = fence.write(key, token)
            holds.append(HoldRecord(key, token, "w", start, time.monotonic(), accepted=accepted))

        def produce() -> None:
            i = 0
            while producing.is_set():
                key, sent = f"k{i % 20}", time.monotonic()
                try:
                    producer.add(key)
                except BaseException as exc:
                    errors.append(exc)
                    return
                adds.append(AddRecord(key, sent))
                i += 1
                time.sleep(0.005)

        workers = threading.Thread(target=run_workers, args=(q, handle, 4, stop))
        adding = threading.Thread(target=produce)
        workers.start()
        adding.start()
        try:
            until("the first adds", lambda: len(adds) >= 50, 10)
            first.kill()
            second = s.wait_for_failover(first, timeout=15)
            s.restart_as_replica(first)
            after = len(adds)
            until("adds to the new primary", lambda: len(adds) >= after + 50, 20)
        finally:
            producing.clear()
            adding.join(timeout=35)
        try:
            until("the queue drained", lambda: not (st := q.stats()).depth + st.processing, 20)
        finally:
            stop.set()
            workers.join(timeout=10)
            left = q.stats().processing
            q.close()
            producer.close()
            close_client(client)
            close_client(producer_client)
        assert errors == []
        assert second is not first
        assert second.role() == "master"
        found = check_history(holds, adds, left_held=[f"?{i}" for i in range(left)])
        assert found.ok, found.summary() + "".join(f"\n{v}" for v in found.violations[:5])
        assert found.adds >= 100  # 50 before the kill, 50 after the failover


def test_not_replicated_is_one_of_the_errors_asked_again() -> None:
    for kind in (RedisWorkQueue, AsyncRedisWorkQueue):
        assert issubclass(NotReplicated, kind.connection_errors)
        assert issubclass(NotReplicated, kind.said_errors)
    assert issubclass(NotReplicated, redis.exceptions.RedisError)


def _commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Command]]:
    for called in group.list_commands(ctx):
        command = group.get_command(ctx, called)
        assert command is not None
        if isinstance(command, click.Group):
            for sub, found in _commands(command, ctx):
                yield f"{called} {sub}", found
        else:
            yield called, command


def test_every_command_that_takes_a_redis_url_takes_durability() -> None:
    cli = keyqueue_cli
    with click.Context(cli) as ctx:
        commands = dict(_commands(cli, ctx))
    with_url = {
        name: command
        for name, command in commands.items()
        if any("--redis-url" in p.opts for p in command.params)
    }
    assert {"inspect", "top", "add", "forget", "delete", "dashboard"} <= set(with_url)
    assert {"lab pipeline", "lab firehose"} <= set(with_url)
    for called, command in with_url.items():
        durability = [p for p in command.params if "--durability" in p.opts]
        assert durability, f"{called} takes --redis-url but not --durability"
        assert isinstance(durability[0].type, click.Choice)
        assert list(durability[0].type.choices) == ["primary", "replicated"]
        assert durability[0].default == "primary"


@linux_only
def test_an_operator_s_add_with_durability_replicated_waits_for_the_replicas(
    sentinel_set: ValkeySentinelSet, name: str
) -> None:
    primary = sentinel_set.wait_for_primary()
    url = sentinel_url(sentinel_set)
    with RedisWorkQueue(name, url=url) as q:
        q.add("seed")  # the queue exists
    runner = CliRunner()
    before = waits(primary)
    result = runner.invoke(keyqueue_cli, ["add", name, "k", "--redis-url", url])
    assert result.exit_code == 0, result.output
    assert waits(primary) == before
    result = runner.invoke(
        keyqueue_cli, ["add", name, "k2", "--redis-url", url, "--durability", "replicated"]
    )
    assert result.exit_code == 0, result.output
    assert waits(primary) == before + 1
    result = runner.invoke(
        keyqueue_cli, ["add", name, "k3", "--redis-url", url, "--durability", "quorum"]
    )
    assert result.exit_code == 2
    assert "'quorum' is not one of 'primary', 'replicated'" in result.output


@linux_only
def test_an_outcome_asked_again_on_another_connection_is_confirmed_only_once_replicated(
    client: Any, replica: ValkeyNode, name: str
) -> None:
    # The first done ran on the primary, its WAIT came short. Asked again on a
    # new connection (whose own last write is none), the done finds it ran and
    # writes nothing: its WAIT must still cover the first run's write.
    q = RedisWorkQueue(name, client=client, durability="replicated", lease=10.0)
    try:
        for key in ("d", "f", "c"):
            q.add(key)
        assert {q.get_nowait(), q.get_nowait(), q.get_nowait()} == {"d", "f", "c"}
        replica.freeze()
        with pytest.raises(NotReplicated):
            q.done("d")
        with pytest.raises(NotReplicated):
            q.forget("f")  # a fenced outcome
        client.connection_pool.disconnect()  # the next calls open new connections
        with pytest.raises(NotReplicated):
            q.done("d")  # 'repeat' on the primary, not yet on every replica
        client.connection_pool.disconnect()
        with pytest.raises(NotReplicated):
            q.forget("f")
        replica.thaw()
        until("the replica back", lambda: _asked_again(lambda: q.done("d")), 10)
        until("the replica back", lambda: _asked_again(lambda: q.forget("f")), 10)
        assert (q.stats().processing, q.stats().dones) == (2, 1)  # done once; f, c held
        q.done("f")
        q.done("c")
        assert (q.stats().processing, q.stats().dones) == (0, 3)
    finally:
        if replica.frozen:
            replica.thaw()
        q.close()


def _asked_again(call: Callable[[], object]) -> bool:
    """``call`` once: True if confirmed, False if ``NotReplicated``."""
    try:
        call()
    except NotReplicated:
        return False
    return True


def test_an_interrupt_between_the_script_s_reply_and_wait_s_leaves_no_reply_to_the_next_user(
    valkey_url: str, name: str
) -> None:
    # A signal's KeyboardInterrupt or SystemExit can land after the script's
    # reply was read and before WAIT's: the connection must not go back to
    # the pool with WAIT's reply unread, or its next user reads it as its own.
    def interrupted(response: Any, **options: Any) -> Any:
        raise KeyboardInterrupt

    client = redis.Redis.from_url(valkey_url)
    q = RedisWorkQueue(name, client=client, durability="replicated", replicas=0)
    try:
        _callbacks(client, interrupted)
        with pytest.raises(KeyboardInterrupt):
            q.add("a")
        _callbacks(client, None)
        assert client.echo("next") == b"next"
        q.add("b")
        assert q.stats().depth == 2
    finally:
        q.close()
        client.close()

    async def asynchronous() -> None:
        aclient = redis.asyncio.Redis.from_url(valkey_url)
        aq = AsyncRedisWorkQueue(name, client=aclient, durability="replicated", replicas=0)
        try:
            await aq.add("c")  # the server checked first
            _callbacks(aclient, interrupted)
            with pytest.raises(KeyboardInterrupt):
                await aq.add("d")
            _callbacks(aclient, None)
            assert await aclient.echo("next") == b"next"
            assert (await aq.stats()).depth == 4
        finally:
            await aq.aclose()
            await aclient.aclose()

    asyncio.run(asynchronous())


def _callbacks(client: Any, callback: Callable[..., Any] | None) -> None:
    """The scripts' reply callback on ``client`` (None: the reply as read)."""
    for command in ("EVALSHA", "EVAL"):
        client.set_response_callback(command, callback or (lambda response, **options: response))


LISTED = "return {redis.call('INCR', KEYS[1]), 0}"
"""A script that writes and replies a list (as a get does)."""


def test_a_sentinel_connection_whose_read_timed_out_is_closed_not_reused_for_the_next_write(
    sentinel_set: ValkeySentinelSet, name: str
) -> None:
    # redis-py leaves a Sentinel's connection open after a socket timeout
    # (SentinelManagedConnection reads with disconnect_on_error=False): a
    # reply that comes after it must not be read by the connection's next
    # user as its own. The primary is frozen (as in a chaos run's SIGSTOP)
    # while the next user sends, so redis-py's check for unread data on a
    # pooled connection sees none, and thawed while that user reads.
    user, password = sentinel_set.credentials
    hosts = ",".join(f"{h}:{p}" for h, p in sentinel_set.sentinel_addresses)
    url = f"redis+sentinel://{user}:{password}@{hosts}/{sentinel_set.service}?socket_timeout=0.3"
    primary = sentinel_set.wait_for_primary()
    client = client_from_url(url)
    replication = Replication(name, 0, 30.0)
    write = ReplicatedScript(client, LISTED, replication)
    try:
        assert write([name], []) == [1, 0]  # connected, the script loaded
        primary.freeze()
        with pytest.raises(redis.exceptions.TimeoutError):
            Script(client, "return {7, 7}")([name], [])
        threading.Timer(0.1, primary.thaw).start()
        assert write([name], []) == [2, 0]
        assert client.echo("next") == b"next"

        # WAIT's read timing out after the script's reply was read.
        replication.replicas, replication.timeout_ms = 3, 1000  # more than the set has
        with pytest.raises(redis.exceptions.TimeoutError):
            write([name], [])
        primary.freeze()
        threading.Timer(0.1, primary.thaw).start()
        replication.replicas = 0
        assert write([name], []) == [4, 0]
        assert client.echo("next") == b"next"
    finally:
        primary.thaw()
        close_client(client)


@pytest.mark.parametrize(("socket_timeout", "wait_ms"), [(0.3, 150), (None, 1000), (5.0, 1000)])
def test_wait_s_timeout_is_at_most_half_the_client_s_socket_timeout(
    valkey_url: str, name: str, socket_timeout: float | None, wait_ms: int
) -> None:
    # A WAIT longer than the socket timeout would make each write a missing
    # replica holds up a TimeoutError and a closed connection; capped, it is
    # NotReplicated on a connection that stays in step.
    client = redis.Redis.from_url(valkey_url, socket_timeout=socket_timeout)
    q = RedisWorkQueue(name, client=client, durability="replicated", replicas=1, add_timeout=0)
    try:
        with pytest.raises(NotReplicated, match=f"within {wait_ms} ms"):
            q.add("a")
        assert client.echo("next") == b"next"
    finally:
        q.close()
        client.close()
