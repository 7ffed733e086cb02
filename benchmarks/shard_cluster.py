"""The sharded section of ``make bench``: one queue over 1, 3 and 6 Valkey Cluster primaries.

    PYTHONPATH=src python benchmarks/shard_cluster.py [--primaries 1,3,6] [--keys N] [--json]

For each N in ``--primaries``, a ``keyqueue.testing.ValkeyCluster`` of N
primaries and no replicas (loopback) holds ``RedisWorkQueue(name,
shards=N)``, shard ``i``'s slot (``{name/i}``) placed on primary ``i``
(``place_shards``; checked from the client's slot map). ``KEYS``
distinct keys are added, then ``PROCESSES`` worker processes run
``run_workers`` with ``THREADS`` threads each and a no-op handler, every
one through a ``RedisCluster`` client, as ``distributed.py``'s end-to-end
workload does on one server. Measured from the first handler's start to
the last one's end:

- keys a second end to end;
- each primary's server CPU (``INFO cpu``: ``used_cpu_user`` +
  ``used_cpu_sys``) over the drain, less its own idle rate (measured over
  ``IDLE_WINDOW`` seconds just before, nothing running: the cluster bus and
  the server's cron), per key of the whole queue, and its share of the
  primaries' total (goal: none above ``SHARE_GOAL`` / N);
- the worker processes' own CPU per key (``time.process_time`` at their
  first and last handler), commands and round trips per key (``INFO
  commandstats``, ``total_reads_processed``, every primary summed);
- the cross-shard overhead: server and client CPU per key at N less at 1;
- the projection to a machine whose cores do not cap it: each primary on a
  core of its own saturates at keys / its CPU, so the queue at the busiest
  primary's (``projected_keys_per_second``: N primary cores' keys a second,
  the overhead and the imbalance included), and the client cores that rate
  needs (client CPU per key x that rate).

Then the price for a user who does not shard: the same workload on one
plain valkey-server (``local_valkey``) with a 1-shard queue, beside
docs/benchmarks.md's last report of it (its "end-to-end" rows).

This machine's cores run the primaries and the workers alike (2 here), so
the end-to-end keys a second are capped by them, not by the queue: the
projection is what says how N scales.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import ValkeyCluster, local_valkey

ROOT = Path(__file__).resolve().parent.parent
LAST_REPORT = ROOT / "docs" / "benchmarks.md"
PRIMARIES = (1, 3, 6)
KEYS = 20_000
PROCESSES = 4
THREADS = 10  # distributed.py's CONCURRENCY: handlers at once per worker process
SHARE_GOAL = 1.15
"""No primary's share of the server CPU above ``SHARE_GOAL / N``."""
IDLE_WINDOW = 1.0
"""Seconds each primary's idle CPU is measured over, just before the drain."""
DRAIN_TIMEOUT = 180.0


def shard_tags(name: str, shards: int) -> list[str]:
    """The hash tag of each shard of the queue ``name``: ``{name}`` for shard 0,
    ``{name/i}`` for the others (``keyqueue.redis._shards.shard_name``)."""
    return [hash_tag(shard_name(name, i)) for i in range(shards)]


def place_shards(cluster: ValkeyCluster, name: str, shards: int) -> None:
    """Put shard ``i``'s slot on primary ``i`` (``ValkeyCluster.move_slot``), before
    the queue has keys: with ``{name/i}`` tags no name spreads 6 shards over 6
    evenly split primaries (CRC16 is linear, so the shards' slots are one slot
    XOR fixed offsets, and shards 0 and 4, 1 and 5 are at most 132 slots apart)."""
    for i, tag in enumerate(shard_tags(name, shards)):
        primary = cluster.nodes[i]
        cluster.move_slot(key_slot(tag.encode()), primary)


# -- the worker processes ------------------------------------------------------------------


def _client(spec: Mapping[str, Any]) -> redis.Redis | redis.RedisCluster:
    if spec["cluster"]:
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in spec["addresses"]]
        return redis.RedisCluster(startup_nodes=nodes, max_connections=THREADS * 8)
    return redis.Redis.from_url(spec["url"], max_connections=THREADS * 4)


