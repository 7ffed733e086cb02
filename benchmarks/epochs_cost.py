"""What token epochs cost the server: the hand-out scripts' ``INFO replication`` check.

    PYTHONPATH=src python benchmarks/epochs_cost.py [--keys N] [--rounds R] [--workers W]

One ``ValkeySentinelSet`` (1 primary, 2 replicas, 3 sentinels). Per round, the
same work through two clients of its primary, in alternating order: a plain
one (``redis://`` to the primary: no view, the scripts as on any plain
server) and a Sentinel one (``redis+sentinel://``: each get and claim that
hands out carries the client's view, and its script reads ``INFO
replication`` first, ``redis/_epoch.py``). Two paths: ``claims`` (``--keys``
keys drained by ``run_workers`` with ``--workers`` threads: batched claims)
and ``gets`` (a tenth as many, one ``get_nowait`` and ``done`` each). For
each, from the primary's ``INFO commandstats`` over the run (reset before):
the server's microseconds per hand-out script (``EVALSHA``'s and ``EVAL``'s
of the script alone: the get or claim script) and per key, the scripts per
key, and keys a second; the extra microseconds per hand-out script (the
difference per key over the hand-outs per key). And the check alone: a
script that only reads ``INFO replication`` and matches its two fields
against one that returns at once, 10,000 calls each (``check_usec``).
Medians over ``--rounds``, and Sentinel / plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from typing import Any

import redis

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import ValkeySentinelSet


def _script_usec(primary: redis.Redis) -> tuple[float, int]:
    """Microseconds and calls of the scripts (EVALSHA, EVAL) since the last reset."""
    stats = primary.info("commandstats")
    usec, calls = 0.0, 0
    for name in ("cmdstat_evalsha", "cmdstat_eval"):
        if name in stats:
            usec += float(stats[name]["usec"])
            calls += int(stats[name]["calls"])
    return usec, calls


def _claims(q: RedisWorkQueue, keys: int, workers: int) -> float:
    done = threading.Event()
    handled = 0
    lock = threading.Lock()

    def handle(key: str) -> None:
        nonlocal handled
        with lock:
            handled += 1
            if handled == keys:
                done.set()

    stop = threading.Event()
    runner = threading.Thread(target=run_workers, args=(q, handle, workers, stop))
    began = time.monotonic()
    runner.start()
    done.wait(120)
    elapsed = time.monotonic() - began
    stop.set()
    runner.join(30)
    return elapsed


def _gets(q: RedisWorkQueue, keys: int) -> float:
    began = time.monotonic()
    for _ in range(keys):
        q.done(q.get_nowait())
    return time.monotonic() - began


def measure(url: str, primary: redis.Redis, path: str, keys: int, workers: int) -> dict[str, Any]:
    q = RedisWorkQueue("epochs-cost", url=url, batch=path == "claims")
    try:
        q.delete(force=True)
        for first in range(0, keys, 1000):
            q.add_many(f"k{i}" for i in range(first, min(keys, first + 1000)))
        q.stats()  # the first connection, and the view, before the count starts
        primary.config_resetstat()
        elapsed = _claims(q, keys, workers) if path == "claims" else _gets(q, keys)
        usec, calls = _script_usec(primary)
        viewed = q._epochs is not None
    finally:
        q.close()
    # Scripts other than the hand-outs (dones, renewals): gets' dones are one per key.
    handouts = calls - (keys if path == "gets" else 0)
    return {
        "viewed": viewed,
        "keys_per_second": keys / elapsed,
        "scripts_per_key": calls / keys,
        "script_usec_per_key": usec / keys,
        "handout_scripts": handouts,
    }


CHECK = """
local info = redis.call('INFO', 'replication')
return {string.match(info, 'role:(%a+)'), string.match(info, 'master_replid:(%x+)')}
"""


def check_usec(primary: redis.Redis, calls: int = 10_000) -> dict[str, float]:
    """Server microseconds per call of the view's check alone, and of an empty script."""
    figures = {}
    for label, body in (("empty", "return 1"), ("check", CHECK)):
        sha = primary.script_load(body)
        primary.config_resetstat()
        for _ in range(calls):
            primary.evalsha(sha, 0)
        figures[label] = round(_script_usec(primary)[0] / calls, 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    with ValkeySentinelSet(tempfile.mkdtemp(prefix="epochs-cost-")) as s:
        node = s.wait_for_primary()
        user, password = s.credentials
        plain = f"redis://{user}:{password}@{node.host}:{node.port}/0"
        hosts = ",".join(f"{h}:{p}" for h, p in s.sentinel_addresses)
        sentinel = f"redis+sentinel://{user}:{password}@{hosts}/{s.service}"
        primary = redis.Redis(node.host, node.port, username=user, password=password)
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for round_ in range(args.rounds):
            order = [("plain", plain), ("sentinel", sentinel)]
            if round_ % 2:
                order.reverse()
            for path, keys in (("claims", args.keys), ("gets", args.keys // 10)):
                for label, url in order:
                    figures = measure(url, primary, path, keys, args.workers)
                    assert figures["viewed"] == (label == "sentinel")
                    results.setdefault((path, label), []).append(figures)
        check = check_usec(primary)
        primary.close()
    print(json.dumps({"check_usec": check}))
    for path in ("claims", "gets"):
        line: dict[str, Any] = {"path": path}
        for field in ("keys_per_second", "scripts_per_key", "script_usec_per_key"):
            base = statistics.median(r[field] for r in results[(path, "plain")])
            head = statistics.median(r[field] for r in results[(path, "sentinel")])
            line[field] = {"plain": round(base, 3), "sentinel": round(head, 3)}
            line[field]["ratio"] = round(head / base, 3)
        handouts = statistics.median(r["handout_scripts"] for r in results[(path, "sentinel")])
        usec = line["script_usec_per_key"]
        keys = args.keys if path == "claims" else args.keys // 10
        line["keys_per_handout"] = round(keys / handouts, 2)
        line["extra_usec_per_handout"] = round(
            (usec["sentinel"] - usec["plain"]) * keys / handouts, 2
        )
        print(json.dumps(line))


if __name__ == "__main__":
    main()
