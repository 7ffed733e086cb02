"""Token epochs: no fencing token handed out twice across a failover, and the new
primary's tokens above every token an earlier one handed out.

A token is ``epoch * 2**32 + n``, the epoch Sentinel's ``config-epoch`` or the
serving Cluster node's ``cluster_my_epoch`` (``redis/_epoch.py``); a plain
server's client reads and sends nothing more. Each test proves the roles
before and after the failover it causes, and counts the paths it means to
show: the views read, the hand-outs answered ``STALEEPOCH``.
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

from keyqueue import arun_workers, run_workers
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.redis._connection import StaleEpoch
from keyqueue.redis._epoch import EPOCH_SHIFT, View, sentinel_view
from keyqueue.testing import ValkeyCluster, ValkeyNode, ValkeySentinelSet
from tests.support import valkey_server

make, name = valkey_server.make, valkey_server.name
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the harness reads /proc")

BAND = 1 << EPOCH_SHIFT


def sentinel_url(s: ValkeySentinelSet) -> str:
    user, password = s.credentials
    hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
    return f"redis+sentinel://{user}:{password}@{hosts}/{s.service}?socket_timeout=2"


def config_epoch(s: ValkeySentinelSet) -> int:
    """The highest ``config-epoch`` the answering sentinels hold for the service."""
    epochs = []
    for sentinel in s.sentinels:
        reply = sentinel.command("SENTINEL", "MASTER", s.service)
        assert isinstance(reply, list)
        fields = {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply), 2)}
        epochs.append(int(fields["config-epoch"]))
    return max(epochs)


def my_epoch(node: ValkeyNode) -> int:
    text = node.command("CLUSTER", "INFO")
    assert isinstance(text, str)
    return int(
        dict(line.split(":", 1) for line in text.splitlines() if ":" in line)["cluster_my_epoch"]
    )


def take(q: RedisWorkQueue, timeout: float = 10.0) -> int:
    """One key got and done, asked again across connection errors (as a runner
    does): its token."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            key = q.get(timeout=1.0)
            token = q.token(key)
            q.done(key)
            return token
        except q.connection_errors:
            assert time.monotonic() < deadline, "no key within the timeout"
            time.sleep(0.1)


