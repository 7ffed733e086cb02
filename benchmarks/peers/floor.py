"""The floors: the same keys on a bare list, no deduplication, no lease, no
token: the least any queue on this server can cost.

- per key (``serve``): each worker thread pops one key per round trip
  (``RPOP``);
- batched (``serve`` with ``batch=n``): the process's threads share one
  buffer; a thread that finds it empty pops ``n`` keys in one round trip
  (``LPOP key n``), keeps one and leaves the rest to the others, who wait for
  it meanwhile (as keyqueue's workers wait for their claimant). Nothing else:
  what a batched client of a bare list costs."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import redis

from . import CONCURRENCY, BaseProducer, Handler

NAME = "floor (bare list, RPOP)"
BATCHED_NAME = "batched floor (bare list, LPOP n)"
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


def serve(
    url: str, queue: str, handler: Handler, ready: Callable[[], None], batch: int = 0
) -> None:
    """``CONCURRENCY`` threads run ``handler`` on every key of the list, one
    ``RPOP`` a key (``batch`` 0) or one ``LPOP queue batch`` a buffer."""
    client = redis.Redis.from_url(url, max_connections=CONCURRENCY)
    buffer: collections.deque[bytes] = collections.deque()
    refill = threading.Lock()  # one thread pops at a time; the others wait on it

    def take() -> bytes | None:
        """The next key: the buffer's, else a new batch's first (None: list empty)."""
        with refill:
            if buffer:
                return buffer.popleft()
            keys = client.lpop(queue, batch)
            if not keys:
                return None
            buffer.extend(keys[1:])
            return keys[0]

    def per_key() -> None:
        while (key := client.rpop(queue)) is not None:
            handler.sync(key.decode())

    def batched() -> None:
        while True:
            try:
                key = buffer.popleft()
            except IndexError:
                key = take()
                if key is None:
                    return
            handler.sync(key.decode())

    ready()
    loop = batched if batch else per_key
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    threading.Event().wait()  # the parent kills it
