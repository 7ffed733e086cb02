"""What a killed worker process costs its keys, with real processes.

Worker processes claim keys in batches (``run_workers`` threads, or
``arun_workers`` tasks) with ``max_retries=1`` and 1 s leases; each handler
logs its start per key before anything else (``stall_worker`` in
tests/support/redis_processes.py), so the test knows which of the keys a dead
process held had reached a handler.

- A process killed (``SIGKILL``) at a random moment under saturation: no key
  whose handler never started is given up or charged anything; the keys
  whose handler started are at most stalls, never failures; a second process
  handles every key.
- A poison key, whose handler kills its own process at every start: each
  dead process's key comes back, is counted a stall once its start is known,
  and is given up as poison at its ``max_stalls + 1``-th stall in a row
  (``max_stalls`` 1 by default), ``on_give_up`` getting ``Stalled`` in the
  process that took the last lease back; a fresh process replaces each dead
  one.

Both fail if a lease a dead process left counts as one failure of its key:
with ``max_retries=1`` each key it held would be given up unprocessed
(started or not), and the poison key given up after its first crash as a
failing key, without ``on_give_up``.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from keyqueue import RunStats
from keyqueue.redis import RedisWorkQueue
from keyqueue.redis._schema import KEY_NAMES, key_names
from tests.support.redis_processes import CONTEXT, Names, Processes, processes, stall_worker

LEASE = 1.0
WAIT = 30.0  # generous bound on any wait for the system to get somewhere


@pytest.fixture
def procs() -> Iterator[Processes]:
    with processes() as owned:
        yield owned


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name}-{os.getpid()}-{time.monotonic_ns()}"


def wait_for(check: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def schema(name: str) -> dict[str, str]:
    return dict(zip(KEY_NAMES, key_names(name), strict=True))


def drained(raw: redis.Redis, name: str) -> bool:
    """Nothing waits, is held or delayed: read without a script (a script of
    the test's would reap the dead leases with its own settings)."""
    keys = schema(name)
    return not (
        raw.llen(keys["fifo"])
        or raw.zcard(keys["ranked"])
        or raw.zcard(keys["processing"])
        or raw.zcard(keys["delayed"])
    )


def counters(raw: redis.Redis, name: str) -> dict[str, int]:
    """The queue's counters, as the server keeps them (a field never counted is 0)."""
    return {k: int(float(v)) for k, v in raw.hgetall(schema(name)["stats"]).items()}


def lines(raw: redis.Redis, key: str) -> list[list[str]]:
    return [line.split() for line in raw.lrange(key, 0, -1)]


def add(url: str, name: str, keys: list[str]) -> None:
    adder = RedisWorkQueue(name, url=url)
    adder.add_many(keys)
    adder.close()  # no client of the test's reaps the dead process's leases


def disconnected(raw: redis.Redis, pid: int) -> bool:
    """The server has dropped every connection of the queue client of ``pid``
    (named ``host:pid``): whatever it had sent before it died has run."""
    return not any(c.get("name", "").endswith(f":{pid}") for c in raw.client_list())


@pytest.mark.parametrize(("front", "workers"), [("threads", 32), ("asyncio", 300)])
def test_a_process_killed_at_a_random_moment_under_saturation_costs_no_key_it_had_not_started(
    front: str, workers: int, valkey_url: str, procs: Processes, name: str
) -> None:
    """Up to eight processes in turn, each killed at a random moment while its
    workers are saturated, until one dies holding a key no handler had
    started (most do: the path is proven to run); then a last process drains
    the queue. Every key is handled; each key a dead process held is handled
    again by a later hold; no key is given up or charged a failure."""
    names = Names(name)
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    keys = [f"k{i}" for i in range(8000)]
    add(valkey_url, name, keys)
    held: dict[tuple[str, int], bool] = {}  # each dead hold -> whether its handler had started
    for _ in range(8):  # a kill finds one in most tries; rarely four in a row do not
        begun = raw.llen(names.begins)
        never = CONTEXT.Event()  # its own, never set: it is killed
        dying = procs.start(
            stall_worker, valkey_url, names, never, front, workers, LEASE, 1, work=0.01
        )
        enough = begun + 2 * workers
        wait_for(lambda n=enough: raw.llen(names.begins) >= n, "its handlers to run")
        time.sleep(random.uniform(0.0, 0.2))
        dying.kill()  # kill -9 under saturation: no done, no put back, no more renewals
        dying.join(WAIT)
        pid = dying.pid
        assert pid is not None
        wait_for(lambda p=pid: disconnected(raw, p), "the server to drop its connections")
        # What it held, read before any client reaps it (the test's none do).
        leases = raw.hgetall(schema(name)["lease"])
        began = {(key, int(token)) for key, token, _ in lines(raw, names.begins)}
        now = {(key, int(value.split()[0])) for key, value in leases.items()}
        held.update({hold: hold in began for hold in now})
        unstarted = [hold for hold in now if hold not in began]
        print(f"{front}: killed holding {len(now)}, of which no handler started {len(unstarted)}")
        if unstarted:
            break
    assert not all(held.values()), "no kill found a held key no handler had started"

    last = procs.start(stall_worker, valkey_url, names, procs.stop, front, 8, LEASE, 1)
    wait_for(lambda: drained(raw, name), "the last process to drain the queue")
    procs.stop.set()
    procs.join([last])

    records = lines(raw, names.records)
    assert set(keys) - {key for key, _, _ in records} == set()  # every key handled
    for key, token in held:  # each handled again, by a later hold
        assert any(k == key and int(t) > token for k, t, _ in records), (key, token)
    assert lines(raw, names.gave_up) == []
    s = counters(raw, name)
    # Every dead hold ran out; any more are the last process's own (a loaded
    # machine may starve its renewals past a 1 s lease).
    extra = s.get("leases_expired", 0) - len(held)
    assert extra >= 0
    # A stall is a hold the server knew started: handed to a worker (which
    # calls its handler at once; the handler's own log of it may not have
    # gone out before the kill), never a key the dead process had not handed
    # to a worker. None was given up, nor charged a failure (below).
    started = sum(held.values())
    print(f"stalls {s.get('stalls', 0)}, dead holds whose handler had logged its start {started}")
    dead = {key for key, _ in held}
    mine = {key for key, _, pid in lines(raw, names.begins) if int(pid) == last.pid}
    stalled = {key for kind, key in lines(raw, names.expired) if kind == "stall"}
    assert stalled <= dead | mine
    assert s.get("stalls", 0) <= len(held) + extra
    assert (s.get("given_up_stalls", 0), s.get("given_up_retries", 0)) == (0, 0)
    assert raw.zcard(schema(name)["failing"]) == 0  # no failure charged to any key
    stats = [RunStats(**json.loads(line)) for line in raw.lrange(names.stats, 0, -1)]
    assert [(r.gave_up, r.errors, r.lease_lost) for r in stats] == [(0, 0, 0)]
    raw.close()


@pytest.mark.parametrize("front", ["threads", "asyncio"])
def test_a_poison_key_that_kills_its_process_at_every_start_is_given_up_as_poison(
    front: str, valkey_url: str, procs: Processes, name: str
) -> None:
    names = Names(name)
    raw = redis.Redis.from_url(valkey_url, decode_responses=True)
    others = [f"k{i}" for i in range(20)]
    add(valkey_url, name, others)

    def start() -> tuple[Any, Any]:
        own = CONTEXT.Event()  # each its own: a killed process's Event cannot be set
        return procs.start(stall_worker, valkey_url, names, own, front, 4, LEASE, 1, "poison"), own

    current, event = start()
    wait_for(
        lambda: {key for key, _, _ in lines(raw, names.records)} == set(others),
        "the other keys to be handled",
    )
    # A handler records its key before its done is sent (with the next claim):
    # a key still held when the poison kills the process would stall with it.
    wait_for(lambda: not raw.hlen(schema(name)["lease"]), "the other keys' dones")
    add(valkey_url, name, ["poison"])  # nothing else is in flight from now on
    crashes = 0

    def given_up_or_gone() -> bool:
        """The poison key is neither waiting nor held, both read at once (MULTI):
        a reap between two reads would move it from the one read second."""
        keys = schema(name)
        pipe = raw.pipeline(transaction=True)
        pipe.hexists(keys["dirty"], "poison")
        pipe.hexists(keys["lease"], "poison")
        return bool(raw.llen(names.gave_up)) or not any(pipe.execute())

    def crashed_or_given_up() -> bool:
        return not current.is_alive() or given_up_or_gone()

    for _ in range(6):  # a bound: max_stalls + 2 crashes are expected at most
        wait_for(crashed_or_given_up, "a crash or the give-up")
        if current.is_alive():
            break
        current.join(WAIT)
        assert current.exitcode == -9  # it killed itself
        crashes += 1
        current, event = start()  # a fresh process picks up
    wait_for(lambda: raw.llen(names.gave_up), "on_give_up for the poison key", timeout=3 * LEASE)
    event.set()
    procs.join([current])

    assert lines(raw, names.gave_up) == [["poison", "Stalled"]]
    begins = [key for key, _, _ in lines(raw, names.begins) if key == "poison"]
    assert len(begins) == crashes  # each start of it killed its process
    s = counters(raw, name)
    # max_stalls (1) + 1 stalls in a row; one crash more if the first start was
    # not reported before the process died (charged nothing, then reported
    # before each later start).
    assert s.get("stalls", 0) == 2
    assert crashes in (2, 3)
    assert (s.get("given_up_stalls", 0), s.get("given_up_retries", 0)) == (1, 0)
    survivor = [line.split() for line in raw.lrange(names.expired, 0, -1)]
    assert ["poison", "poison"] in survivor  # the survivor's reap gave it up
    assert raw.hget(schema(name)["stalls"], "poison") is None  # its record gone with it
    stats = [RunStats(**json.loads(line)) for line in raw.lrange(names.stats, 0, -1)]
    assert stats == [RunStats()]  # the survivor handled nothing: no handler failed
    raw.close()
