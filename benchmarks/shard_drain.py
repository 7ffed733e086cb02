"""A sharded queue drained by ``run_workers`` in one process, beside one queue.

    python benchmarks/shard_drain.py [--keys 6000] [--workers 8] [--shards 3]

One private valkey-server; for each case, ``keys`` keys added, then
``run_workers`` with ``workers`` threads until every key was handled
(wall keys/s printed). The cases: one queue and ``shards`` shards, each
with batched claims (the default; a sharded queue's claims are per shard)
and one key at a time (``batch=False``: a get and a done script per key).
Side by side, the claims rows say what sharding costs a runner on one
server, the ``batch=False`` rows what the batching is worth.
"""

from __future__ import annotations

import argparse
import threading
import time

import redis

import keyqueue
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import local_valkey


def drain(url: str, name: str, keys: int, workers: int, **options: object) -> float:
    client = redis.Redis.from_url(url, max_connections=workers * 4 + 8)
    q = RedisWorkQueue(name, client=client, **options)  # type: ignore[arg-type]
    q.add_many([f"k{i}" for i in range(keys)])
    handled = [0]
    lock = threading.Lock()

    def handle(key: str) -> None:
        with lock:
            handled[0] += 1
            if handled[0] == keys:
                threading.Thread(target=q.shutdown, kwargs={"drain": True}).start()

    started = time.monotonic()
    keyqueue.run_workers(q, handle, workers=workers)
    elapsed = time.monotonic() - started
    q.close()
    client.close()
    return keys / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=6000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--shards", type=int, default=3)
    args = parser.parse_args()
    with local_valkey() as url:
        cases: list[tuple[str, dict[str, object]]] = [
            ("one queue, claims", {}),
            ("one queue, batch=False", {"batch": False}),
            (f"{args.shards} shards, claims", {"shards": args.shards}),
            (f"{args.shards} shards, batch=False", {"shards": args.shards, "batch": False}),
        ]
        for i, (label, options) in enumerate(cases):
            rate = drain(url, f"drain{i}", args.keys, args.workers, **options)
            print(f"{label}: {rate:,.0f} keys/s")


if __name__ == "__main__":
    main()
