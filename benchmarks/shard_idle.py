"""What an idle client of a sharded queue costs the server: commands a second per shard.

    python benchmarks/shard_idle.py [--shards 1,3,6] [--seconds 20] [--getters 4]
        [--runner] [--asyncio]

For each shard count, one private valkey-server; one client whose
``getters`` threads block in ``get`` on an empty queue for ``seconds``
seconds (``--runner``: ``run_workers`` with as many workers, idle, its
claimant waiting for any shard; ``--asyncio``: ``arun_workers`` on an
``AsyncRedisWorkQueue``); the server's ``INFO commandstats`` before and
after. Printed:
commands a second in all, per shard, and by command (``BLPOP``, the get
script's ``EVALSHA``...). The client is ``redis.Redis.from_url`` with a
5 s socket timeout, as a user's default-ish client (``BLPOP`` slices of
4.5 s), and the queue's default lease (30 s: one look a lease a shard).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Any

import redis
import redis.asyncio

import keyqueue
from keyqueue import Empty, ShutDown
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.testing import local_valkey


def _calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def _idle_tasks(url: str, shards: int, seconds: float, workers: int) -> tuple[Any, Any]:
    """``arun_workers`` idle for ``seconds``: the server's calls before and after."""
    admin = redis.Redis.from_url(url)
    client = redis.asyncio.Redis.from_url(url, socket_timeout=5.0)
    q = AsyncRedisWorkQueue("idle", client=client, shards=shards)
    stop = asyncio.Event()

    async def handle(key: str) -> None:
        pass

    run = asyncio.create_task(keyqueue.arun_workers(q, handle, workers=workers, stop=stop))
    await asyncio.sleep(1.0)  # the first looks and the watchers' first BLPOPs
    before = _calls(admin)
    await asyncio.sleep(seconds)
    after = _calls(admin)
    stop.set()
    await run
    await q.aclose()
    await client.aclose()
    admin.close()
    return before, after


def measure(
    url: str,
    shards: int,
    seconds: float,
    getters: int,
    runner: bool = False,
    use_asyncio: bool = False,
) -> dict[str, Any]:
    if use_asyncio:
        before, after = asyncio.run(_idle_tasks(url, shards, seconds, getters))
        return _figures(shards, "arun_workers", seconds, before, after)
    admin = redis.Redis.from_url(url)
    client = redis.Redis.from_url(url, socket_timeout=5.0)
    q = RedisWorkQueue("idle", client=client, shards=shards)
    stop = threading.Event()

    def get() -> None:
        try:
            q.get()
        except (Empty, ShutDown):
            pass

    def run() -> None:
        keyqueue.run_workers(q, lambda key: None, workers=getters, stop=stop)

    if runner:
        threads = [threading.Thread(target=run)]
    else:
        threads = [threading.Thread(target=get) for _ in range(getters)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the first looks and the watchers' first BLPOPs
    before = _calls(admin)
    time.sleep(seconds)
    after = _calls(admin)
    stop.set()
    q.close()
    for t in threads:
        t.join(10)
    client.close()
    admin.close()
    return _figures(shards, "run_workers" if runner else "get", seconds, before, after)


def _figures(
    shards: int, waiting: str, seconds: float, before: dict[str, int], after: dict[str, int]
) -> dict[str, Any]:
    by = {k: (after[k] - before.get(k, 0)) / seconds for k in after}
    by = {k: round(v, 3) for k, v in by.items() if v and k not in ("info",)}
    total = sum(by.values())
    return {
        "shards": shards,
        "waiting": waiting,
        "per_second": round(total, 3),
        "per_shard_per_second": round(total / shards, 3),
        "by_command": by,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="1,3,6")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--getters", type=int, default=4)
    parser.add_argument("--runner", action="store_true", help="idle workers of run_workers")
    parser.add_argument("--asyncio", action="store_true", help="idle tasks of arun_workers")
    args = parser.parse_args()
    for shards in (int(s) for s in args.shards.split(",")):
        with local_valkey() as url:
            figures = measure(url, shards, args.seconds, args.getters, args.runner, args.asyncio)
            print(json.dumps(figures))


if __name__ == "__main__":
    main()
