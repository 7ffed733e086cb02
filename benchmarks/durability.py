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
  other: their latency's p50 and p99, and adds a second;
- *idle*: an empty queue under ``run_workers`` (``IDLE_WORKERS`` threads),
  settled for a second, then ``--idle-seconds`` of nothing to do: the
  commands its client made the primary run a second (``INFO commandstats``,
  a script's inner commands counted, a blocking command when it returns;
  our ``INFO`` calls and the sentinels' and replicas' own ``PING``,
  ``INFO``, ``PUBLISH``, ``AUTH`` and ``REPLCONF`` left out);
- *pickup*: those idle workers, then ``PICKUP_SAMPLES`` keys added one at a
  time, ``PICKUP_GAP`` apart: from ``add`` returning to the handler
  starting, p50 and p99.

The same idle and pickup figures come from one plain valkey-server
(``local_valkey``, the default mode) as the baseline, under
``"unreplicated"``. Each figure is the median of its rounds. ``measure()``
returns them as a dict (``make bench`` shows it beside the unreplicated
figures); ``--json`` prints that dict, else a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue, client_from_url, close_client
from keyqueue.testing import ValkeyNode, ValkeySentinelSet, local_valkey

MODES: dict[str, dict[str, Any]] = {
    "primary": {},
    "replicated": {"durability": "replicated"},
    "replicated, replicas=1": {"durability": "replicated", "replicas": 1},
}
"""Each mode measured: its name and the queue's keyword arguments."""

CLIENT_COMMANDS = ("evalsha", "eval", "wait", "blpop", "rpush", "hget", "exists")
"""What the queue's clients send (the scripts' inner commands, replication's
``REPLCONF`` and the sentinels' ``PING``/``INFO``/``PUBLISH`` are not counted)."""


NOT_THE_CLIENTS = ("info", "ping", "publish", "replconf", "auth")
"""Left out of the idle count: our own ``INFO`` calls, the sentinels' ``PING``,
``INFO``, ``PUBLISH`` and ``AUTH`` (one a set logs in about every 10 s, with no
queue at all) and the replicas' ``REPLCONF ACK``s. The queue's client logs in
before the window; a reconnection in it still shows (``CLIENT SETINFO``, ``HELLO``)."""

IDLE_WORKERS = 4
"""``run_workers`` threads of the idle and pickup measurement."""

PICKUP_SAMPLES = 200
"""Keys added one at a time for the pickup latency."""

PICKUP_GAP = 0.003
"""Seconds between one pickup and the next add: the workers are back waiting."""


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


def _calls(stats: Mapping[str, Any]) -> int:
    """Calls in ``INFO commandstats`` (redis-py's parsed dicts or ``ValkeyNode.info``'s
    strings), ``NOT_THE_CLIENTS`` left out."""
    total = 0
    for name, stat in stats.items():
        if name.removeprefix("cmdstat_") in NOT_THE_CLIENTS:
            continue
        total += int(
            stat["calls"] if isinstance(stat, dict) else stat.split("calls=")[1].split(",")[0]
        )
    return total


