"""How long ``snapshot()`` blocks a Valkey server holding a queue of a million keys.

A private valkey-server (``keyqueue.testing.local_valkey``) gets two queues:
``fifo`` with ``--keys`` waiting keys plus ``--held`` held, ``--delayed``
delayed and ``--failing`` failing ones, and ``ranked``, the same number of
waiting keys with priorities (the sorted-set path). For each, ``snapshot()`` at
a few limits and, for comparison, ``stats()``: the server's own time per script
run (``INFO commandstats``' usec_per_call for EVALSHA, after ``CONFIG
RESETSTAT``, and the longest run from ``SLOWLOG``), and the client's wall time
per call. ``delete()`` of each queue last (UNLINK: the memory is freed off the
main thread). Also the in-memory ``WorkQueue.snapshot`` on the same shape
(time under the queue's lock).

    .venv/bin/python benchmarks/snapshot_large.py [--keys 1000000] [--runs 50]
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import redis

from keyqueue import WorkQueue
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import local_valkey


def fill(q: Any, keys: int, held: int, delayed: int, failing: int, ranked: bool) -> None:
    batch = 10_000
    for start in range(0, keys, batch):
        names = [f"key-{i}" for i in range(start, min(keys, start + batch))]
        if ranked:
            q.add_many(names, priority=start // batch % 7)
        else:
            q.add_many(names)
    for _ in range(held):
        q.get_nowait()
    for i in range(delayed):
        q.add_after(f"later-{i}", 3600.0 + i)
    for i in range(failing):
        q.retry(f"failing-{i}")  # a failure each, back after its backoff (delayed)


def server_time(admin: redis.Redis, run: Any, runs: int) -> tuple[float, float, float]:
    """(mean server usec per script run, longest server usec, mean client ms per call)."""
    admin.config_resetstat()
    admin.slowlog_reset()
    started = time.perf_counter()
    for _ in range(runs):
        run()
    wall = (time.perf_counter() - started) / runs * 1000
    stats = admin.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    entries = admin.slowlog_get(1000)
    longest = max(
        (e["duration"] for e in entries if str(e["command"]).upper().find("EVALSHA") >= 0),
        default=0,
    )
    return float(evalsha.get("usec_per_call", 0.0)), float(longest), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--held", type=int, default=1_000)
    parser.add_argument("--delayed", type=int, default=100_000)
    parser.add_argument("--failing", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with local_valkey({"slowlog-log-slower-than": "0", "slowlog-max-len": "1000"}) as url:
        admin = redis.Redis.from_url(url)
        for kind in ("fifo", "ranked"):
            q = RedisWorkQueue(kind, url=url, lease=3600.0)
            started = time.perf_counter()
            fill(q, args.keys, args.held, args.delayed, args.failing, kind == "ranked")
            print(
                f"{kind}: {args.keys:,} waiting, {args.held:,} held, {args.delayed:,} delayed, "
                f"{args.failing:,} failing: filled in {time.perf_counter() - started:.1f} s; "
                f"used_memory {admin.info('memory')['used_memory_human']}"
            )
            for what, call in (
                ("stats()", q.stats),
                ("snapshot(limit=10)", functools.partial(q.snapshot, limit=10)),
                ("snapshot(limit=100)", functools.partial(q.snapshot, limit=100)),
                ("snapshot(limit=1000)", functools.partial(q.snapshot, limit=1000)),
            ):
                mean, longest, wall = server_time(admin, call, args.runs)
                print(
                    f"  {what:22} server {mean / 1000:7.3f} ms mean, {longest / 1000:7.3f} ms "
                    f"longest; client {wall:7.3f} ms per call"
                )
            snap = q.snapshot()
            assert len(snap.waiting) == 100
            assert snap.stats.processing == args.held
            started = time.perf_counter()
            q.delete(force=True)
            print(f"  delete(force=True)     {(time.perf_counter() - started) * 1000:7.3f} ms")
            q.close()
    memory: WorkQueue[str] = WorkQueue("memory")
    fill(memory, args.keys, args.held, args.delayed, args.failing, ranked=False)
    for limit in (10, 100, 1000):
        started = time.perf_counter()
        for _ in range(args.runs):
            memory.snapshot(limit=limit)
        per = (time.perf_counter() - started) / args.runs * 1000
        print(f"in memory (fifo): snapshot(limit={limit}) {per:7.3f} ms under the lock")


if __name__ == "__main__":
    main()
