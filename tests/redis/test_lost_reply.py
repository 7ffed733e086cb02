"""A lost reply costs no key, no failure and no false "lost", whatever the client.

redis-py re-sends a command whose connection failed when the client's
``Retry`` allows it (``redis.Redis(host, port)``: ten times; ``from_url``:
never). A script whose reply was lost and that redis-py re-sent would run
twice behind keyqueue's back: a get or a claim would take keys no worker ever
gets (given up after their lease, with ``max_retries=1``), a done or a
claim's settle would be answered ``lost`` although it had been applied. So
redis-py re-sends no script (``keyqueue.redis._send``), and the operation
recovers from what it knows (the get and claim records, done asked again).

The connection is dropped for real: a proxy (``cutting_proxy``) in front of
the session's Valkey closes the client's connection right after the server
answered the chosen runs of a script, so each script ran and its reply never
arrived (on a cluster, one proxy per node, the client's connections sent
through them by ``address_remap``). Each test runs the workers over 12 keys
with three such cuts, on every client construction, and checks that every key was handled exactly
once, nothing was given up, no lease ran out or was lost, ``RunStats`` is
clean, and the proxy cut what it was told to (after the script took or
released keys). With a ``redis.Redis(host, port)`` client, every test fails
if redis-py is let re-send a script.
"""

from __future__ import annotations

import asyncio
import logging
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry

import keyqueue
from keyqueue import EventKind, RunStats
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from tests.support import valkey_server
from tests.support.cutting_proxy import Cut, CuttingProxy
from tests.support.valkey_server import ValkeyCluster

name = valkey_server.name  # a queue of this test's own

N = 12  # keys
WORKERS = 3
LEASE = 3.0  # long enough for renewals on a loaded machine; a lost key would run out
WAIT = 30.0  # generous bound, wall seconds, on what other threads make true
CUT = {"get": {2, 5, 8}, "done": {2, 5, 8}, "claim": {4, 5, 6}}  # which runs lose their reply

FIRST_ASKS: dict[str, Callable[[list[bytes]], bool]] = {
    "get": lambda request: True,
    "done": lambda request: request[-1] == b"",  # not asked again (ARGV[4] '1')
    "claim": lambda request: True,
}
"""Which runs count for ``CUT``: a done asked again after a cut answers
"repeat", so only first asks count (a lost repeat is asked again too)."""

CONSTRUCTIONS = ("from_url", "Redis(host, port)", "ConnectionPool(retry=...)", "RedisCluster")
"""How the client is made: ``url=`` (``Redis.from_url``: no retries),
``Redis(host, port)`` (ten retries), a ``ConnectionPool`` given a ``Retry``,
a ``RedisCluster`` (ten retries) on a 3-master cluster."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    """A 3-master Valkey Cluster for the cluster clients' tests (started on first use)."""
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-cluster-") as directory,
        ValkeyCluster(directory, masters=3) as started,
    ):
        yield started


class Proxies:
    """A ``CuttingProxy`` in front of the server, or of each node of a cluster
    (``remap`` sends a cluster client's connections through them): ``cut``
    arms them all; ``cuts`` and ``ran`` add theirs up (one node runs a
    queue's scripts)."""

    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self.by_port: dict[int, CuttingProxy] = {}
        try:
            for host, port in upstreams:
                self.by_port[port] = CuttingProxy((host, port)).start()
        except BaseException:
            self.stop()
            raise
        self.port = next(iter(self.by_port.values())).port  # the first: a startup node

    def remap(self, address: tuple[str, int]) -> tuple[str, int]:
        proxy = self.by_port.get(address[1])
        return address if proxy is None else ("127.0.0.1", proxy.port)

    def cut(self, *args: Any) -> None:
        for proxy in self.by_port.values():
            proxy.cut(*args)

    @property
    def cuts(self) -> list[Cut]:
        return [cut for proxy in self.by_port.values() for cut in proxy.cuts]

    def ran(self, sha: str) -> int:
        return sum(proxy.ran(sha) for proxy in self.by_port.values())

    def stop(self) -> None:
        for proxy in self.by_port.values():
            proxy.stop()


@pytest.fixture
def proxies(request: pytest.FixtureRequest, valkey_url: str) -> Iterator[Proxies]:
    """Proxies in front of the session's server, or of the cluster's nodes for
    the ``RedisCluster`` construction."""
    if request.node.callspec.params["how"] == "RedisCluster":
        upstreams = request.getfixturevalue("cluster").startup_nodes
    else:
        host, port = valkey_url.split("//")[1].split("/", maxsplit=1)[0].rsplit(":", 1)
        upstreams = [(host, int(port))]
    started = Proxies(upstreams)
    try:
        yield started
    finally:
        started.stop()


