"""streaq: ``Worker(concurrency=CONCURRENCY)`` (prefetch its default), one task
with no result kept (``ttl=0``) and ``silent=True``; the key as the task id
(a task id already stored is not enqueued again: its deduplication)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from . import CONCURRENCY, BaseProducer, Handler

NAME = "streaq"
SETTINGS = (
    f"`Worker(concurrency={CONCURRENCY})` (prefetch its default), a task with "
    "`ttl=0` (no result kept) and `silent=True`, task id = key"
)


def _worker(url: str, queue: str, handler: Handler | None = None) -> tuple[Any, Any]:
    """streaq's worker and its one task (the producer registers the same task,
    without a handler: it never runs it)."""
    from streaq import Worker  # noqa: PLC0415

    worker: Any = Worker(
        redis_url=url, queue_name=queue, concurrency=CONCURRENCY, handle_signals=False
    )

    async def streaq_job(key: str) -> None:
        assert handler is not None
        await handler.aio(key)

    return worker, worker.task(name="job", ttl=0, silent=True)(streaq_job)


class Producer(BaseProducer):
    """A task per key, its id the key; a batch is one ``enqueue_many`` (one pipeline)."""

    def __init__(self, url: str, queue: str) -> None:
        self.worker, self.task = _worker(url, queue)
        self.stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        await self.stack.enter_async_context(self.worker)

    def _task(self, key: str) -> Any:
        task = self.task.enqueue(key)
        task.id = key
        return task

    async def add(self, key: str) -> None:
        await self._task(key)

    async def add_batch(self, keys: list[str]) -> None:
        await self.worker.enqueue_many([self._task(key) for key in keys])

    async def close(self) -> None:
        await self.stack.aclose()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    asyncio.run(_serve(url, queue, handler, ready))


async def _serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    worker, _ = _worker(url, queue, handler)
    ready()
    await worker.run_async()
