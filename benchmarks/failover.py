"""What a primary's failover costs the queue today: a short chaos run on real replicas.

    PYTHONPATH=src python benchmarks/failover.py --topology sentinel|cluster
        --fault kill|lag-kill|stop|pause|isolate [--duration S] [--every S] [--processes N]
        [--threads T] [--keys K] [--down-after S] [--lease S] [--seed N]
        [--restart replica|as-configured]

One topology from ``keyqueue.testing`` (``ValkeySentinelSet``: 1 primary, 2
replicas, 3 sentinels, quorum 2; ``ValkeyCluster``: 3 primaries, 3
replicas) holds the queue; a plain valkey-server of its own, which no fault
touches, holds the fenced store (``ValkeyFence``: a write with a lower token
than the key's highest is refused) and the record. ``--processes`` worker
processes run ``run_workers`` with ``--threads`` threads each, through the
client a user would pass (``Sentinel(...).master_for(...)``, a
``RedisCluster``); each handler call reads its token, works 2 to 10 ms,
writes the store with its token and records the hold (key, token, holder,
start, end, accepted). A producer thread adds ``--keys`` hot keys at random,
recording every add that returned (with the time it was sent) and counting
every one that raised, by exception.

Every ``--every`` seconds for ``--duration`` seconds the queue's primary
gets ``--fault``: ``kill`` (``kill -9``, restarted 2 s after its failover
is seen: it comes back as a replica of the current primary, or with
``--restart as-configured`` as it was, an old primary returning empty),
``lag-kill`` (its replicas cut off for 0.5 s, so they lag, then ``kill -9``:
a crash while the replicas lag; Sentinel: ``cut_replication``; Cluster:
``drop_replicas`` every 50 ms, which the replicas outrun by reconnecting),
``stop`` (``SIGSTOP`` for 6 s: past its failover; then ``SIGCONT``),
``pause`` (``CLIENT PAUSE`` 6 s) or
``isolate`` (6 s: from the sentinels only; in a Cluster, from the other
nodes only, its bus behind relays). Each failover is
confirmed from the servers (the sentinels or the Cluster name another
primary, which says so). Then the producer stops, the queue is drained
(bounded), the workers stop, and ``check_history`` judges the record:
tokens reissued, token regressions, overlapping valid holds (stale wins),
acknowledged adds lost, keys left held. One JSON line with the figures.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

import redis
import redis.sentinel
from redis.cluster import ClusterNode

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import (
    AddRecord,
    HoldRecord,
    ValkeyCluster,
    ValkeyFence,
    ValkeyNode,
    ValkeySentinelSet,
    check_history,
    local_valkey,
)

QUEUE = "chaos"
SERVICE = "keyqueue"


def make_client(spec: dict[str, Any]) -> redis.Redis | redis.RedisCluster:
    """The client a user would pass, from the topology's description."""
    if spec["topology"] == "sentinel":
        sentinel = redis.sentinel.Sentinel(
            [tuple(a) for a in spec["sentinels"]], socket_timeout=1.0
        )
        return sentinel.master_for(
            SERVICE, socket_timeout=2.0, username=spec["user"], password=spec["password"]
        )
    nodes = [ClusterNode(h, p) for h, p in spec["nodes"]]
    return redis.RedisCluster(startup_nodes=nodes, socket_timeout=2.0)


def worker(spec: dict[str, Any], ledger_url: str, threads: int, lease: float) -> None:
    """One worker process: ``run_workers`` until the ledger says stop."""
    ledger = redis.Redis.from_url(ledger_url)
    fence = ValkeyFence(ledger)
    holder = f"w{os.getpid()}"
    queue = RedisWorkQueue(QUEUE, client=make_client(spec), lease=lease, holder=holder)
    stop = threading.Event()

    def handler(key: str) -> None:
        start = time.monotonic()
        token = queue.token(key)
        time.sleep(random.uniform(0.002, 0.010))
        accepted = fence.write(key, token, holder)
        end = time.monotonic()
        ledger.rpush("holds", json.dumps([key, token, holder, start, end, accepted]))

    def watch() -> None:  # the ledger says stop, or is gone with the run
        while not stop.is_set():
            try:
                if ledger.get("stop"):
                    stop.set()
            except redis.exceptions.ConnectionError:
                stop.set()
            time.sleep(0.3)

    threading.Thread(target=watch, daemon=True).start()
    stats = run_workers(queue, handler, workers=threads, stop=stop)
    ledger.rpush("stats", json.dumps(dataclasses.asdict(stats)))
    queue.close()


def primary_of(topology: ValkeySentinelSet | ValkeyCluster) -> ValkeyNode | None:
    if isinstance(topology, ValkeySentinelSet):
        return topology.primary()
    return topology.primary_for("{" + QUEUE + "}")


def failover_of(topology: ValkeySentinelSet | ValkeyCluster, old: ValkeyNode) -> ValkeyNode:
    if isinstance(topology, ValkeySentinelSet):
        return topology.wait_for_failover(old, timeout=20)
    return topology.wait_for_failover("{" + QUEUE + "}", old, timeout=20)


