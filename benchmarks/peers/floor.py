"""The floor: the same keys on a bare list, each worker thread popping one key
per round trip (``RPOP``). No deduplication, no lease: the least any queue on
this server can cost."""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis

from . import CONCURRENCY, BaseProducer, Handler

NAME = "floor (bare list, RPOP)"
LOAD_BATCH = 1000


class Producer(BaseProducer):
    """``load`` only: ``LPUSH``, ``LOAD_BATCH`` keys a call."""

    def __init__(self, url: str, queue: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.queue = queue

    async def load(self, keys: list[str]) -> None:
        for i in range(0, len(keys), LOAD_BATCH):
            self.client.lpush(self.queue, *keys[i : i + LOAD_BATCH])

    async def close(self) -> None:
        self.client.close()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    client = redis.Redis.from_url(url, max_connections=CONCURRENCY)

    def loop() -> None:
        while (key := client.rpop(queue)) is not None:
            handler.sync(key.decode())

    ready()
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    threading.Event().wait()  # the parent kills it
