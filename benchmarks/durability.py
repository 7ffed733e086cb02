"""What each durability mode costs on a Sentinel set: keys/s, round trips, commands, add latency.

    PYTHONPATH=src python benchmarks/durability.py [--keys N] [--adds N] [--workers W]
        [--rounds R] [--json]

One ``keyqueue.testing.ValkeySentinelSet`` (1 primary, 2 replicas, 3
sentinels, loopback) holds the queue; every client is the one a user would
pass (``Sentinel(...).master_for(...)``). Per mode (``primary``, the default;
``replicated``, which waits for both replicas; ``replicated`` with
``replicas=1``, the weaker setting) and round, in turn:

- *drain*: ``--keys`` keys added (``add_many``), then ``run_workers`` with
  ``--workers`` threads and a no-op handler until every key is done: keys a
  second, and from the primary's ``INFO commandstats`` the commands the
  clients sent per key (scripts, ``WAIT``s, the doorbell's) and the round
  trips per key (the same less the ``WAIT``s, each written with its script);
- *add*: ``--adds`` adds of distinct keys from one client, one after the
  other: their latency's p50 and p99, and adds a second.

Each figure is the median of its rounds. ``measure()`` returns them as a dict
(``make bench`` shows it beside the unreplicated figures); ``--json`` prints
that dict, else a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

import redis
import redis.sentinel

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import ValkeyNode, ValkeySentinelSet

MODES: dict[str, dict[str, Any]] = {
    "primary": {},
    "replicated": {"durability": "replicated"},
    "replicated, replicas=1": {"durability": "replicated", "replicas": 1},
}
"""Each mode measured: its name and the queue's keyword arguments."""

CLIENT_COMMANDS = ("evalsha", "eval", "wait", "blpop", "rpush", "hget", "exists")
"""What the queue's clients send (the scripts' inner commands, replication's
``REPLCONF`` and the sentinels' ``PING``/``INFO``/``PUBLISH`` are not counted)."""


def _sent(node: ValkeyNode) -> dict[str, int]:
    """Calls of each of ``CLIENT_COMMANDS`` ``node`` has run."""
    stats = node.info("commandstats")
    found: dict[str, int] = {}
    for command in CLIENT_COMMANDS:
        stat = stats.get(f"cmdstat_{command}", "")
        found[command] = int(stat.split("calls=")[1].split(",")[0]) if stat else 0
    return found


def _drain(
    s: ValkeySentinelSet, client: redis.Redis, mode: dict[str, Any], keys: int, workers: int, n: int
) -> dict[str, float]:
    """``keys`` no-op keys through ``run_workers``: keys a second, commands and round trips."""
    name = f"drain-{n}"
    primary = s.wait_for_primary()
    q = RedisWorkQueue(name, client=client, **mode)
    q.add_many(f"k{i}" for i in range(keys))
    done = 0
    lock = threading.Lock()
    stop = threading.Event()

    def handler(key: str) -> None:
        nonlocal done
        with lock:
            done += 1
            if done == keys:
                stop.set()

    before = _sent(primary)
    began = time.monotonic()
    run_workers(q, handler, workers=workers, stop=stop)
    seconds = time.monotonic() - began
    after = _sent(primary)
    q.delete(force=True)
    q.close()
    sent = {c: after[c] - before[c] for c in CLIENT_COMMANDS}
    commands = sum(sent.values())
    return {
        "keys_per_second": keys / seconds,
        "commands_per_key": commands / keys,
        "round_trips_per_key": (commands - sent["wait"]) / keys,
        "waits_per_key": sent["wait"] / keys,
    }


def _adds(client: redis.Redis, mode: dict[str, Any], adds: int, n: int) -> dict[str, float]:
    """``adds`` adds of distinct keys in series: latency p50 and p99 (ms), adds a second."""
    q = RedisWorkQueue(f"adds-{n}", client=client, **mode)
    q.add("warm-up")  # the scripts loaded, the connection made
    latencies: list[float] = []
    began = time.monotonic()
    for i in range(adds):
        sent = time.monotonic()
        q.add(f"a{i}")
        latencies.append(time.monotonic() - sent)
    seconds = time.monotonic() - began
    q.delete(force=True)
    q.close()
    latencies.sort()
    return {
        "add_p50_ms": 1000 * latencies[len(latencies) // 2],
        "add_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "adds_per_second": adds / seconds,
    }


def measure(
    keys: int = 20000, adds: int = 2000, workers: int = 8, rounds: int = 1
) -> dict[str, Any]:
    """Each mode's figures (medians of ``rounds``), on a Sentinel set of its own."""
    figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with ValkeySentinelSet(down_after=5.0) as s:
        sentinel = redis.sentinel.Sentinel(s.sentinel_addresses, socket_timeout=2.0)
        client = sentinel.master_for(s.service, socket_timeout=5.0, **s.client_kwargs)
        n = 0
        try:
            for _ in range(rounds):
                for mode, kwargs in MODES.items():
                    n += 1
                    drained = _drain(s, client, kwargs, keys, workers, n)
                    figures[mode].append({**drained, **_adds(client, kwargs, adds, n)})
        finally:
            client.close()
            for node in sentinel.sentinels:
                node.close()
    return {
        "topology": "sentinel: 1 primary, 2 replicas, 3 sentinels (loopback)",
        "keys": keys,
        "adds": adds,
        "workers": workers,
        "rounds": rounds,
        "modes": {
            mode: {field: statistics.median(r[field] for r in runs) for field in runs[0]}
            for mode, runs in figures.items()
        },
    }


def _table(result: dict[str, Any]) -> str:
    head = ("mode", "keys/s", "round trips/key", "commands/key", "WAITs/key")
    head += ("add p50", "add p99", "adds/s")
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for mode, f in result["modes"].items():
        rows.append(
            f"| {mode} | {f['keys_per_second']:,.0f} | {f['round_trips_per_key']:.3f} | "
            f"{f['commands_per_key']:.3f} | {f['waits_per_key']:.3f} | "
            f"{f['add_p50_ms']:.3f} ms | {f['add_p99_ms']:.3f} ms | {f['adds_per_second']:,.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20000, help="keys the drain processes")
    parser.add_argument("--adds", type=int, default=2000, help="adds timed, one after another")
    parser.add_argument("--workers", type=int, default=8, help="run_workers threads")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (figures are medians)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args()
    result = measure(args.keys, args.adds, args.workers, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['topology']}; {args.keys} keys, {args.workers} workers, {args.adds} adds")
        print(_table(result))


if __name__ == "__main__":
    main()
