"""arq: ``Worker(max_jobs=CONCURRENCY)`` polling every ``POLL_DELAY`` seconds,
no result kept, the key as the job id (its deduplication)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from . import CONCURRENCY, BaseProducer, Handler

NAME = "arq"
POLL_DELAY = 0.005
SETTINGS = (
    f"`max_jobs={CONCURRENCY}`, `poll_delay={POLL_DELAY:g}` (default 0.5 s), "
    "`keep_result=0` (a kept result holds the job id for an hour), `_job_id=key`"
)

_handler: Handler | None = None  # this worker process's, set by serve


async def arq_job(ctx: dict[str, Any], key: str) -> None:
    assert _handler is not None
    await _handler.aio(key)


class Producer(BaseProducer):
    """A deduplicated enqueue (``_job_id=key``); no batch call."""

    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue

    async def open(self) -> None:
        from arq.connections import RedisSettings, create_pool  # noqa: PLC0415

        self.pool = await create_pool(
            RedisSettings.from_dsn(self.url), default_queue_name=self.queue
        )

    async def add(self, key: str) -> None:
        await self.pool.enqueue_job("arq_job", key, _job_id=key)

    async def close(self) -> None:
        await self.pool.aclose()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    global _handler
    _handler = handler
    asyncio.run(_serve(url, queue, ready))


async def _serve(url: str, queue: str, ready: Callable[[], None]) -> None:
    from arq.connections import RedisSettings  # noqa: PLC0415
    from arq.worker import Worker  # noqa: PLC0415

    worker = Worker(
        functions=[arq_job],  # type: ignore[list-item]
        redis_settings=RedisSettings.from_dsn(url),
        queue_name=queue,
        max_jobs=CONCURRENCY,
        poll_delay=POLL_DELAY,
        keep_result=0,
        handle_signals=False,
    )
    ready()
    await worker.main()
