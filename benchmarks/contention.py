"""Workers beside busy producers: three producer threads, 8 workers under ``run_workers``.

Three producer threads call ``add`` in a tight loop onto 50 keys for
``SECONDS`` while ``run_workers`` runs 8 workers, with one of two handlers
(``SHAPES``):

- ``blocking``: ``time.sleep(random() * 0.001)``, a reconcile that waits on
  the API (it lets go of the GIL while it waits, and needs it back to go on);
- ``cpu``: about 20 µs of Python (it holds the GIL while it runs).

Reported: adds/s, keys handed out per second (reconciles/s), the mean time a
key waited between being pushed and handed out (``Stats.queue_wait_seconds /
gets``), and the share of the threads' CPU time (``time.thread_time``) the
workers got: with one GIL, who holds it.

One build and one shape per process: ``python benchmarks/contention.py SHAPE``
prints one JSON line for the build that is installed (``KEYQUEUE_PURE=1`` for
the pure one); ``run.py`` runs each shape on both builds, in turn.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import keyqueue
from keyqueue import WorkQueue, run_workers

PRODUCERS = 3
WORKERS = 8
KEYS = 50
SECONDS = float(os.environ.get("BENCH_CONTENTION_SECONDS", "3"))


def blocking_handler() -> None:
    """A reconcile that waits on the API: up to 1 ms, 0.5 ms on average."""
    time.sleep(random.random() * 0.001)


def cpu_handler() -> None:
    """A reconcile of about 20 µs of Python (it holds the GIL while it runs)."""
    sum(range(2000))


SHAPES: dict[str, Callable[[], None]] = {"blocking": blocking_handler, "cpu": cpu_handler}


def measure(shape: str, seconds: float = SECONDS) -> dict[str, Any]:
    work = SHAPES[shape]
    q: WorkQueue[int] = WorkQueue()
    stop = threading.Event()
    producer_cpu: list[float] = []
    worker_cpu: dict[int, float] = {}  # worker thread -> its CPU time after its last key

    def handler(key: int) -> None:
        work()
        worker_cpu[threading.get_ident()] = time.thread_time()

    def produce(offset: int) -> None:
        add, keys, running = q.add, list(range(KEYS)), stop.is_set
        i = offset
        while not running():
            for _ in range(100):
                add(keys[i % KEYS])
                i += 1
        producer_cpu.append(time.thread_time())

    workers = threading.Thread(
        target=run_workers, args=(q, handler), kwargs={"workers": WORKERS, "stop": stop}
    )
    producers = [threading.Thread(target=produce, args=(n * 17,)) for n in range(PRODUCERS)]
    workers.start()
    start = time.perf_counter()
    for t in producers:
        t.start()
    time.sleep(seconds)
    s = q.stats()  # what the producers' run handed out
    elapsed = time.perf_counter() - start
    stop.set()
    for t in producers:
        t.join()
    q.shutdown()
    workers.join()
    cpu_workers, cpu_producers = sum(worker_cpu.values()), sum(producer_cpu)
    return {
        "compiled": keyqueue.COMPILED,
        "shape": shape,
        "seconds": elapsed,
        "adds": s.adds,
        "adds_per_second": s.adds / elapsed,
        "gets": s.gets,
        "reconciles_per_second": s.gets / elapsed,
        "mean_wait": s.queue_wait_seconds / s.gets if s.gets else float("inf"),
        "worker_cpu_share": cpu_workers / (cpu_workers + cpu_producers),
    }


if __name__ == "__main__":
    json.dump(measure(sys.argv[1] if len(sys.argv) > 1 else "blocking"), sys.stdout)
    print()
