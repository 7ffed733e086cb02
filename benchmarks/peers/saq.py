"""SAQ: ``Worker(concurrency=CONCURRENCY)`` on its defaults, the key as the job key
(its deduplication)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from . import CONCURRENCY, BaseProducer, Handler

NAME = "SAQ"
SETTINGS = f"`Worker(concurrency={CONCURRENCY})`, its defaults, `enqueue(key=key)`"

_handler: Handler | None = None  # this worker process's, set by serve


async def saq_job(ctx: dict[str, Any]) -> None:
    assert _handler is not None
    await _handler.aio(ctx["job"].key)


class Producer(BaseProducer):
    """A deduplicated enqueue (``key=key``); no batch call."""

    def __init__(self, url: str, queue: str) -> None:
        from saq import Queue  # noqa: PLC0415

        self.queue = Queue.from_url(url, name=queue)

    async def open(self) -> None:
        await self.queue.connect()

    async def add(self, key: str) -> None:
        await self.queue.enqueue("saq_job", key=key)

    async def close(self) -> None:
        await self.queue.disconnect()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    global _handler
    _handler = handler
    asyncio.run(_serve(url, queue, ready))


async def _serve(url: str, queue: str, ready: Callable[[], None]) -> None:
    from saq import Queue, Worker  # noqa: PLC0415

    worker = Worker(Queue.from_url(url, name=queue), functions=[saq_job], concurrency=CONCURRENCY)
    ready()
    await worker.start()