def _idle_and_pickup(
    commandstats: Callable[[], Mapping[str, Any]],
    client: redis.Redis,
    mode: dict[str, Any],
    seconds: float,
    n: int,
) -> dict[str, float]:
    """An idle pool of ``IDLE_WORKERS`` threads: the commands a second its client costs
    the server over ``seconds``, then the pickup latency's p50 and p99 (ms)."""
    q = RedisWorkQueue(f"idle-{n}", client=client, **mode)
    started: dict[str, float] = {}
    picked = threading.Event()
    stop = threading.Event()

    def handler(key: str) -> None:
        started[key] = time.monotonic()
        picked.set()

    runner = threading.Thread(target=run_workers, args=(q, handler, IDLE_WORKERS, stop))
    runner.start()
    try:
        time.sleep(1.0)  # the workers start and settle into waiting
        before = _calls(commandstats())
        began = time.monotonic()
        time.sleep(seconds)
        after = _calls(commandstats())
        idle = (after - before) / (time.monotonic() - began)
        latencies: list[float] = []
        for i in range(PICKUP_SAMPLES + 5):
            time.sleep(PICKUP_GAP)
            picked.clear()
            key = f"p{i}"
            q.add(key)
            added = time.monotonic()
            if not picked.wait(5.0):
                raise RuntimeError(f"key {key} was not picked up in 5 s")
            if i >= 5:  # the first few warm the connections up
                latencies.append(started[key] - added)
    finally:
        stop.set()
        runner.join()
    q.delete(force=True)
    q.close()
    latencies.sort()
    return {
        "idle_commands_per_second": idle,
        "pickup_p50_ms": 1000 * latencies[len(latencies) // 2],
        "pickup_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def _unreplicated(idle_seconds: float, rounds: int) -> dict[str, float]:
    """The idle and pickup figures on one plain valkey-server, the default mode."""
    runs = []
    with local_valkey() as url:
        client = redis.Redis.from_url(url, socket_timeout=5.0)
        try:
            for n in range(rounds):
                runs.append(
                    _idle_and_pickup(
                        lambda: client.info("commandstats"), client, {}, idle_seconds, n
                    )
                )
        finally:
            client.close()
    return {field: statistics.median(r[field] for r in runs) for field in runs[0]}


def measure(
    keys: int = 20000,
    adds: int = 2000,
    workers: int = 8,
    rounds: int = 1,
    idle_seconds: float = 10.0,
) -> dict[str, Any]:
    """Each mode's figures (medians of ``rounds``), on a Sentinel set of its own,
    and the idle and pickup figures on one plain server under ``"unreplicated"``."""
    figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    with ValkeySentinelSet(down_after=5.0) as s:
        user, password = s.credentials
        hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
        url = f"redis+sentinel://{user}:{password}@{hosts}/{s.service}?socket_timeout=2"
        client = client_from_url(url, socket_timeout=5.0)
        n = 0
        try:
            for _ in range(rounds):
                for mode, kwargs in MODES.items():
                    n += 1
                    drained = _drain(s, client, kwargs, keys, workers, n)
                    added = _adds(client, kwargs, adds, n)
                    primary = s.wait_for_primary()
                    idle = _idle_and_pickup(
                        functools.partial(primary.info, "commandstats"),
                        client,
                        kwargs,
                        idle_seconds,
                        n,
                    )
                    figures[mode].append({**drained, **added, **idle})
        finally:
            close_client(client)
    return {
        "topology": "sentinel: 1 primary, 2 replicas, 3 sentinels (loopback)",
        "keys": keys,
        "adds": adds,
        "workers": workers,
        "rounds": rounds,
        "idle_seconds": idle_seconds,
        "idle_workers": IDLE_WORKERS,
        "pickup_samples": PICKUP_SAMPLES,
        "pickup_gap": PICKUP_GAP,
        "modes": {
            mode: {field: statistics.median(r[field] for r in runs) for field in runs[0]}
            for mode, runs in figures.items()
        },
        "unreplicated": _unreplicated(idle_seconds, rounds),
    }


def _table(result: dict[str, Any]) -> str:
    head = ("mode", "keys/s", "round trips/key", "commands/key", "WAITs/key")
    head += ("add p50", "add p99", "adds/s", "idle commands/s", "pickup p50", "pickup p99")
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for mode, f in result["modes"].items():
        rows.append(
            f"| {mode} | {f['keys_per_second']:,.0f} | {f['round_trips_per_key']:.3f} | "
            f"{f['commands_per_key']:.3f} | {f['waits_per_key']:.3f} | "
            f"{f['add_p50_ms']:.3f} ms | {f['add_p99_ms']:.3f} ms | {f['adds_per_second']:,.0f} | "
            f"{_idle_cells(f)} |"
        )
    rows.append(f"| one server, primary |{' |' * 7} {_idle_cells(result['unreplicated'])} |")
    return "\n".join(rows)


def _idle_cells(f: Mapping[str, float]) -> str:
    return (
        f"{f['idle_commands_per_second']:.2f} | {f['pickup_p50_ms']:.3f} ms | "
        f"{f['pickup_p99_ms']:.3f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20000, help="keys the drain processes")
    parser.add_argument("--adds", type=int, default=2000, help="adds timed, one after another")
    parser.add_argument("--workers", type=int, default=8, help="run_workers threads")
    parser.add_argument("--rounds", type=int, default=1, help="rounds (figures are medians)")
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="the idle window, per mode"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args()
    result = measure(args.keys, args.adds, args.workers, args.rounds, args.idle_seconds)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['topology']}; {args.keys} keys, {args.workers} workers, {args.adds} adds; "
            f"idle {args.idle_seconds:g} s and {PICKUP_SAMPLES} pickups, {IDLE_WORKERS} workers"
        )
        print(_table(result))


if __name__ == "__main__":
    main()