def _serve(spec: Mapping[str, Any], index: int, shared: Any, ready: Any, go: Any) -> None:
    """A worker process: ``run_workers`` with a no-op handler that records its
    first and last call's time and this process's CPU then (the parent kills it)."""
    counts, first, last, cpu_first, cpu_last = shared
    q = RedisWorkQueue(spec["queue"], client=_client(spec), shards=spec["shards"])
    q.stats()  # a connection to every shard's primary, before the clock starts
    lock = threading.Lock()

    def handle(key: str) -> None:
        t, cpu = time.monotonic(), time.process_time()
        with lock:
            counts[index] += 1
            if not first[index]:
                first[index], cpu_first[index] = t, cpu
            last[index], cpu_last[index] = t, cpu

    ready.set()
    go.wait()
    run_workers(q, handle, workers=THREADS)


@contextmanager
def _workers(spec: Mapping[str, Any], shared: Any) -> Iterator[Any]:
    """``PROCESSES`` worker processes, ready; yields the event that starts them all."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    started = []
    try:
        for i in range(PROCESSES):
            ready = context.Event()
            process = context.Process(target=_serve, args=(spec, i, shared, ready, go), daemon=True)
            process.start()
            started.append((process, ready))
        for process, ready in started:
            if not ready.wait(60):
                raise RuntimeError(f"worker process {process.pid} did not start")
        yield go
    finally:
        for process, _ in started:
            process.kill()
        for process, _ in started:
            process.join()


# -- one drain -----------------------------------------------------------------------------


def _usage(node: redis.Redis) -> tuple[float, int, int]:
    """A server's CPU seconds, commands run (inside scripts too; INFO not) and reads."""
    cpu = node.info("cpu")
    stats = node.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    reads = int(node.info("stats")["total_reads_processed"])
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls, reads


def drain(
    spec: Mapping[str, Any], add: Callable[[list[str]], None], primaries: list[redis.Redis]
) -> dict[str, Any]:
    """``KEYS`` no-op keys through the worker processes; ``primaries`` are plain
    clients of each primary, for its ``INFO``."""
    context = multiprocessing.get_context("spawn")
    shared = tuple(context.Array(t, PROCESSES, lock=False) for t in ("q", "d", "d", "d", "d"))
    counts, first, last, cpu_first, cpu_last = shared
    add([f"key-{i}" for i in range(KEYS)])
    with _workers(spec, shared) as go:
        idle_from = [_usage(p)[0] for p in primaries]
        time.sleep(IDLE_WINDOW)
        idle = [(_usage(p)[0] - a) / IDLE_WINDOW for p, a in zip(primaries, idle_from, strict=True)]
        before = [_usage(p) for p in primaries]
        opened = time.monotonic()
        go.set()
        deadline = opened + DRAIN_TIMEOUT
        while sum(counts) < KEYS and time.monotonic() < deadline:
            time.sleep(0.01)
        after = [_usage(p) for p in primaries]
        closed = time.monotonic()
    done = sum(counts)
    if done < KEYS:
        raise RuntimeError(f"{done} of {KEYS} keys handled in {DRAIN_TIMEOUT} s")
    seconds = max(last) - min(t for t in first if t)
    window = closed - opened
    cpu = [
        max(0.0, a[0] - b[0] - rate * window)
        for a, b, rate in zip(after, before, idle, strict=True)
    ]
    total = sum(cpu)
    return {
        "keys": done,
        "keys_per_second": done / seconds,
        "server_cpu_per_key": total / done,
        "per_primary_cpu_per_key": [c / done for c in cpu],
        "shares": [c / total for c in cpu],
        "idle_cpu_per_second": idle,
        "client_cpu_per_key": sum(b - a for a, b in zip(cpu_first, cpu_last, strict=True)) / done,
        "commands_per_key": sum(a[1] - b[1] for a, b in zip(after, before, strict=True)) / done,
        "round_trips_per_key": sum(a[2] - b[2] for a, b in zip(after, before, strict=True)) / done,
    }