def sync_client(how: str, proxies: Proxies) -> dict[str, Any]:
    """The queue's ``url=`` or ``client=`` for a construction, through the proxies."""
    port = proxies.port
    if how == "from_url":
        return {"url": f"redis://127.0.0.1:{port}/0"}
    if how == "Redis(host, port)":
        client = redis.Redis("127.0.0.1", port)
        assert client.get_retry().get_retries() == 10  # type: ignore[union-attr]
        return {"client": client}
    if how == "RedisCluster":
        cluster = redis.RedisCluster(
            startup_nodes=[ClusterNode("127.0.0.1", port)], address_remap=proxies.remap
        )
        assert cluster.retry.get_retries() == 10
        return {"client": cluster}
    pool = redis.ConnectionPool(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 3))
    return {"client": redis.Redis(connection_pool=pool)}


def async_client(how: str, proxies: Proxies) -> dict[str, Any]:
    port = proxies.port
    if how == "from_url":
        return {"url": f"redis://127.0.0.1:{port}/0"}
    if how == "Redis(host, port)":
        client = redis.asyncio.Redis(host="127.0.0.1", port=port)
        assert client.get_retry().get_retries() == 10  # type: ignore[union-attr]
        return {"client": client}
    if how == "RedisCluster":
        cluster = redis.asyncio.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode("127.0.0.1", port)],
            address_remap=proxies.remap,
        )
        assert cluster.retry.get_retries() == 10
        return {"client": cluster}
    pool = redis.asyncio.ConnectionPool(
        host="127.0.0.1", port=port, retry=AsyncRetry(NoBackoff(), 3)
    )
    return {"client": redis.asyncio.Redis(connection_pool=pool)}


def close_client(client: Any) -> None:
    """A client the test made, and its pool (a client given one leaves it open)."""
    client.close()
    if isinstance(client, redis.Redis):
        client.connection_pool.disconnect()


async def aclose_client(client: Any) -> None:
    await client.aclose()
    if isinstance(client, redis.asyncio.Redis):
        await client.connection_pool.disconnect()


def watch(q: Any) -> list[str]:
    """The keys of the LEASE_LOST events of ``q``'s calls, as they come."""
    lost: list[str] = []
    q.subscribe(lambda e: lost.append(e.key) if e.kind is EventKind.LEASE_LOST else None)
    return lost