LAG = 0.5
"""Seconds a ``lag-kill`` keeps cutting the replicas' links before it kills their primary."""


def replicas_of(
    topology: ValkeySentinelSet | ValkeyCluster, primary: ValkeyNode
) -> list[ValkeyNode]:
    """The nodes that replicate ``primary`` now (its ``INFO replication``)."""
    ports = {
        int(value.split("port=")[1].split(",")[0])
        for name, value in primary.info().items()
        if name.startswith("slave") and "port=" in value
    }
    return [node for node in topology.nodes if node.port in ports]


def watch_primaries(
    topology: ValkeySentinelSet | ValkeyCluster, stop: threading.Event, seen: list[str]
) -> None:
    """Record each change of the queue's primary (every failover, caused or not)."""
    while not stop.is_set():
        try:
            node = primary_of(topology)
        except Exception:  # a node frozen or gone: look again
            node = None
        if node is not None and (not seen or seen[-1] != node.name):
            seen.append(node.name)
        time.sleep(0.25)


def inject(
    topology: ValkeySentinelSet | ValkeyCluster,
    fault: str,
    log: list[dict[str, Any]],
    restart: str = "replica",
) -> None:
    """One fault on the queue's primary; waits for the failover and restores the node."""
    old = None
    deadline = time.monotonic() + 10
    while old is None and time.monotonic() < deadline:
        old = primary_of(topology)
        if old is None:
            time.sleep(0.2)
    if old is None:
        log.append({"fault": fault, "error": "no primary to fault"})
        return
    began = time.monotonic()
    entry: dict[str, Any] = {"fault": fault, "old": old.name, "at": began}
    lagging: list[ValkeyNode] = []
    if fault == "kill":
        old.kill()
    elif fault == "lag-kill":
        lagging = replicas_of(topology, old)
        if isinstance(topology, ValkeySentinelSet):
            topology.cut_replication(old)
            time.sleep(LAG)
        else:  # no users on the Cluster: drop the links as often as they come back
            cut_until = time.monotonic() + LAG
            while time.monotonic() < cut_until:
                old.drop_replicas()
                time.sleep(0.05)
        old.kill()
    elif fault == "stop":
        old.freeze()
    elif fault == "pause":
        old.pause_clients(6.0)
    elif fault == "isolate" and isinstance(topology, ValkeySentinelSet):
        topology.isolate_from_sentinels(old)
    elif fault == "isolate":
        topology.isolate(old)
    try:
        new = failover_of(topology, old)
        entry.update(new=new.name, failover_s=round(time.monotonic() - began, 2))
    except Exception as exc:  # recorded; the run goes on
        entry["error"] = str(exc).splitlines()[0]
    entry["lagging"] = [r.name for r in lagging]
    if fault in ("kill", "lag-kill"):
        time.sleep(2.0)
        if isinstance(topology, ValkeySentinelSet) and restart == "replica":
            topology.restart_as_replica(old)
        else:
            old.start()
    elif fault in ("stop", "isolate"):
        time.sleep(max(0.0, began + 6.0 - time.monotonic()))
        if fault == "stop":
            old.thaw()
        elif isinstance(topology, ValkeySentinelSet):
            topology.rejoin_sentinels(old)
        else:
            topology.rejoin(old)
    entry["old_role_after"] = old.role(timeout=1.0)
    log.append(entry)


def produce(
    client: redis.Redis | redis.RedisCluster,
    keys: int,
    stop: threading.Event,
    adds: list[AddRecord],
    errors: collections.Counter[str],
    latencies: list[float],
) -> None:
    queue = RedisWorkQueue(QUEUE, client=client)
    while not stop.is_set():
        key = f"k{random.randrange(keys)}"
        sent = time.monotonic()
        try:
            queue.add(key)
        except Exception as exc:  # counted: what a producer sees today
            errors[type(exc).__name__] += 1
            time.sleep(0.05)
            continue
        latencies.append(time.monotonic() - sent)
        adds.append(AddRecord(key, sent))
        time.sleep(0.004)


