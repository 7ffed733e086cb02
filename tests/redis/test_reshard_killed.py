"""Resharding under load, with ``kill -9`` of the mover and of a worker process.

Worker processes (``run_workers``, 4 threads each, 1 s leases) and producer
processes run on a queue while a mover process reshards it; the mover is
killed (SIGKILL) in the middle of the move and a second one resumes it; a
worker process is killed while it holds keys. Afterwards the recorded
history must keep every promise (``check_history``, tokens per key): no
key held by two live holders at once, tokens strictly increasing per key
across the move, every acknowledged add processed after it was made,
nothing left held. On one server 1 -> 3 shards, and on a 3-primary Cluster
3 -> 6.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from keyqueue.redis import RedisWorkQueue
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import AddRecord, HoldRecord, ValkeyCluster, check_history
from tests.support import valkey_server
from tests.support.redis_processes import CONTEXT, Names, Processes, processes
from tests.support.reshard_processes import mover, queue_client, sharded_producer, sharded_worker

WAIT = 20.0
BACKLOG = 3000  # keys waiting when the move starts: enough for the mover to be killed mid-way
HOT = [f"hot{i}" for i in range(40)]  # what the producers add, again and again

name = valkey_server.name  # fixture: a queue of this test's own


@pytest.fixture
def procs() -> Iterator[Processes]:
    with processes() as owned:
        yield owned


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def run_under_load(
    procs: Processes, url: str, cluster: bool, ledger: str, queue: str, start: int, target: int
) -> None:
    names = Names(queue)
    r = redis.Redis.from_url(ledger)
    client = queue_client(url, cluster)
    map_key = f"keyqueue:{hash_tag(shard_name(queue, 0))}:stats"
    seed = RedisWorkQueue(queue, client=client, shards=start)  # the queue at `start` shards
    backlog = [f"b{i}" for i in range(BACKLOG)]
    sent = time.monotonic()
    seed.add_many(backlog)
    adds = [AddRecord(key, sent) for key in backlog]
    seed.close()
    # Every client is made with the target count: each follows the queue's map.
    seed = RedisWorkQueue(queue, client=client, shards=target)
    assert seed.shards == start

    # The worker to be killed has a stop event of its own: a process killed while
    # it waits on one would leave the event's set() waiting for it.
    victim = procs.start(sharded_worker, url, cluster, ledger, names, CONTEXT.Event(), target)
    workers = [
        procs.start(sharded_worker, url, cluster, ledger, names, procs.stop, target)
        for _ in range(2)
    ]
    producers = [
        procs.start(sharded_producer, url, cluster, ledger, names, target, HOT, 5.0)
        for _ in range(2)
    ]
    time.sleep(0.3)
    first = procs.start(mover, url, cluster, names, target)
    wait_for(lambda: client.hget(map_key, "map_from") is not None, "the move to start")
    time.sleep(0.3)
    first.kill()  # SIGKILL, mid-move
    first.join(5)
    assert client.hget(map_key, "map_from") is not None, "the move ended before the kill"

    wait_for(lambda: r.llen(names.begins) > 0, "a handler to start")
    victim.kill()  # SIGKILL, holding keys (or about to)
    victim.join(5)
    killed_at = time.monotonic()
    workers.append(procs.start(sharded_worker, url, cluster, ledger, names, procs.stop, target))

    second = procs.start(mover, url, cluster, names, target)
    procs.join([second], timeout=WAIT)  # resumed, and finished
    assert client.hget(map_key, "map_from") is None
    procs.join(producers, timeout=WAIT)

    def idle() -> bool:
        s = seed.stats()
        return s.depth == s.processing == s.delayed == 0

    wait_for(idle, "the queue to drain")
    procs.stop.set()
    procs.join(workers, timeout=WAIT)
    assert seed.shards == target

    ended = {}
    for line in r.lrange(names.records, 0, -1):
        key, token, start_at, end_at, _, pid = line.decode().split()
        ended[key, int(token)] = HoldRecord(key, int(token), pid, float(start_at), float(end_at))
    holds = list(ended.values())
    for line in r.lrange(names.begins, 0, -1):
        key, token, start_at, pid = line.decode().split()
        if (key, int(token)) not in ended:  # the killed worker's: it ended when it died
            assert int(pid) == victim.pid, line
            holds.append(
                HoldRecord(key, int(token), pid, float(start_at), killed_at, outcome="unknown")
            )
    for line in r.lrange(names.produced, 0, -1):
        key, at = line.decode().split()
        adds.append(AddRecord(key, float(at)))
    found = check_history(holds, adds, tokens="key")
    assert found.ok, found.violations[:10]
    assert {h.key for h in holds} >= set(backlog)
    for index in range(target):
        # A client whose move of a key raced the mover's end may leave the
        # key's export there: one with no state (the key had none left).
        moving = f"keyqueue:{hash_tag(shard_name(queue, index))}:moving"
        for state in client.hvals(moving):
            assert set(json.loads(state)) == {"seq"}, state
    seed.close()
    client.close()
    r.close()


def test_one_shard_grows_to_three_under_load_with_the_mover_and_a_worker_killed(
    procs: Processes, valkey_url: str, name: str
) -> None:
    run_under_load(procs, valkey_url, False, valkey_url, name, 1, 3)


def test_on_a_cluster_three_shards_grow_to_six_under_load_with_kills(
    procs: Processes, cluster: ValkeyCluster, valkey_url: str, name: str
) -> None:
    run_under_load(procs, cluster.url, True, valkey_url, name, 3, 6)