def on_cluster(primaries: int) -> dict[str, Any]:
    """One drain of a ``primaries``-shard queue on a Cluster of as many primaries."""
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-shard-bench-") as directory,
        ValkeyCluster(directory, primaries=primaries, replicas=0) as cluster,
    ):
        name = "sharded"
        place_shards(cluster, name, primaries)
        client = redis.RedisCluster.from_url(cluster.url)
        nodes = [redis.Redis(host=h, port=p) for h, p in cluster.addresses[:primaries]]
        try:
            q = RedisWorkQueue(name, client=client, shards=primaries)
            where = [client.get_node_from_key(tag).port for tag in shard_tags(name, primaries)]
            ports = [n.connection_pool.connection_kwargs["port"] for n in nodes]
            if where != ports:
                raise RuntimeError(f"the shards are on {where}, the primaries are {ports}")
            spec = {
                "cluster": True,
                "addresses": cluster.addresses,
                "queue": name,
                "shards": primaries,
            }
            figures = drain(spec, q.add_many, nodes)
            q.close()
        finally:
            client.close()
            for node in nodes:
                node.close()
    return {"primaries": primaries, "shards": primaries, **figures}


def on_one_server() -> dict[str, Any]:
    """The same drain of a 1-shard queue on one plain valkey-server."""
    with local_valkey() as url:
        admin = redis.Redis.from_url(url)
        q = RedisWorkQueue("unsharded", url=url)
        try:
            spec = {"cluster": False, "url": url, "queue": "unsharded", "shards": 1}
            figures = drain(spec, q.add_many, [admin])
        finally:
            q.close()
            admin.close()
    return {"primaries": 1, "shards": 1, **figures}


def last_report(path: Path = LAST_REPORT) -> dict[str, float] | None:
    """keyqueue's end-to-end figures in docs/benchmarks.md (its first column), or
    None if it has none: keys a second, server and client CPU per key (seconds),
    round trips and commands per key."""
    if not path.exists():
        return None
    text = path.read_text()
    rows = {
        "keys_per_second": r"\| end-to-end no-op keys/s, [^|]*\| \*\*([\d,]+)/s\*\*",
        "round_trips_per_key": r"\| end-to-end: round trips per key[^|]*\| ([\d.]+) ",
        "commands_per_key": r"\| end-to-end: server commands per key[^|]*\| ([\d.]+) ",
        "server_cpu_per_key": r"\| end-to-end: server CPU per key \| ([\d.]+) µs",
        "client_cpu_per_key": r"\| end-to-end: worker processes' CPU per key \| ([\d.]+) µs",
    }
    found: dict[str, float] = {}
    for field, pattern in rows.items():
        match = re.search(pattern, text)
        if match is None:
            return None
        value = float(match.group(1).replace(",", ""))
        found[field] = value / 1e6 if field.endswith("cpu_per_key") else value
    return found


def summarize(runs: list[dict[str, Any]]) -> None:
    """Add to each cluster run its overhead against the 1-primary run and its projection."""
    one = next((r for r in runs if r["primaries"] == 1), None)
    for run in runs:
        busiest = max(run["per_primary_cpu_per_key"])
        run["max_share_times_n"] = max(run["shares"]) * run["primaries"]
        run["projected_keys_per_second"] = 1 / busiest
        run["projected_client_cores"] = run["client_cpu_per_key"] / busiest
        if one is not None:
            run["server_overhead_per_key"] = run["server_cpu_per_key"] - one["server_cpu_per_key"]
            run["client_overhead_per_key"] = run["client_cpu_per_key"] - one["client_cpu_per_key"]


def measure(primaries: tuple[int, ...] = PRIMARIES) -> dict[str, Any]:
    """Every run (a Cluster per N in ``primaries``, then one plain server) and the last
    report's figures: what ``report.sharded_section`` shows."""
    load = [os.getloadavg()]
    began = time.monotonic()
    runs = []
    for n in primaries:
        runs.append(on_cluster(n))
        print(f"  {n} primaries: {runs[-1]['keys_per_second']:,.0f} keys/s", file=sys.stderr)
    summarize(runs)
    plain = on_one_server()
    load.append(os.getloadavg())
    return {
        "keys": KEYS,
        "processes": PROCESSES,
        "threads": THREADS,
        "cores": os.cpu_count(),
        "share_goal": SHARE_GOAL,
        "idle_window": IDLE_WINDOW,
        "runs": runs,
        "one_server": plain,
        "last_report": last_report(),
        "seconds": time.monotonic() - began,
        "load": " -> ".join(", ".join(f"{x:.2f}" for x in one) for one in load),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--primaries", default=",".join(map(str, PRIMARIES)))
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    result = measure(tuple(int(n) for n in args.primaries.split(",")))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import sharded_section  # noqa: PLC0415

    print(sharded_section(result))


if __name__ == "__main__":
    main()
