"""The Redis queue across processes, and the faults it must survive.

Many processes: four worker processes of four threads and eight producer
processes share one queue; every handler call is recorded, and no update is
lost and no key is held twice at once. Faults, each bounded in time, with
short leases: a worker process killed (``kill -9``) or stopped (``SIGSTOP``)
while it holds a key, one killed while it holds a batch of keys, the server
killed and restarted on its append-only file, and every connection killed
again and again while workers run.

Processes come from tests/support/redis_processes.py (forkserver children, killed at
the end of every test, also a failing one); servers of their own from
tests/support/valkey_server.py, stopped on every exit path.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

import keyqueue
from keyqueue import ItemFastSlowRateLimiter, RunStats
from keyqueue.redis import AsyncRedisWorkQueue, RedisStats, RedisWorkQueue
from keyqueue.redis._schema import KEY_NAMES, key_names
from tests.support.redis_processes import (
    CONTEXT,
    Names,
    Processes,
    Record,
    claiming_worker,
    processes,
    producer,
    server_time,
    stalled_claimant,
    worker,
)
from tests.support.valkey_server import ValkeyServer

LEASE = 0.5  # short leases: a fault is over in about one
WAIT = 20.0  # generous bound on any wait for the system to get somewhere
NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a key whose lease ran out comes back at once


@pytest.fixture
def procs() -> Iterator[Processes]:
    with processes() as owned:
        yield owned


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A server of this test's own (it may be killed, or all its clients)."""
    with ValkeyServer(tmp_path, config={"appendonly": "yes", "appendfsync": "always"}) as s:
        yield s


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """A bounded wait for something other processes or threads make true."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def idle(q: RedisWorkQueue) -> bool:
    s = q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


def held(r: redis.Redis, names: Names) -> tuple[str, int, int]:
    """Wait for a worker to report the key it holds on purpose: key, token, pid."""
    reply = r.blpop([names.held], timeout=WAIT)
    assert reply is not None, "no worker reported holding the key"
    key, token, pid = reply[1].decode().split()
    return key, int(token), int(pid)


def run_stats(r: redis.Redis, names: Names) -> list[RunStats]:
    return [RunStats(**json.loads(line)) for line in r.lrange(names.stats, 0, -1)]


# -- many processes ---------------------------------------------------------------------


def test_four_worker_processes_and_eight_producers_lose_no_update_and_never_overlap(
    valkey_url: str, procs: Processes, name: str
) -> None:
    """The lost-update workload: producers bump a key's version, then add it.
    Every handler records (key, token, start, end, version seen)."""
    names, rounds = Names(name), 1
    keys = [f"k{i}" for i in range(50)]
    r = redis.Redis.from_url(valkey_url)
    q = RedisWorkQueue(name, url=valkey_url)
    workers = [
        procs.start(worker, valkey_url, names, procs.stop, workers=4, work=0.001) for _ in range(4)
    ]
    producers = [procs.start(producer, valkey_url, names, keys, rounds, seed) for seed in range(8)]

    procs.join(producers)
    wait_for(lambda: idle(q), "the workers to finish every key")
    procs.stop.set()
    procs.join(workers)

    records = [Record.parse(line) for line in r.lrange(names.records, 0, -1)]
    written: dict[tuple[str, int], float] = {}
    for line in r.lrange(names.writes, 0, -1):
        key, version, at = line.decode().split()
        written[key, int(version)] = float(at)
    assert len(written) == 8 * rounds * len(keys)
    runs: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        runs[record.key].append(record)
    for key in keys:
        final = int(r.get(names.version(key)) or 0)
        assert final == 8 * rounds
        ordered = sorted(runs[key], key=lambda record: record.start)
        for before, after in itertools.pairwise(ordered):
            assert before.end <= after.start, f"{key}: two holders at once: {before}, {after}"
            assert before.token < after.token, f"{key}: tokens out of order: {before}, {after}"
        # The final write was followed by a handler that started after it and saw it.
        assert any(run.version == final and run.start >= written[key, final] for run in ordered), (
            key,
            final,
            written[key, final],
            ordered[-3:],
        )
    s = q.stats()
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing == len(written)
    assert s.gets == s.dones == len(records)
    assert (s.leases_expired, s.leases_lost) == (0, 0)
    outcomes = run_stats(r, names)
    assert len(outcomes) == 4
    assert sum(o.processed for o in outcomes) == sum(o.succeeded for o in outcomes) == len(records)
    q.close()
    r.close()


# -- a worker process dies or stalls while it holds a key --------------------------------


def test_a_killed_worker_process_loses_its_key_to_another_process_after_the_lease_once(
    valkey_url: str, procs: Processes, name: str
) -> None:
    names = Names(name)
    r = redis.Redis.from_url(valkey_url)
    q = RedisWorkQueue(name, url=valkey_url, lease=LEASE, rate_limiter=NOW)
    dying = procs.start(worker, valkey_url, names, procs.stop, workers=1, lease=LEASE, hold=("k",))
    q.add("k")
    _, token, pid = held(r, names)
    assert pid == dying.pid

    dying.kill()  # kill -9: no done, no more renewals
    killed = time.monotonic()
    dying.join(WAIT)

    assert q.get(timeout=WAIT) == "k"  # handed out again, to this process
    waited = time.monotonic() - killed
    assert LEASE / 2 < waited < LEASE + 3.0  # after the lease (renewed every third of it)
    assert q.token("k") > token
    q.done("k")
    s = q.stats()
    assert (s.gets, s.dones, s.leases_expired) == (2, 1, 1)
    assert (s.depth, s.processing, s.delayed) == (0, 0, 0)  # nothing owed: exactly once
    assert r.llen(names.records) == 0  # the killed handler never finished
    q.close()
    r.close()


BATCH_LEASE = 1.0  # the batch tests' lease: renewed every third, so >= 2/3 s left at a kill


def dead_leases(
    raw: redis.Redis, name: str, held: dict[str, int], killed: float
) -> dict[str, float]:
    """The leases a killed process left, read before any client reaps them:
    exactly the keys it ``held`` (key -> token), each renewed until the kill;
    when each runs out (the server's time)."""
    schema = dict(zip(KEY_NAMES, key_names(name), strict=True))
    leases = {key: int(value.split()[0]) for key, value in raw.hgetall(schema["lease"]).items()}
    assert leases == held
    expiry = dict(raw.zrange(schema["processing"], 0, -1, withscores=True))
    assert set(expiry) == set(held)
    assert all(killed < at <= killed + BATCH_LEASE for at in expiry.values()), (killed, expiry)
    return expiry


def handled_once_more(
    valkey_url: str,
    procs: Processes,
    names: Names,
    keys: list[str],
    held: dict[str, int],
    expiry: dict[str, float],
    killed: float,
) -> RedisStats:
    """A second process handles every key once; each key the dead one held,
    only once that holder's lease ran out (never while it was valid), with a
    higher token. The queue's stats once it is idle."""
    second = procs.start(claiming_worker, valkey_url, names, procs.stop, lease=BATCH_LEASE)
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    q = RedisWorkQueue(names.queue, url=valkey_url)
    try:
        wait_for(lambda: raw.llen(names.records) == len(keys) and idle(q), "every key handled")
        procs.stop.set()
        procs.join([second])
        records = [Record.parse(line) for line in raw.lrange(names.records, 0, -1)]
        assert sorted(record.key for record in records) == keys  # each once
        assert {record.pid for record in records} == {second.pid}
        again = {record.key: record for record in records}
        for key, token in held.items():
            record = again[key]
            assert record.token > token
            assert record.start >= expiry[key], (key, record, expiry[key])  # not while valid
            assert BATCH_LEASE / 2 < record.start - killed < BATCH_LEASE + 3.0
        assert run_stats(raw, names) == [RunStats(processed=len(keys), succeeded=len(keys))]
        return q.stats()
    finally:
        q.close()
        raw.close()


def test_a_worker_process_killed_holding_a_batch_loses_each_key_back_once_after_its_lease(
    valkey_url: str, procs: Processes, name: str
) -> None:
    """A process of four threads claims keys in batches; its four handlers block,
    so it holds four keys (two more wait) when it is killed. Each held key comes
    back once its lease runs out, and a second process handles it once; no
    handler starts while the dead holder's lease on its key is still valid
    (the lease's expiry read on the server after the kill; times the server's)."""
    names = Names(name)
    keys = [f"k{i}" for i in range(6)]
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    adder = RedisWorkQueue(name, url=valkey_url)
    adder.add_many(keys)
    adder.close()  # no client of the test's reaps the dead process's leases early
    # Its own stop event, never set: a process killed while it waits on one
    # leaves a multiprocessing Event whose set() would wait for it forever.
    never = CONTEXT.Event()
    dying = procs.start(claiming_worker, valkey_url, names, never, lease=BATCH_LEASE, block=True)
    wait_for(lambda: raw.llen(names.begins) == 4, "the four handlers to start")
    begun = {}
    for line in raw.lrange(names.begins, 0, -1):
        key, token, start, pid = line.split()
        assert int(pid) == dying.pid
        begun[key] = (int(token), float(start))

    dying.kill()  # kill -9 while it holds them: no done, no put back, no more renewals
    dying.join(WAIT)
    killed = server_time(raw)

    held = {key: token for key, (token, _) in begun.items()}
    expiry = dead_leases(raw, name, held, killed)
    assert all(expiry[key] > start for key, (_, start) in begun.items())
    s = handled_once_more(valkey_url, procs, names, keys, held, expiry, killed)
    assert raw.llen(names.begins) == 4 + len(keys)  # started once more each, no more
    assert (s.leases_expired, s.leases_lost, s.gets, s.dones) == (4, 0, 10, 6)
    assert (s.depth, s.processing, s.delayed) == (0, 0, 0)
    raw.close()


def test_a_worker_process_killed_with_claimed_keys_not_yet_started_loses_them_after_the_lease(
    valkey_url: str, procs: Processes, name: str
) -> None:
    """A process's claim for its four waiting workers is answered and the
    process is killed before it hands any key out: the claimed keys stay its
    own while it renews them, then come back once each after the lease (its
    holds end as a dead holder's do) and a second process handles each once."""
    names = Names(name)
    keys = [f"k{i}" for i in range(6)]
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    dying = procs.start(stalled_claimant, valkey_url, names, lease=BATCH_LEASE)
    assert raw.blpop([names.ready], timeout=WAIT) is not None, "its workers did not all wait"
    adder = RedisWorkQueue(name, url=valkey_url)
    adder.add_many(keys)
    adder.close()
    reply = raw.blpop([names.held], timeout=WAIT)
    assert reply is not None, "the claim was not answered"
    pairs = reply[1].split()
    held = {pairs[i]: int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
    assert list(held) == keys[:4]  # one claim for the four workers, in FIFO order
    claimed = server_time(raw)
    processing = dict(zip(KEY_NAMES, key_names(name), strict=True))["processing"]

    def renewed() -> bool:
        expiry = dict(raw.zrange(processing, 0, -1, withscores=True))
        return set(expiry) == set(held) and min(expiry.values()) > claimed + BATCH_LEASE

    # Its claimed keys stay its own past a lease: renewed though no handler runs.
    wait_for(renewed, "the claimed keys' leases to be renewed")

    dying.kill()  # kill -9 with the keys claimed, none handed out
    dying.join(WAIT)
    killed = server_time(raw)

    expiry = dead_leases(raw, name, held, killed)
    s = handled_once_more(valkey_url, procs, names, keys, held, expiry, killed)
    assert raw.llen(names.begins) == len(keys)  # the dead process started none
    assert (s.leases_expired, s.leases_lost, s.gets, s.dones) == (4, 0, 10, 6)
    assert (s.depth, s.processing, s.delayed) == (0, 0, 0)
    raw.close()


def test_a_stopped_holder_resumed_after_its_lease_gets_lease_lost_and_the_new_holder_is_untouched(
    valkey_url: str, procs: Processes, name: str
) -> None:
    names = Names(name)
    r = redis.Redis.from_url(valkey_url)
    q = RedisWorkQueue(name, url=valkey_url, lease=LEASE, rate_limiter=NOW)
    stalled = procs.start(
        worker, valkey_url, names, procs.stop, workers=1, lease=LEASE, hold=("k",)
    )
    q.add("k")
    _, stale_token, pid = held(r, names)
    assert pid == stalled.pid

    os.kill(pid, signal.SIGSTOP)  # a stall: GC pause, swapped out, VM frozen
    try:
        assert q.get(timeout=WAIT) == "k"  # its lease ran out: handed to this process
        token = q.token("k")
        assert token > stale_token
    finally:
        os.kill(pid, signal.SIGCONT)
    r.rpush(names.go, "1")  # the stalled handler returns: the runner calls done
    wait_for(lambda: r.llen(names.records) == 1, "the resumed handler to finish")
    procs.stop.set()
    procs.join([stalled])

    [outcome] = run_stats(r, names)
    assert outcome == RunStats(processed=1, lease_lost=1)  # its done raised LeaseLost
    assert q.token("k") == token  # the new hold is untouched
    s = q.stats()
    assert (s.processing, s.leases_expired, s.leases_lost, s.dones) == (1, 1, 1, 0)
    q.done("k")
    s = q.stats()
    assert (s.dones, s.depth, s.processing, s.delayed) == (1, 0, 0, 0)
    q.close()
    r.close()


# -- the server crashes ---------------------------------------------------------------------


def test_a_server_killed_and_restarted_on_its_append_only_file_loses_no_added_key(
    server: ValkeyServer, caplog: pytest.LogCaptureFixture
) -> None:
    """appendfsync always: every reply came after the write was on disk. Workers
    that start while the server is down reconnect once it is back."""
    keys = [f"k{i}" for i in range(20)]
    producer_q = RedisWorkQueue("crash", url=server.url, lease=LEASE, rate_limiter=NOW)
    no_retries = redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    worker_q = RedisWorkQueue("crash", client=no_retries, lease=LEASE, rate_limiter=NOW)
    holder = RedisWorkQueue("crash", url=server.url, lease=LEASE, rate_limiter=NOW)
    for key in keys:
        producer_q.add(key)
    producer_q.add_after("later", 0.3)
    taken = [holder.get_nowait() for _ in range(3)]
    producer_q.add(taken[0])  # changed while held: owed a redelivery
    holder.close()  # the holder dies with the server: its leases are not renewed

    server.kill()
    handled: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(
        target=keyqueue.run_workers,
        args=(worker_q, handled.append),
        kwargs={"workers": 2, "stop": stop},
    )
    runner.start()
    try:
        wait_for(
            lambda: any("get raised" in m.getMessage() for m in caplog.records),
            "a worker to find the server down",
        )
        server.start()  # the same directory and port
        wait_for(lambda: set(keys) | {"later"} <= set(handled), "every added key to be handled")
        wait_for(lambda: idle(producer_q), "the queue to settle")
    finally:
        stop.set()
        runner.join(WAIT)
    assert not runner.is_alive()
    s = producer_q.stats()
    assert s.leases_expired == 3  # the three leases came back from the file, then ran out
    assert handled.count(taken[0]) >= 1
    producer_q.close()
    worker_q.close()
    no_retries.close()


# -- connections dropped mid-run --------------------------------------------------------


def _retrying(url: str) -> redis.Redis:
    """A client for the test's own producer, which must not fail while connections
    are killed (``from_url`` clients do not retry: retry=Retry(..., 0))."""
    return redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=0.1, base=0.005), 50))


