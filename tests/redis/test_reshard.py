"""Resharding online: ``reshard(M)`` moves a queue's keys to their new shards while it runs.

Every client follows the map on the server: a call refused for an older map
reloads it; a moving key's calls go to its old shard while it is held
there, else the key is moved (export, import, finish) and asked of its new
shard. These tests pin the per-key rules across a move (coalescing, one
holder, the one redelivery, delays, failures, tokens increasing per key),
1 -> 3, 3 -> 6 and 6 -> 3 on one server and 1 -> 3 on a 3-primary Cluster,
and a mover that dies and is resumed. The kill -9 runs under load are
``test_reshard_killed.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest
import redis
import redis.asyncio
from click.testing import CliRunner, Result

import keyqueue
from keyqueue import Empty
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import AsyncRedisWorkQueue, RedisRateLimiter, RedisWorkQueue, shard_of
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name, split_limiter
from keyqueue.testing import FakeClock, ValkeyCluster
from tests.redis.test_shards import keys_where
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

WAIT = 10.0


def moving_keys(old: int, new: int, count: int, prefix: str = "m") -> list[str]:
    """``count`` keys whose shard changes from ``old`` shards to ``new``."""
    return keys_where(lambda key: shard_of(key, old) != shard_of(key, new), count, prefix)


def drain(q: RedisWorkQueue) -> dict[str, int]:
    """Every key waiting now, taken and done: key -> its token."""
    taken: dict[str, int] = {}
    while True:
        try:
            key = q.get_nowait()
        except Empty:
            return taken
        assert key not in taken, key
        taken[key] = q.token(key)
        q.done(key)


def depths(q: Any) -> list[int]:
    return [shard.stats().depth for shard in q._shards]


def wait_for(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# -- one server --------------------------------------------------------------------------


def test_one_shard_grows_to_three_with_every_key_and_its_state(
    make: Callable[..., RedisWorkQueue],
) -> None:
    plain = make(max_retries=5)
    for _ in range(2):  # two failures of "flaky", kept by the move
        if plain.stats().delayed == 0:
            plain.add("flaky")
        assert plain.get(timeout=WAIT) == "flaky"
        assert plain.retry("flaky")  # again after a backoff of a few ms
        plain.done("flaky")
    keys = [f"k{i}" for i in range(60)]
    plain.add_many(keys)
    plain.add_after("later", 100)
    time.sleep(0.1)  # flaky's backoff is over
    before = plain.stats()

    q = make(shards=3, max_retries=5)
    assert q.shards == 1  # follows the queue's one shard until resharded
    moved = q.reshard(3)
    assert q.shards == 3
    assert 30 < moved < 50  # about 2/3 of the 62 keys
    assert q.reshard(3) == 0  # done already: nothing to do
    after = q.stats()
    assert (after.depth, after.delayed) == (before.depth, before.delayed)
    for index, shard in enumerate(q._shards):  # type: ignore[attr-defined]
        waiting = {row.key for row in shard.snapshot(1000).waiting}
        assert all(shard_of(key, 3) == index for key in waiting), index
    snap = q.snapshot()
    assert [row.key for row in snap.delayed] == ["later"]
    assert 90 < snap.delayed[0].due_in <= 100
    assert q.num_requeues("flaky") == 2
    assert {row.key: row.failures for row in snap.failing} == {"flaky": 2}
    with pytest.raises(redis.exceptions.ResponseError, match=r"^MAPCHANGED .*shards=3"):
        plain.add("x")
    assert sorted(drain(q)) == sorted([*keys, "flaky"])


def test_tokens_of_a_key_keep_increasing_across_a_move(make: Callable[..., RedisWorkQueue]) -> None:
    q = make(shards=2)
    from_zero = [k for k in moving_keys(2, 4, 80) if shard_of(k, 2) == 0]
    waiting = next(k for k in from_zero if shard_of(k, 4) == 2)
    idle = next(k for k in from_zero if shard_of(k, 4) == 3)
    others = [f"o{i}" for i in range(400) if shard_of(f"o{i}", 2) == shard_of(f"o{i}", 4) == 0]
    q.add_many(others[:40])
    drain(q)  # shard 0 counts 40 tokens; the new shards 2 and 3 have counted none
    last = {}
    for key in (waiting, idle):
        q.add(key)
        assert q.get_nowait() == key
        last[key] = q.token(key)
        q.done(key)
    q.add(waiting)  # moved with its state; idle has none left: not exported
    q.reshard(4)
    assert depths(q)[2:] == [1, 0]
    q.add(idle)  # straight to shard 3, whose seq the reshard raised
    for key in (waiting, idle):
        assert q.get_nowait() == key
        assert q.token(key) > last[key]
        q.done(key)


def test_a_held_key_stays_until_done_then_moves_redelivered_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    worker, producer = make(shards=2), make(shards=2)
    held, moving = [k for k in moving_keys(2, 3, 10) if shard_of(k, 2) == 0][:2]
    worker.add(held)
    assert worker.get_nowait() == held
    first = worker.token(held)
    mover = make(shards=2)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(mover.reshard(3)))
    thread.start()
    try:
        wait_for(lambda: producer._reload_map() or producer._map.moving_from == 2)  # type: ignore[attr-defined]
        producer.add(held)  # held in its old shard: marked there, it stays
        producer.add(held)  # coalesced
        producer.add(moving)  # not held: moved, then added in its new shard
        assert depths(producer)[2] == 1
        assert producer.get_nowait() == moving
        producer.done(moving)
        time.sleep(0.2)
        assert thread.is_alive()  # the move waits for the hold
        with pytest.raises(Empty):
            producer.get_nowait()  # held's redelivery waits for its done
        worker.done(held)  # pushed again in its old shard; the mover moves it
        thread.join(WAIT)
        assert not thread.is_alive()
    finally:
        thread.join(WAIT)
    assert result == [1]
    assert producer.shards == 3
    assert producer.get_nowait() == held  # the one redelivery, from its new shard
    assert producer.token(held) > first
    producer.done(held)
    with pytest.raises(Empty):
        producer.get_nowait()
    assert worker.stats().dones == 3  # read with the map: every shard


def test_a_key_whose_holder_died_moves_once_its_lease_runs_out(
    make: Callable[..., RedisWorkQueue],
) -> None:
    dead = make(shards=2, lease=0.5)
    key = next(k for k in moving_keys(2, 3, 10) if shard_of(k, 2) == 0)
    dead.add(key)
    assert dead.get_nowait() == key
    for shard in dead._shards:  # type: ignore[attr-defined]
        shard._stop_renewing.set()  # it dies holding the key: no more renewals
    started = time.monotonic()
    make(shards=2).reshard(3)  # no getter runs: the mover takes the lease back itself
    assert 0.3 < time.monotonic() - started < 5
    q = make(shards=2)
    assert depths(q)[2] == 1
    assert q.get_nowait() == key
    q.done(key)


def test_three_shards_grow_to_six_and_shrink_to_two(make: Callable[..., RedisWorkQueue]) -> None:
    q = make(shards=3)
    keys = [f"g{i}" for i in range(300)]
    q.add_many(keys)
    q.add_after("later", 100)
    for shards in (6, 2):
        q.reshard(shards)
        assert q.shards == shards
        expected = [0] * 6
        for key in keys:
            expected[shard_of(key, shards)] += 1
        assert depths(q) == expected
        assert q.stats().delayed == 1
    assert sorted(drain(q)) == sorted(keys)


def test_shrunk_to_one_shard_the_queue_serves_unsharded_clients_again(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(shards=3)
    keys = [f"s{i}" for i in range(60)]
    q.add_many(keys)
    plain = make()
    with pytest.raises(redis.exceptions.ResponseError, match=r"^MAPCHANGED"):
        plain.add("x")
    q.reshard(1)
    assert q.shards == 1
    assert depths(q) == [60, 0, 0]
    plain.add("x")  # every key is in shard 0, the unsharded queue's slot
    assert sorted(drain(plain)) == sorted([*keys, "x"])


def test_a_client_made_before_the_reshard_follows_it_without_restart(
    make: Callable[..., RedisWorkQueue],
) -> None:
    early = make(shards=2)
    key = next(k for k in moving_keys(2, 4, 20) if shard_of(k, 4) == 3)
    make(shards=2).reshard(4)
    assert early.shards == 2  # not told yet: it learns at its next refused call
    early.add(key)  # refused for its old map: reloaded, routed to shard 3
    assert early.shards == 4
    assert depths(early)[3] == 1
    assert early.get_nowait() == key
    early.done(key)


BUCKETS = {
    "queue": RedisRateLimiter(base_delay=0.0, qps=6.0, burst=6),
    "endpoint": RedisRateLimiter(
        base_delay=0.0, qps=None, endpoint=lambda key: "api", endpoint_qps=6.0, endpoint_burst=6
    ),
}


def split_of(q: Any) -> list[Any]:
    """The rate limiter of each shard of the map ``q`` follows."""
    return [shard.rate_limiter for shard in q._shards[: q.shards]]


@pytest.mark.parametrize("bucket", list(BUCKETS))
def test_a_client_that_follows_a_reshard_splits_the_buckets_again(
    make: Callable[..., RedisWorkQueue], bucket: str
) -> None:
    """1 -> 6, followed by a client made with ``shards=2``: it splits the
    bucket 6 ways (qps/6, burst/6 per shard), so 60 keys retried at once
    come due no faster than the one bucket allows (burst + qps * t by the
    server's virtual clock), not 3 times as fast (its ``qps/2`` per shard)."""
    limiter, clock = BUCKETS[bucket], FakeClock()
    plain = make(clock=clock, rate_limiter=limiter)
    plain.add("seed")
    plain.done(plain.get_nowait())
    q = make(shards=2, clock=clock, rate_limiter=limiter)
    assert q.shards == 1
    assert split_of(q) == [split_limiter(limiter, 1)]  # one shard: the whole rate
    make(shards=2, clock=clock).reshard(6)
    keys = [f"r{i}" for i in range(60)]
    q.add_many(keys)  # refused for its old map: q follows 6 shards
    assert q.shards == 6
    assert split_of(q) == [split_limiter(limiter, 6)] * 6
    assert {shard_of(key, 6) for key in keys} == set(range(6))
    for _ in keys:  # every key fails at once: each shard's bucket goes into debt
        key = q.get_nowait()
        assert q.retry(key)
        q.done(key)
    released, elapsed = 0, 0.0
    for step in (0.0, 0.5, 1.0, 1.0, 2.0, 3.0):
        clock.step(step)
        elapsed += step
        released += len(drain(q))
        assert released <= 6 + 6.0 * elapsed, (elapsed, released)
    clock.step(30)
    assert released + len(drain(q)) == len(keys)  # nothing lost to the debt


def test_a_mover_that_dies_is_resumed_by_the_next_reshard(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(shards=3)
    keys = [f"r{i}" for i in range(120)]
    q.add_many(keys)
    dying = make(shards=3)
    real = dying._run_steps  # type: ignore[attr-defined]

    def killed_after_exports(steps: Generator[Any, Any, int]) -> int:
        def cut() -> Generator[Any, Any, int]:
            reply: Any = None
            imports = 0
            while True:
                step = steps.send(reply)
                if step[2] == "import":
                    imports += 1
                    if imports == 20:  # exported, not imported: kept in `moving`
                        raise KeyboardInterrupt
                reply = yield step

        return int(real(cut()))

    dying._run_steps = killed_after_exports  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        dying.reshard(6)
    assert q.stats().depth == len(keys) - 1  # the one exported key waits nowhere
    kept = [
        key.decode()
        for shard in q._shards  # type: ignore[attr-defined]
        for key in shard._client.hkeys(f"keyqueue:{hash_tag(shard.name)}:moving")
    ]
    assert len(kept) == 1
    other = make(shards=3)
    other.add(kept[0])  # its old shard says KEYMOVED: this client moves it, then adds
    assert q.stats().depth == len(keys)
    with pytest.raises(ValueError, match=r"reshard to 6 shards .* under way"):
        other.reshard(4)
    assert other.reshard(6) > 0
    assert q.stats().depth == len(keys)
    for shard in q._shards:  # type: ignore[attr-defined]
        raw = shard._client
        assert raw.hlen(f"keyqueue:{hash_tag(shard.name)}:moving") == 0
    assert sorted(drain(q)) == sorted(keys)


def test_an_unsharded_client_can_reshard_and_is_refused_after(
    make: Callable[..., RedisWorkQueue],
) -> None:
    plain = make()
    plain.add_many([f"u{i}" for i in range(30)])
    assert plain.reshard(2) > 0
    with pytest.raises(redis.exceptions.ResponseError, match=r"^MAPCHANGED"):
        plain.get_nowait()
    assert sorted(drain(make(shards=2))) == sorted(f"u{i}" for i in range(30))


def test_the_asyncio_client_reshards_and_follows(valkey_url: str, name: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        q = AsyncRedisWorkQueue(name, client=client, shards=2)
        other = AsyncRedisWorkQueue(name, client=client, shards=2)
        try:
            keys = [f"a{i}" for i in range(40)]
            await q.add_many(keys)
            assert await other.get_nowait() in keys  # other reads the map of 2
            assert await q.reshard(3) > 0
            assert q.shards == 3
            late = next(k for k in moving_keys(2, 3, 10, "late") if shard_of(k, 3) == 2)
            await other.add(late)  # refused for its old map: reloaded and routed
            assert other.shards == 3
            taken = set()
            while True:
                try:
                    key = await other.get_nowait()
                except Empty:
                    break
                taken.add(key)
                await other.done(key)
            assert len(taken) == len(keys)  # the one held since before the move is taken again
        finally:
            await q.aclose()
            await other.aclose()
            await client.aclose()

    asyncio.run(main())


def test_the_reshard_command_moves_the_keys_and_says_so(
    make: Callable[..., RedisWorkQueue], valkey_url: str, name: str
) -> None:
    plain = make()
    plain.add_many([f"c{i}" for i in range(30)])

    def invoke(*args: str) -> Result:
        command = ["reshard", name, "--redis-url", valkey_url, *args]
        return CliRunner().invoke(keyqueue_cli, command, prog_name="keyqueue")

    result = invoke("--shards", "3")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{name} has 3 shards: ")
    assert json.loads(invoke("--shards", "3", "--json").output) == {
        "queue": name,
        "shards": 3,
        "keys_moved": 0,
    }
    q = make(shards=2)
    assert q.shards == 3
    assert depths(q) == [sum(shard_of(f"c{i}", 3) == s for i in range(30)) for s in range(3)]
    missing = invoke()
    assert missing.exit_code == 2
    assert "--shards" in missing.output


def test_running_workers_follow_a_reshard_to_the_shards_it_adds(
    make: Callable[..., RedisWorkQueue], valkey_url: str, name: str
) -> None:
    plain = make()
    plain.add("first")
    workers = make(shards=2)  # on the queue's one shard until resharded; no shard 2 yet
    handled: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=lambda: keyqueue.run_workers(workers, handled.append, workers=2, stop=stop)
    )
    runner.start()
    try:
        wait_for(lambda: handled == ["first"])
        make(shards=2).reshard(3)
        late = [k for k in moving_keys(1, 3, 20, "late")]  # shards 1 and 2
        make(shards=3).add_many(late)
        wait_for(lambda: len(handled) == 21)
    finally:
        stop.set()
        runner.join(WAIT)
    assert sorted(handled) == sorted(["first", *late])

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(valkey_url)
        q = AsyncRedisWorkQueue(name, client=client, shards=3)
        done: list[str] = []
        astop = asyncio.Event()

        async def handle(key: str) -> None:
            done.append(key)

        task = asyncio.create_task(keyqueue.arun_workers(q, handle, workers=2, stop=astop))
        try:
            await q.add("a0")
            while done != ["a0"]:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(lambda: make(shards=2).reshard(5))
            more = [k for k in moving_keys(3, 5, 20, "more")]  # shards 3 and 4
            other = AsyncRedisWorkQueue(name, client=client, shards=5)
            await other.add_many(more)
            await other.aclose()
            for _ in range(int(WAIT / 0.01)):
                if len(done) == 21:
                    break
                await asyncio.sleep(0.01)
        finally:
            astop.set()
            await task
            await q.aclose()
            await client.aclose()
        assert sorted(done) == sorted(["a0", *more])

    asyncio.run(main())


# -- on a 3-primary cluster ------------------------------------------------------------------


def test_on_a_cluster_one_shard_grows_to_three_on_three_primaries(cluster: ValkeyCluster) -> None:
    client = redis.RedisCluster.from_url(cluster.url)
    try:
        for i in range(1000):
            queue = f"grow{i}"
            tags = [hash_tag(shard_name(queue, s)) for s in range(3)]
            if len({client.get_node_from_key(tag).name for tag in tags}) == 3:
                break
        plain = RedisWorkQueue(queue, client=client)
        keys = [f"c{i}" for i in range(150)]
        plain.add_many(keys)
        q = RedisWorkQueue(queue, client=client, shards=3)
        assert q.reshard(3) > 0
        where = {node.name: client.dbsize(target_nodes=node) for node in client.get_primaries()}
        assert all(count > 0 for count in where.values()), where
        expected = [0, 0, 0]
        for key in keys:
            expected[shard_of(key, 3)] += 1
        assert depths(q) == expected
        assert sorted(drain(q)) == sorted(keys)
        plain.close()
        q.close()
    finally:
        client.close()
