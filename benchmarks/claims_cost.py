"""What a drain on the claims path costs the server: script calls and commands per key.

    PYTHONPATH=src python benchmarks/claims_cost.py [--keys N] [--workers W] [--runs R]
        [--handler-ms MS] [--per-key]

One private valkey-server; per front (``run_workers`` threads, ``arun_workers``
tasks), ``--keys`` distinct keys wait, the server's counters are reset
(``CONFIG RESETSTAT``), one worker process drains them with ``--workers``
workers and a handler that sleeps ``--handler-ms`` (0: returns at once; with
a handler that takes time, the keys other workers started are still running
at each claim), then ``INFO commandstats``: every
command the server ran (those inside scripts too; the INFO call itself not),
the script calls (EVALSHA, EVAL), and the commands by name, each divided by
the keys handled, and the worker process's CPU seconds per key (threads and
loop together, the run only). The median of ``--runs`` runs. The counts do
not depend on the machine's load, so two builds (two ``PYTHONPATH``s) compare
in one sitting; the CPU does, so compare it over rounds that alternate the
builds. ``--per-key`` makes the queues with ``batch=False``: each worker's
own ``get`` and ``done`` per key instead of claims. Prints one JSON
line per front.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from typing import Any

import redis

import keyqueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.testing import ValkeyServer


def counts(admin: redis.Redis) -> tuple[int, int, dict[str, int]]:
    """Commands (INFO's own call left out), script calls, and calls by command."""
    stats = admin.info("commandstats")
    by = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    by.pop("info", None)
    by.pop("config|resetstat", None)
    scripts = sum(by.get(c, 0) for c in ("evalsha", "eval"))
    return sum(by.values()), scripts, by


def drain_threads(url: str, name: str, keys: int, workers: int, sleep: float, batch: bool) -> float:
    q = RedisWorkQueue(name, url=url, lease=30.0, batch=batch)
    q.add_many([f"k{i}" for i in range(keys)])
    redis.Redis.from_url(url).config_resetstat()
    done = threading.Event()
    handled = 0
    lock = threading.Lock()

    def handler(key: str) -> None:
        nonlocal handled
        if sleep:
            time.sleep(sleep)
        with lock:
            handled += 1
            if handled == keys:
                done.set()

    cpu = time.process_time()
    keyqueue.run_workers(q, handler, workers=workers, stop=done)
    cpu = time.process_time() - cpu
    q.close()
    return cpu


def drain_asyncio(url: str, name: str, keys: int, workers: int, sleep: float, batch: bool) -> float:
    async def main() -> float:
        q = AsyncRedisWorkQueue(name, url=url, lease=30.0, batch=batch)
        await q.add_many([f"k{i}" for i in range(keys)])
        await redis.asyncio.Redis.from_url(url).config_resetstat()
        done = asyncio.Event()
        handled = 0

        async def handler(key: str) -> None:
            nonlocal handled
            if sleep:
                await asyncio.sleep(sleep)
            handled += 1
            if handled == keys:
                done.set()

        cpu = time.process_time()
        await keyqueue.arun_workers(q, handler, workers=workers, stop=done)
        cpu = time.process_time() - cpu
        await q.aclose()
        return cpu

    return asyncio.run(main())


def measure(
    url: str, front: str, keys: int, workers: int, runs: int, sleep: float, batch: bool
) -> dict[str, Any]:
    admin = redis.Redis.from_url(url)
    per_run: list[tuple[float, float, dict[str, int]]] = []
    cpus: list[float] = []
    for run in range(runs):
        name = f"cost-{front}-{run}"
        drain = drain_threads if front == "threads" else drain_asyncio
        cpus.append(drain(url, name, keys, workers, sleep, batch) / keys)
        commands, scripts, by = counts(admin)
        per_run.append((commands / keys, scripts / keys, by))
        admin.delete(*admin.keys(f"keyqueue:{{{name}}}:*"))
    median = sorted(per_run, key=lambda r: r[0])[len(per_run) // 2]
    admin.close()
    return {
        "front": front,
        "keys": keys,
        "workers": workers,
        "runs": runs,
        "handler_ms": sleep * 1000,
        "batch": batch,
        "commands_per_key": round(statistics.median(r[0] for r in per_run), 3),
        "scripts_per_key": round(statistics.median(r[1] for r in per_run), 3),
        "client_cpu_per_key": statistics.median(cpus),
        "by_command_per_key (median run)": {
            k: round(v / keys, 3) for k, v in sorted(median[2].items()) if v
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--handler-ms", type=float, default=0.0)
    parser.add_argument("--per-key", action="store_true", help="batch=False")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ValkeyServer(tmp) as server:
        for front in ("threads", "asyncio"):
            result = measure(
                server.url,
                front,
                args.keys,
                args.workers,
                args.runs,
                args.handler_ms / 1000,
                not args.per_key,
            )
            print(json.dumps(result))


if __name__ == "__main__":
    main()