def drain(client: redis.Redis | redis.RedisCluster, timeout: float) -> dict[str, int]:
    """Wait until nothing waits or is held (or ``timeout``); the last stats read."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            with RedisWorkQueue(QUEUE, client=client) as q:
                stats = q.stats()
            last = {
                "depth": stats.depth,
                "processing": stats.processing,
                "delayed": stats.delayed,
                "dirty": getattr(stats, "dirty", -1),
            }
            if not stats.depth and not stats.processing and not stats.delayed:
                return last
        except Exception as exc:  # the topology may still settle
            last = {"error": 1, "depth": -1, "processing": -1, "delayed": -1, "dirty": -1}
            del exc
        time.sleep(0.5)
    return last


def _spans(times: list[float]) -> list[list[float]]:
    """Times (seconds since the start) as [first, last, count] runs, split at gaps over 1 s."""
    spans: list[list[float]] = []
    for t in sorted(times):
        if spans and t - spans[-1][1] <= 1.0:
            spans[-1][1] = round(t, 2)
            spans[-1][2] += 1
        else:
            spans.append([round(t, 2), round(t, 2), 1])
    return spans


def run(args: argparse.Namespace) -> dict[str, Any]:
    random.seed(args.seed)
    topology: ValkeySentinelSet | ValkeyCluster
    if args.topology == "sentinel":
        topology = ValkeySentinelSet(down_after=args.down_after, failover_timeout=3.0)
    else:
        topology = ValkeyCluster(
            node_timeout=args.down_after, partitionable=args.fault == "isolate"
        )
    workers: list[subprocess.Popen[bytes]] = []
    with local_valkey() as ledger_url, topology:
        if isinstance(topology, ValkeySentinelSet):
            user, password = topology.credentials
            spec: dict[str, Any] = {
                "topology": "sentinel",
                "sentinels": topology.sentinel_addresses,
                "user": user,
                "password": password,
            }
        else:
            spec = {"topology": "cluster", "nodes": topology.addresses}
        ledger = redis.Redis.from_url(ledger_url)
        try:
            for _ in range(args.processes):
                workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            __file__,
                            "--worker",
                            json.dumps(spec),
                            ledger_url,
                            str(args.threads),
                            str(args.lease),
                        ]
                    )
                )
            client = make_client(spec)
            adds: list[AddRecord] = []
            errors: collections.Counter[str] = collections.Counter()
            latencies: list[float] = []
            stop = threading.Event()
            producer = threading.Thread(
                target=produce, args=(client, args.keys, stop, adds, errors, latencies)
            )
            producer.start()
            primaries: list[str] = []
            watcher = threading.Thread(target=watch_primaries, args=(topology, stop, primaries))
            watcher.start()
            faults: list[dict[str, Any]] = []
            began = time.monotonic()
            time.sleep(3.0)
            while time.monotonic() - began < args.duration:
                round_began = time.monotonic()
                inject(topology, args.fault, faults, args.restart)
                time.sleep(max(0.5, round_began + args.every - time.monotonic()))
            stop.set()
            producer.join()
            watcher.join()
            time.sleep(1.0)
            left = drain(client, 30.0)
            ledger.set("stop", "1")
            for process in workers:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
            holds = [
                HoldRecord(k, t, h, s, e, accepted=bool(a))
                for k, t, h, s, e, a in (json.loads(x) for x in ledger.lrange("holds", 0, -1))
            ]
            run_stats = [json.loads(x) for x in ledger.lrange("stats", 0, -1)]
            found = check_history(
                holds, adds, left_held=[f"?{i}" for i in range(left.get("processing", 0))]
            )
            for entry in faults:
                entry["at"] = round(entry["at"] - began, 2)
            latest: dict[str, float] = {}
            for h in holds:
                if h.accepted:
                    latest[h.key] = max(latest.get(h.key, -1.0), h.start)
            counts = collections.Counter(h.token for h in holds)
            tokens_twice = {t for t, n in counts.items() if n > 1}
            starts = sorted(h.start for h in holds)
            gaps = sorted((b - a for a, b in itertools.pairwise(starts)), reverse=True)
            latencies.sort()
            return {
                "topology": args.topology,
                "fault": args.fault,
                "down_after": args.down_after,
                "faults": len(faults),
                "failovers_seen": sum(1 for f in faults if "new" in f),
                "primary_changes": len(primaries) - 1,
                "fault_log": faults,
                "holds": found.holds,
                "acked_adds": found.adds,
                "tokens_reissued": found.tokens_reissued,
                "token_regressions": found.token_regressions,
                "overlaps": found.overlaps,
                "stale_wins": found.stale_wins,
                "refused_writes": sum(1 for h in holds if not h.accepted),
                "adds_lost": found.adds_lost,
                "left": left,
                "producer_errors": dict(errors),
                "add_p50_ms": round(1000 * latencies[len(latencies) // 2], 2)
                if latencies
                else None,
                "add_p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 2)
                if latencies
                else None,
                "longest_pauses_s": [round(g, 2) for g in gaps[:3]],
                "run_stats": run_stats,
                "lost_adds_s": _spans(
                    [a.time - began for a in adds if latest.get(a.key, -1.0) <= a.time]
                ),
                "reissued_s": _spans([h.start - began for h in holds if (h.token in tokens_twice)]),
            }
        finally:
            ledger.set("stop", "1")
            for process in workers:
                if process.poll() is None:
                    process.kill()
                    process.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        spec, ledger_url, threads, lease = sys.argv[2:6]
        worker(json.loads(spec), ledger_url, int(threads), float(lease))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", choices=["sentinel", "cluster"], default="sentinel")
    parser.add_argument(
        "--fault", choices=["kill", "lag-kill", "stop", "pause", "isolate"], default="kill"
    )
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--down-after", type=float, default=1.0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--restart",
        choices=["replica", "as-configured"],
        default="replica",
        help="how a killed Sentinel-set node comes back: following the current primary, "
        "or as it was configured (an old primary then returns an empty primary)",
    )
    args = parser.parse_args()
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