def _until(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


# -- the view, without a failover ----------------------------------------------------------


def test_a_view_is_trusted_only_if_the_freshest_sentinel_names_this_node() -> None:
    info = {"role": "master", "master_replid": "ab" * 20}
    here = ("127.0.0.1", 7001)
    old = {"ip": "127.0.0.1", "port": 7001, "config-epoch": 3}
    new = {"ip": "127.0.0.1", "port": 7002, "config-epoch": 4}
    view = sentinel_view(info, here, [old, {"ip": "127.0.0.1", "port": 7001, "config-epoch": 2}])
    assert (view.epoch, view.args) == (3, (str(3 * BAND), "ab" * 20))
    with pytest.raises(StaleEpoch, match=r"name 127.0.0.1:7002 \(config-epoch 4\)"):
        sentinel_view(info, here, [old, new])  # one sentinel knows a later failover
    with pytest.raises(StaleEpoch, match="not a primary"):
        sentinel_view({"role": "slave", "master_replid": "ab" * 20}, here, [old])
    with pytest.raises(StaleEpoch, match="no sentinel answered"):
        sentinel_view(info, here, [])


def test_a_plain_server_s_client_reads_no_view_and_sends_nothing_more(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make()
    assert q._epochs is None
    sent: list[tuple[str, int]] = []
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        sent.append((script, len(args)))
        return real(script, args)

    q._run = run  # type: ignore[method-assign]
    q.add_many(["a", "b", "c"])
    assert [take(q) for _ in range(3)] == [1, 2, 3]
    assert [n for script, n in sent if script == "get"] == [9, 9, 9]  # get.lua's ARGV, no view

    def handle(key: str) -> None:
        tokens.append(q.token(key))
        stop.set()

    tokens: list[int] = []
    stop = threading.Event()
    q.add("d")
    run_workers(q, handle, 1, stop)
    assert tokens == [4]
    claims = [n for script, n in sent if script == "claim"]
    assert claims
    assert all((n - 9) % 3 == 0 for n in claims)  # claim.lua's ARGV: 9, then triples


@pytest.fixture(scope="module")
def sentinel_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeySentinelSet]:
    with ValkeySentinelSet(tmp_path_factory.mktemp("set"), down_after=1.0) as s:
        yield s


def test_a_hand_out_on_a_node_that_is_not_the_verified_primary_takes_nothing(
    sentinel_set: ValkeySentinelSet,
) -> None:
    s = sentinel_set
    primary = s.wait_for_primary()
    assert primary.role() == "master"
    with RedisWorkQueue("epochs-stale", url=sentinel_url(s)) as q:
        q.delete(force=True)
        q.add_many(["k", "j"])
        assert take(q) == 1  # config-epoch 0: tokens as a plain server's
        epochs = q._epochs
        assert epochs is not None
        assert epochs.view is not None
        assert (epochs.view.epoch, epochs.reads, epochs.stale) == (0, 1, 0)
        replid = primary.info()["master_replid"]
        assert epochs.view.replid == replid
        before = q.stats()

        # The scripts themselves, sent a replication id this node does not have.
        get, get_args = next(q._op_get(time.monotonic()))
        claim, claim_args = next(q._op_claim(5, [], time.monotonic()))
        for script, args in ((get, get_args), (claim, claim_args)):
            with pytest.raises(redis.exceptions.ResponseError, match=r"^STALEEPOCH"):
                q._scripts[script](q._script_keys[script], [*args, "0", "f" * 40])
        # A replica has the primary's replication id, but is not a primary.
        replica = redis.Redis(*s.nodes[1].address, **s.client_kwargs)  # type: ignore[arg-type]
        replica_script = q._script(replica, q._scripts["get"].source)
        with pytest.raises(redis.exceptions.ResponseError, match=r"STALEEPOCH.*role slave"):
            replica_script(q._script_keys["get"], [*get_args, "0", replid])
        replica.close()
        after = q.stats()
        assert (after.gets, after.depth, after.processing) == (before.gets, 1, 0)

        # Through the client: a view whose replication id is gone is dropped,
        # read again, and the get asked again at once.
        epochs.view = View("0" * 40, 0, epochs.view.address)
        assert q.get(timeout=1) == "j"
        assert (epochs.stale, epochs.reads) == (1, 2)
        assert epochs.view.replid == replid
        assert q.stats().gets == before.gets + 1
        q.done("j")

    async def rounds() -> None:
        async with AsyncRedisWorkQueue("epochs-stale", url=sentinel_url(s)) as aq:
            await aq.add("a")
            assert aq._epochs is not None
            await aq.get(timeout=1)
            await aq.done("a")
            aq._epochs.view = View("0" * 40, 0, "nowhere")
            await aq.add("b")
            assert await aq.get(timeout=1) == "b"
            assert aq.token("b") == 4
            assert (aq._epochs.stale, aq._epochs.reads) == (1, 2)
            await aq.done("b")

    asyncio.run(rounds())


# -- failovers -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["get", "run_workers"])
def test_after_a_killed_sentinel_primary_tokens_start_at_the_new_config_epoch(
    tmp_path: Path, how: str
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        assert first is s.nodes[0]
        assert first.role() == "master"
        assert config_epoch(s) == 0
        q = RedisWorkQueue("epochs-kill", url=sentinel_url(s), lease=5.0, add_timeout=20.0)
        try:
            if how == "get":
                q.add_many([f"a{i}" for i in range(3)])
                before = [take(q) for _ in range(3)]
                first.kill()
                second = s.wait_for_failover(first)
                q.add_many([f"b{i}" for i in range(3)])
                after = [take(q) for _ in range(3)]
            else:
                before, after, second = _workers_through(q, s, first)
        finally:
            q.close()
        epoch = config_epoch(s)
        assert epoch >= 1
        assert (first.role(), second.role()) == ("down", "master")
        assert max(before) < BAND  # epoch 0
        assert min(after) >= epoch * BAND > max(before)
        assert len(set(before + after)) == len(before) + len(after)
        assert q._epochs is not None
        assert q._epochs.view is not None
        assert q._epochs.view.epoch == epoch
        assert q._epochs.reads >= 2  # read at the first hand-out, and after the failover,
        assert q._epochs.stale >= 1  # which a hand-out on the old view learned


def _workers_through(
    q: RedisWorkQueue, s: ValkeySentinelSet, first: ValkeyNode
) -> tuple[list[int], list[int], ValkeyNode]:
    """``run_workers`` (2 threads, batched claims) through a kill -9 of the
    primary: the tokens of the keys added before it and after the failover."""
    tokens: dict[str, list[int]] = {}
    stop = threading.Event()

    def handle(key: str) -> None:
        tokens.setdefault(key, []).append(q.token(key))

    workers = threading.Thread(target=run_workers, args=(q, handle, 2, stop))
    workers.start()
    try:
        q.add_many([f"a{i}" for i in range(10)])
        _until("the first keys processed", lambda: len(tokens) == 10, 10)
        first.kill()
        second = s.wait_for_failover(first)
        q.add_many([f"b{i}" for i in range(10)])
        _until("the keys added after the failover", lambda: len(tokens) == 20, 20)
    finally:
        stop.set()
        workers.join(timeout=10)
    before = [t for key, ts in tokens.items() if key.startswith("a") for t in ts]
    after = [t for key, ts in tokens.items() if key.startswith("b") for t in ts]
    return before, after, second


def test_async_workers_after_a_killed_sentinel_primary_get_tokens_of_the_new_epoch(
    tmp_path: Path,
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        assert first.role() == "master"

        async def run() -> tuple[dict[str, list[int]], ValkeyNode, AsyncRedisWorkQueue]:
            q = AsyncRedisWorkQueue("epochs-akill", url=sentinel_url(s), add_timeout=20.0)
            tokens: dict[str, list[int]] = {}
            stop = asyncio.Event()

            async def handle(key: str) -> None:
                tokens.setdefault(key, []).append(q.token(key))

            async def until(count: int, timeout: float) -> None:
                deadline = time.monotonic() + timeout
                while len(tokens) < count:
                    assert time.monotonic() < deadline, f"{len(tokens)} of {count} keys"
                    await asyncio.sleep(0.05)

            workers = asyncio.create_task(arun_workers(q, handle, 2, stop))
            try:
                await q.add_many([f"a{i}" for i in range(10)])
                await until(10, 10)
                first.kill()
                second = await asyncio.to_thread(s.wait_for_failover, first)
                await q.add_many([f"b{i}" for i in range(10)])
                await until(20, 20)
            finally:
                stop.set()
                await asyncio.wait_for(workers, 10)
                await q.aclose()
            return tokens, second, q

        tokens, second, q = asyncio.run(run())
        epoch = config_epoch(s)
        assert (first.role(), second.role()) == ("down", "master")
        before = [t for key, ts in tokens.items() if key.startswith("a") for t in ts]
        after = [t for key, ts in tokens.items() if key.startswith("b") for t in ts]
        assert epoch >= 1
        assert max(before) < BAND
        assert min(after) >= epoch * BAND
        assert len(set(before + after)) == len(before) + len(after)
        assert q._epochs is not None
        assert q._epochs.reads >= 2
        assert q._epochs.stale >= 1


def test_a_client_left_on_a_primary_frozen_past_its_failover_hands_out_lower_tokens(
    tmp_path: Path,
) -> None:
    with ValkeySentinelSet(tmp_path, down_after=1.0, failover_timeout=2.0) as s:
        first = s.wait_for_primary()
        assert first.role() == "master"
        old = RedisWorkQueue("epochs-freeze", url=sentinel_url(s), lease=5.0)
        new: RedisWorkQueue | None = None
        try:
            old.add_many([f"a{i}" for i in range(6)])
            first_token = take(old)  # old's pooled connection is to the primary
            first.freeze()
            try:
                second = s.wait_for_failover(first)
            finally:
                first.thaw()
            # Split brain: the old primary, resumed, still says it is one, and
            # old's pooled connection still reaches it; the sentinels demote it
            # only seconds later.
            assert (first.role(), second.role()) == ("master", "master")
            on_old = [take(old) for _ in range(3)]
            assert first.role() == "master"  # still: those hand-outs ran on it
            new = RedisWorkQueue("epochs-freeze", url=sentinel_url(s), lease=5.0)
            new.add_many([f"b{i}" for i in range(3)])
            on_new = [take(new) for _ in range(3)]
        finally:
            old.close()
            if new is not None:
                new.close()
        epoch = config_epoch(s)
        assert epoch >= 1
        assert old._epochs is not None
        assert old._epochs.view is not None
        assert old._epochs.view.epoch == 0  # it never left the old primary's view
        assert (old._epochs.reads, old._epochs.stale) == (1, 0)
        assert new is not None
        assert new._epochs is not None
        assert new._epochs.view is not None
        assert new._epochs.view.epoch == epoch
        assert on_old == [first_token + 1, first_token + 2, first_token + 3]
        assert max(on_old) < BAND <= epoch * BAND <= min(on_new)


def test_after_a_killed_cluster_primary_tokens_start_at_the_new_node_s_epoch(
    tmp_path: Path,
) -> None:
    with ValkeyCluster(tmp_path, node_timeout=1.0) as c:
        tag = "{epochs-kill}"
        first = c.primary_for(tag)
        assert first is not None
        assert first in c.nodes[:3]
        epoch_before = my_epoch(first)
        url = f"redis+cluster://{c.nodes[0].host}:{c.nodes[0].port}?socket_timeout=2"
        q = RedisWorkQueue("epochs-kill", url=url, lease=5.0, add_timeout=20.0)
        try:
            q.add_many([f"a{i}" for i in range(3)])
            before = [take(q) for _ in range(3)]
            first.kill()
            second = c.wait_for_failover(tag, first)
            q.add_many([f"b{i}" for i in range(3)])
            after = [take(q) for _ in range(3)]
        finally:
            q.close()
        epoch_after = my_epoch(second)
        assert second in c.nodes[3:]
        assert second.role() == "master"
        assert epoch_after > epoch_before
        assert min(before) >= epoch_before * BAND
        assert max(before) < (epoch_before + 1) * BAND
        assert min(after) >= epoch_after * BAND > max(before)
        assert q._epochs is not None
        assert q._epochs.reads >= 2
        assert q._epochs.stale >= 1


def test_a_sentinel_that_does_not_answer_delays_a_view_by_a_grace_not_its_timeout(
    sentinel_set: ValkeySentinelSet,
) -> None:
    # The sentinels' socket timeout is 2 s (the URL's): a view read asks every
    # sentinel, and one that is frozen must not hold every hand-out that long.
    s = sentinel_set
    s.wait_for_primary()
    frozen = s.sentinels[-1]  # redis-py's discovery asks the first: it answers
    frozen.freeze()
    try:
        with RedisWorkQueue("epochs-frozen-sentinel", url=sentinel_url(s)) as q:
            q.delete(force=True)
            q.add("k")
            began = time.monotonic()
            assert q.get_nowait() == "k"  # its view read first
            assert time.monotonic() - began < 1.0
            assert q._epochs is not None
            assert q._epochs.reads == 1
            q.done("k")

        async def asynchronous() -> float:
            aq = AsyncRedisWorkQueue("epochs-frozen-sentinel", url=sentinel_url(s))
            try:
                await aq.add("a")
                began = time.monotonic()
                assert await aq.get_nowait() == "a"
                took = time.monotonic() - began
                await aq.done("a")
                return took
            finally:
                await aq.aclose()

        assert asyncio.run(asynchronous()) < 1.0
    finally:
        frozen.thaw()