def check_cuts(proxies: Proxies, path: str, sha: str) -> int:
    """The proxy cut the three runs it was told to, each after the script took
    (get, claim) or released (done) keys; returns the keys the cut runs took."""
    cuts = proxies.cuts
    assert [cut.script for cut in cuts] == [path] * 3, cuts
    if path == "get":
        assert all(cut.reply[1] == 1 for cut in cuts), cuts  # each took a key
        return len(cuts)
    if path == "done":
        assert all(cut.reply[1] == b"ok" for cut in cuts), cuts  # each released its key
        assert proxies.ran(sha) == N + 3  # and was asked again (answered "repeat")
        return 0
    # EVALSHA sha numkeys KEYS ARGV: the holds settled are ARGV's triples from [10] on,
    # and a Cluster client's claim ends with its view of the primary (two more).
    settles = [len(cut.request) - 3 - int(cut.request[2]) - 9 for cut in cuts]
    settles = [n - 2 if n % 3 == 2 else n for n in settles]
    assert all(n > 0 and n % 3 == 0 for n in settles), settles  # each settled holds...
    taken = [len(cut.reply[2]) // 2 for cut in cuts]
    assert all(n > 0 for n in taken), cuts  # ...and took keys
    return sum(taken)


def check_clean(
    path: str,
    handled: Counter[str],
    run: RunStats,
    stats: Any,
    taken_by_cuts: int,
    lost: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert handled == Counter(f"k{i}" for i in range(N))  # each key once
    assert run == RunStats(processed=N, succeeded=N)  # no failure, give-up, lease lost, error
    assert (stats.leases_expired, stats.leases_lost, stats.processing, stats.depth) == (0, 0, 0, 0)
    # Every hand-out ended once: the keys the cut runs took were handed back.
    # A cut can also break another call that was using that connection (the
    # asyncio cluster client reuses it): a get that raised there may have
    # taken a key on the server too, handed back by the next get in the same way.
    words = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    also_raised = sum(bool(re.search(r"\bget raised", r.getMessage())) for r in caplog.records)
    assert stats.gets == stats.dones
    assert N + taken_by_cuts <= stats.gets <= N + taken_by_cuts + also_raised, words
    assert lost == []  # no LEASE_LOST event
    assert not [w for w in words if "lease lost" in w or "given up" in w], words


@pytest.mark.parametrize("how", CONSTRUCTIONS)
@pytest.mark.parametrize("path", ["get", "done", "claim"])
def test_run_workers_loses_nothing_to_a_reply_lost_after_the_script_ran(
    proxies: Proxies, name: str, how: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # batch=False: one get and one done script per key; True: claims.
    q = RedisWorkQueue(
        name, lease=LEASE, max_retries=1, batch=path == "claim", **sync_client(how, proxies)
    )
    try:
        lost = watch(q)
        q.add_many([f"k{i}" for i in range(N)])
        proxies.cut(path, q._scripts[path].sha, CUT[path], FIRST_ASKS[path])
        handled: Counter[str] = Counter()
        lock = threading.Lock()
        every_key = threading.Event()

        def handler(key: str) -> None:
            with lock:
                handled[key] += 1
                if len(handled) == N:
                    every_key.set()

        stop = threading.Event()
        runs: list[RunStats] = []
        runner = threading.Thread(
            target=lambda: runs.append(keyqueue.run_workers(q, handler, WORKERS, stop))
        )
        runner.start()
        try:
            assert every_key.wait(WAIT), f"handled {sorted(handled)}"
            # Then until this client holds nothing (a done asked again answers).
            assert q.shutdown(drain=True, timeout=WAIT)
        finally:
            stop.set()
            runner.join(WAIT)
        assert not runner.is_alive()
        check_clean(
            path,
            handled,
            runs[0],
            q.stats(),
            check_cuts(proxies, path, q._scripts[path].sha),
            lost,
            caplog,
        )
    finally:
        q.close()
        if not q._owns_client:
            close_client(q._client)


@pytest.mark.parametrize("how", CONSTRUCTIONS)
@pytest.mark.parametrize("path", ["get", "done", "claim"])
async def test_arun_workers_loses_nothing_to_a_reply_lost_after_the_script_ran(
    proxies: Proxies, name: str, how: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    q = AsyncRedisWorkQueue(
        name, lease=LEASE, max_retries=1, batch=path == "claim", **async_client(how, proxies)
    )
    try:
        lost = watch(q)
        await q.add_many([f"k{i}" for i in range(N)])
        proxies.cut(path, q._scripts[path].sha, CUT[path], FIRST_ASKS[path])
        handled: Counter[str] = Counter()
        every_key = asyncio.Event()

        async def handler(key: str) -> None:
            handled[key] += 1
            if len(handled) == N:
                every_key.set()

        stop = asyncio.Event()
        runner = asyncio.create_task(keyqueue.arun_workers(q, handler, WORKERS, stop))
        try:
            await asyncio.wait_for(every_key.wait(), WAIT)
            assert await q.shutdown(drain=True, timeout=WAIT)
        finally:
            stop.set()
            run = await asyncio.wait_for(runner, WAIT)
        check_clean(
            path,
            handled,
            run,
            await q.stats(),
            check_cuts(proxies, path, q._scripts[path].sha),
            lost,
            caplog,
        )
    finally:
        await q.aclose()
        if not q._owns_client:
            await aclose_client(q._client)


# -- how a script is sent ---------------------------------------------------------------------


def test_a_script_the_server_forgot_is_sent_whole_once(valkey_url: str, name: str) -> None:
    """EVALSHA answered NOSCRIPT (nothing ran): the script goes again as EVAL,
    which runs it once and caches it, so the next call is an EVALSHA again."""
    admin = redis.Redis.from_url(valkey_url)
    q = RedisWorkQueue(name, url=valkey_url)
    try:
        q.add("a")
        admin.script_flush()

        def calls(command: str) -> int:
            stats = admin.info("commandstats").get(f"cmdstat_{command}", {})
            return int(stats.get("calls", 0))

        evals = calls("eval")
        q.add("b")  # NOSCRIPT, then EVAL
        assert calls("eval") - evals == 1
        assert admin.script_exists(q._scripts["add"].sha) == [True]
        evalshas = calls("evalsha")
        q.add("c")
        assert (calls("eval") - evals, calls("evalsha") - evalshas) == (1, 1)
        s = q.stats()
        assert (s.adds, s.enqueued) == (3, 3)  # each add ran once
    finally:
        q.delete(force=True)
        q.close()
        admin.close()


def test_a_single_connection_client_works_its_scripts_on_connections_of_its_pool(
    valkey_url: str, name: str
) -> None:
    """The queue's scripts take a connection of the client's pool, not the
    client's own one: nothing waits on it, nothing is sent on it twice."""
    client = redis.Redis.from_url(valkey_url, single_connection_client=True)
    q = RedisWorkQueue(name, client=client, batch=False)
    try:
        q.add("a")
        assert q.get(timeout=WAIT) == "a"
        q.done("a")
        s = q.stats()
        assert (s.gets, s.dones, s.processing) == (1, 1, 0)
    finally:
        q.close()
        close_client(client)


class _PutBackLost(AsyncRedisWorkQueue):
    """The get script's reply is held back until ``release`` (the key handed
    out, its caller not told yet); every put_back fails with a lost connection."""

    in_flight: asyncio.Event
    release: asyncio.Event

    async def _run(self, script: str, args: list[str]) -> Any:
        if script == "put_back":
            raise redis.exceptions.ConnectionError("connection lost")
        reply = await super()._run(script, args)
        if script == "get" and int(reply[1]) and not self.release.is_set():
            self.in_flight.set()
            await self.release.wait()
        return reply


async def test_a_cancelled_gets_key_whose_put_back_failed_is_handed_back_by_the_next_get(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancelled get's get record slot counts as lost: if putting its key
    back fails, the client's next get hands the key back (no lease waits, no
    failure), as after a get whose reply was lost."""
    q = _PutBackLost(name, url=valkey_url, lease=30.0, max_retries=1)
    q.in_flight, q.release = asyncio.Event(), asyncio.Event()
    try:
        await q.add("k")
        getter = asyncio.create_task(q.get())
        await asyncio.wait_for(q.in_flight.wait(), WAIT)
        getter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await getter
        q.release.set()
        deadline = time.monotonic() + WAIT
        while not any("putting back key 'k'" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the put-back did not fail"
            await asyncio.sleep(0.005)

        assert await q.get_nowait() == "k"  # handed back, then handed out again
        s = await q.stats()
        assert (s.leases_expired, s.gets, s.dones, s.processing) == (0, 2, 1, 1)
        await q.done("k")
        assert await q.num_requeues("k") == 0  # no failure counted
    finally:
        await q.aclose()


def test_a_get_lost_after_it_ran_then_one_never_sent_cost_no_key(
    valkey_url: str, name: str
) -> None:
    """On the server: the first get ran and its reply was lost; the second
    (in the same slot) never reached the server; the third hands back the
    key the first took, without a failure, and takes the next."""
    q = RedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1, batch=False)
    real = q._run
    try:
        q.add_many(["a", "b"])
        valkey_server.lose_reply_of(q, "get")
        with pytest.raises(redis.exceptions.ConnectionError):
            q.get_nowait()  # took "a"; the reply never came

        def unreachable(script: str, args: list[str]) -> Any:
            raise redis.exceptions.ConnectionError("connection refused")

        q._run = unreachable  # type: ignore[method-assign]
        with pytest.raises(redis.exceptions.ConnectionError):
            q.get_nowait()
        q._run = real  # type: ignore[method-assign]

        assert q.get_nowait() == "b"  # "a" handed back first, to the FIFO's tail
        assert q.get_nowait() == "a"
        s = q.stats()
        assert (s.gets, s.dones, s.processing, s.leases_expired) == (3, 1, 2, 0)
        assert q.num_requeues("a") == 0
    finally:
        q._run = real  # type: ignore[method-assign]
        q.delete(force=True)
        q.close()


def test_shutdown_hands_back_the_key_of_a_get_whose_reply_was_lost(
    valkey_url: str, name: str
) -> None:
    """No get of this client follows a shutdown to hand the key back: the
    shutdown does (run_workers stopped right after a get raised)."""
    q = RedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1, batch=False)
    other = RedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1)
    try:
        q.add("a")
        valkey_server.lose_reply_of(q, "get")
        with pytest.raises(redis.exceptions.ConnectionError):
            q.get_nowait()
        assert other.stats().processing == 1  # held by nobody who knows it
        q.shutdown()
        assert other.get_nowait() == "a"  # at once, not after 30 s
        other.done("a")
        s = other.stats()
        assert (s.gets, s.dones, s.leases_expired) == (2, 2, 0)
        assert other.num_requeues("a") == 0
    finally:
        q.close()
        other.delete(force=True)
        other.close()


async def test_async_shutdown_hands_back_the_key_of_a_get_whose_reply_was_lost(
    valkey_url: str, name: str
) -> None:
    q = AsyncRedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1, batch=False)
    other = AsyncRedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1)
    real = q._run

    async def lose(script: str, args: list[str]) -> Any:
        reply = await real(script, args)
        if script == "get":
            q._run = real  # type: ignore[method-assign]
            raise redis.exceptions.ConnectionError("reply lost")
        return reply

    try:
        await q.add("a")
        q._run = lose  # type: ignore[method-assign]
        with pytest.raises(redis.exceptions.ConnectionError):
            await q.get_nowait()
        await q.shutdown()
        assert await other.get_nowait() == "a"
        await other.done("a")
        s = await other.stats()
        assert (s.gets, s.dones, s.leases_expired) == (2, 2, 0)
    finally:
        await q.aclose()
        await other.delete(force=True)
        await other.aclose()
