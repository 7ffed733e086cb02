"""Workers beside busy producers: three CPU-bound producer threads, 8 workers.

Three producer threads call ``add`` in a tight loop onto 50 keys for
``SECONDS``; 8 worker threads ``get``, run a sub-millisecond handler (pure
Python work, so it needs the GIL) and ``done``. Reported: adds/s, keys handed
out per second (reconciles/s), the mean time a key waited between being
pushed and handed out (``Stats.queue_wait_seconds / gets``), and the share of
the threads' CPU time (``time.thread_time``) the workers got: with one GIL,
who holds it.

One build per process: ``python benchmarks/contention.py`` prints one JSON
line for the build that is installed (``KEYQUEUE_PURE=1`` for the pure one);
``run.py`` runs it on both builds, in turn.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import keyqueue
from keyqueue import ShutDown, WorkQueue

PRODUCERS = 3
WORKERS = 8
KEYS = 50
SECONDS = float(os.environ.get("BENCH_CONTENTION_SECONDS", "3"))


def handler() -> int:
    """A reconcile: about 20 µs of Python here (it holds the GIL while it runs)."""
    return sum(range(2000))


def measure(seconds: float = SECONDS) -> dict[str, Any]:
    q: WorkQueue[int] = WorkQueue()
    stop = threading.Event()
    cpu: dict[str, list[float]] = {"producers": [], "workers": []}

    def produce(offset: int) -> None:
        add, keys, running = q.add, list(range(KEYS)), stop.is_set
        i = offset
        while not running():
            for _ in range(100):
                add(keys[i % KEYS])
                i += 1
        cpu["producers"].append(time.thread_time())

    def work() -> None:
        get, done = q.get, q.done
        try:
            while True:
                key = get()
                handler()
                done(key)
        except ShutDown:
            cpu["workers"].append(time.thread_time())

    workers = [threading.Thread(target=work) for _ in range(WORKERS)]
    producers = [threading.Thread(target=produce, args=(n * 17,)) for n in range(PRODUCERS)]
    for t in workers:
        t.start()
    start = time.perf_counter()
    for t in producers:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in producers:
        t.join()
    elapsed = time.perf_counter() - start
    s = q.stats()  # before the drain: what the producers' run handed out
    q.shutdown(drain=True)
    for t in workers:
        t.join()
    return {
        "compiled": keyqueue.COMPILED,
        "seconds": elapsed,
        "adds": s.adds,
        "adds_per_second": s.adds / elapsed,
        "gets": s.gets,
        "reconciles_per_second": s.gets / elapsed,
        "mean_wait": s.queue_wait_seconds / s.gets if s.gets else float("inf"),
        "worker_cpu_share": sum(cpu["workers"]) / (sum(cpu["workers"]) + sum(cpu["producers"])),
    }


if __name__ == "__main__":
    json.dump(measure(), sys.stdout)
    print()