def _produce(q: RedisWorkQueue, key: str) -> None:
    """The producer's add, tried again when a kill escapes its client's Retry: that
    covers sending and reading, not redis-py's check of a pooled connection before
    them (a kill between that check's reconnect and its read raises ConnectionError
    out of ``get_connection``; beside two busy loops it did). An add is idempotent."""
    for attempt in itertools.count(1):
        try:
            q.add(key)
            return
        except redis.ConnectionError:
            if attempt == 20:
                raise
            time.sleep(0.005)


def _kill_connections(url: str, stop: threading.Event, kills: int = 15) -> int:
    """From an admin connection: kill every other client connection, every 30 ms."""
    admin = redis.Redis.from_url(url)
    killed = 0
    try:
        for _ in range(kills):
            killed += int(admin.client_kill_filter(_type="normal", skipme=True))
            if stop.wait(0.03):
                break
    finally:
        admin.close()
    return killed


def test_thread_workers_reconnect_and_go_on_when_their_connections_are_killed(
    server: ValkeyServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Clients without redis-py retries, so every drop reaches the queue and the
    runner: a get that raises is retried after a backoff, a done asked again."""
    caplog.set_level(logging.WARNING, logger="keyqueue")
    keys = [f"k{i}" for i in range(20)]
    version: dict[str, int] = dict.fromkeys(keys, 0)
    seen: dict[str, int] = dict.fromkeys(keys, -1)
    holding: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            if key in holding:
                overlaps.append(key)
            holding.add(key)
            current = version[key]
        time.sleep(0.001)
        with lock:
            holding.discard(key)
            seen[key] = max(seen[key], current)

    clients = [
        RedisWorkQueue(
            "drops",
            client=redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0)),
            lease=LEASE,
            rate_limiter=NOW,
        )
        for _ in range(2)
    ]
    producer_client = _retrying(server.url)
    producer_q = RedisWorkQueue("drops", client=producer_client, lease=LEASE)
    stop, killing_done = threading.Event(), threading.Event()
    results: list[RunStats] = []
    runners = [
        threading.Thread(
            target=lambda q=q: results.append(keyqueue.run_workers(q, handle, workers=2, stop=stop))
        )
        for q in clients
    ]
    killed: list[int] = []
    killer = threading.Thread(
        target=lambda: killed.append(_kill_connections(server.url, killing_done))
    )
    for thread in [*runners, killer]:
        thread.start()
    try:
        while killer.is_alive():  # produce while connections are being killed
            for key in keys:
                with lock:
                    version[key] += 1
                _produce(producer_q, key)
            killer.join(0.01)
        wait_for(
            lambda: all(seen[key] >= version[key] for key in keys),
            "every key's last version to be handled",
        )
    finally:
        killing_done.set()
        stop.set()
        for thread in [*runners, killer]:
            thread.join(WAIT)
    assert not any(thread.is_alive() for thread in runners)
    assert len(results) == 2  # both runners went on until told to stop
    assert overlaps == []
    assert killed[0] > 0
    warnings = [r.getMessage() for r in caplog.records]
    assert any("get raised" in m for m in warnings), "no drop reached a worker"
    for q in clients:
        q.close()
        q._client.close()
    producer_q.close()
    producer_client.close()


async def test_async_workers_reconnect_and_go_on_when_their_connections_are_killed(
    server: ValkeyServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="keyqueue")
    keys = [f"k{i}" for i in range(20)]
    version: dict[str, int] = dict.fromkeys(keys, 0)
    seen: dict[str, int] = dict.fromkeys(keys, -1)

    async def handle(key: str) -> None:
        current = version[key]
        await asyncio.sleep(0.001)
        seen[key] = max(seen[key], current)

    client = redis.asyncio.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    q = AsyncRedisWorkQueue("adrops", client=client, lease=LEASE, rate_limiter=NOW)
    producer_client = _retrying(server.url)
    producer_q = RedisWorkQueue("adrops", client=producer_client, lease=LEASE)
    stop, killing_done = asyncio.Event(), threading.Event()
    runner = asyncio.create_task(keyqueue.arun_workers(q, handle, workers=4, stop=stop))
    killer = asyncio.create_task(asyncio.to_thread(_kill_connections, server.url, killing_done))
    try:
        while not killer.done():
            for key in keys:
                version[key] += 1
                await asyncio.to_thread(_produce, producer_q, key)
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + WAIT
        while not all(seen[key] >= version[key] for key in keys):
            assert time.monotonic() < deadline, "every key's last version to be handled"
            assert not runner.done(), runner
            await asyncio.sleep(0.005)
    finally:
        killing_done.set()
        stop.set()
        stats = await asyncio.wait_for(runner, WAIT)
        killed = await killer
    assert killed > 0
    assert stats.processed >= len(keys)
    warnings = [r.getMessage() for r in caplog.records]
    assert any("get raised" in m for m in warnings), "no drop reached a worker"
    await q.aclose()
    await client.aclose()
    producer_q.close()
    producer_client.close()
