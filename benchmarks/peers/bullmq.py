"""BullMQ's Python port: ``Worker(concurrency=CONCURRENCY)``, jobs removed when done,
deduplicated by the key, keeping the last add made while the job is active
(``keepLastIfActive``; ``keep_last=False``: its simple deduplication).

It needs redis-py 6.2 or later and arq pins it below 6, so it runs in a
virtualenv of its own (``distributed.py`` runs it there as a subprocess)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from . import CONCURRENCY, BaseProducer, Handler

NAME = "BullMQ"
SETTINGS = (
    f"`Worker(concurrency={CONCURRENCY})`, jobs with `removeOnComplete` and "
    "`removeOnFail`, `deduplication={id: key, keepLastIfActive: true}`"
)


class Producer(BaseProducer):
    """``add`` a job deduplicated by the key; a batch is one ``addBulk`` (one pipeline)."""

    def __init__(self, url: str, queue: str, keep_last: bool = True) -> None:
        from bullmq import Queue  # noqa: PLC0415

        self.queue = Queue(queue, {"connection": url})
        self.keep_last = keep_last

    def _opts(self, key: str) -> dict[str, Any]:
        dedup: dict[str, Any] = {"id": key}
        if self.keep_last:
            dedup["keepLastIfActive"] = True
        return {"deduplication": dedup, "removeOnComplete": True, "removeOnFail": True}

    async def add(self, key: str) -> None:
        await self.queue.add("job", {"k": key}, self._opts(key))

    async def add_batch(self, keys: list[str]) -> None:
        await self.queue.addBulk(
            [{"name": "job", "data": {"k": key}, "opts": self._opts(key)} for key in keys]
        )

    async def close(self) -> None:
        await self.queue.close()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    """The same worker for both deduplications."""
    asyncio.run(_serve(url, queue, handler, ready))


async def _serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    from bullmq import Worker  # noqa: PLC0415

    async def bullmq_job(job: Any, token: str) -> None:
        await handler.aio(job.data["k"])

    options = {
        "connection": url,
        "concurrency": CONCURRENCY,
        "removeOnComplete": True,
        "removeOnFail": True,
    }
    worker = Worker(queue, bullmq_job, options)  # autorun: it runs already
    ready()
    await asyncio.Event().wait()
    await worker.close()
