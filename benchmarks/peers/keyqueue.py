"""keyqueue.redis: ``RedisWorkQueue`` under ``run_workers``; it coalesces by key."""

from __future__ import annotations

from collections.abc import Callable

from . import CONCURRENCY, BaseProducer, Handler

NAME = "keyqueue"
SETTINGS = (
    f"`RedisWorkQueue` under `run_workers` ({CONCURRENCY} threads per process); coalesces by key"
)


class Producer(BaseProducer):
    """``add`` is keyqueue's coalesced ``add``; a batch is one ``add_many``."""

    def __init__(self, url: str, queue: str) -> None:
        from keyqueue.redis import RedisWorkQueue  # noqa: PLC0415

        self.q = RedisWorkQueue(queue, url=url)

    async def add(self, key: str) -> None:
        self.q.add(key)

    async def add_batch(self, keys: list[str]) -> None:
        self.q.add_many(keys)

    async def close(self) -> None:
        self.q.close()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    from keyqueue import run_workers  # noqa: PLC0415
    from keyqueue.redis import RedisWorkQueue  # noqa: PLC0415

    q = RedisWorkQueue(queue, url=url)
    ready()
    run_workers(q, handler.sync, workers=CONCURRENCY)
