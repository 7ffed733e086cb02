"""Worker, producer and mover processes for the resharding-under-load tests.

They run as children of ``tests/support/redis_processes``' forkserver
(``Processes``), on the queue's server (one server, or a Cluster when
``cluster``), and report to a *ledger*, a server of its own that no fault
touches: each handler's start (``begins``: ``key token start pid``) and end
(``records``: a ``Record``), each acknowledged add (``produced``: ``key
sent``), each worker's ``RunStats``. Times are ``time.monotonic()``, one
clock for every process of the machine.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any

import redis

from keyqueue import ItemFastSlowRateLimiter
from keyqueue.redis import RedisWorkQueue
from tests.support.redis_processes import Names, _run_until_stopped

__all__ = ["mover", "queue_client", "sharded_producer", "sharded_worker"]

NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a key whose lease ran out comes back at once


def queue_client(url: str, cluster: bool) -> Any:
    """A redis-py client of the queue's server (a ``RedisCluster`` for a Cluster)."""
    if cluster:
        return redis.RedisCluster.from_url(url)
    return redis.Redis.from_url(url)


def sharded_worker(
    url: str,
    cluster: bool,
    ledger: str,
    names: Names,
    stop: ProcessEvent,
    shards: int,
    workers: int = 4,
    lease: float = 1.0,
    work: float = 0.002,
) -> None:
    """``run_workers`` on a client made with ``shards`` (it follows the queue's
    map) until ``stop`` is set; each handler call reports its start, works
    ``work`` seconds and reports its end."""
    r = redis.Redis.from_url(ledger)
    q = RedisWorkQueue(
        names.queue, client=queue_client(url, cluster), lease=lease, shards=shards, rate_limiter=NOW
    )
    pid = os.getpid()

    def handle(key: str) -> None:
        token = q.token(key)
        start = time.monotonic()
        r.rpush(names.begins, f"{key} {token} {start!r} {pid}")
        time.sleep(work)
        r.rpush(names.records, f"{key} {token} {start!r} {time.monotonic()!r} 0 {pid}")

    _run_until_stopped(q, r, names, handle, workers, stop)


def sharded_producer(
    url: str,
    cluster: bool,
    ledger: str,
    names: Names,
    shards: int,
    keys: Sequence[str],
    seconds: float,
    pause: float = 0.002,
) -> None:
    """Add keys of ``keys`` at random for ``seconds``, each acknowledged add reported."""
    r = redis.Redis.from_url(ledger)
    q = RedisWorkQueue(names.queue, client=queue_client(url, cluster), shards=shards)
    rng = random.Random(os.getpid())
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        key = rng.choice(keys)
        sent = time.monotonic()
        q.add(key)
        r.rpush(names.produced, f"{key} {sent!r}")
        time.sleep(pause)
    q.close()


def mover(url: str, cluster: bool, names: Names, shards: int) -> None:
    """``reshard(shards)`` from a client of its own: exits once every key moved."""
    q = RedisWorkQueue(names.queue, client=queue_client(url, cluster), shards=2)
    q.reshard(shards)
    q.close()
