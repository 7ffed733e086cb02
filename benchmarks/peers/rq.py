"""rq: ``SimpleWorker`` (no fork per job; one job at a time per process, its
model), the key as a unique job id, no result kept.

rq's worker imports its job by name, ``peers.rq.rq_job``: this module, which
``serve`` has already given the handler in this process."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from . import BATCH, BaseProducer, Handler

NAME = "rq"
SETTINGS = (
    "`SimpleWorker` (no fork per job; one job at a time per process, its model), "
    "`unique=True`, `result_ttl=0`, `job_id=key`"
)
JOB = f"{__name__}.rq_job"

_handler: Handler | None = None  # this worker process's, set by serve


def rq_job(key: str) -> None:
    assert _handler is not None
    _handler.sync(key)


class Producer(BaseProducer):
    """One deduplicated enqueue at a time (``unique=True``); ``load`` puts distinct
    keys with ``enqueue_many``, one pipeline per ``BATCH``, no uniqueness check."""

    def __init__(self, url: str, queue: str) -> None:
        import redis  # noqa: PLC0415
        import rq  # noqa: PLC0415
        from rq.exceptions import DuplicateJobError  # noqa: PLC0415

        self.redis = redis.Redis.from_url(url)
        self.queue = rq.Queue(queue, connection=self.redis)
        self.duplicate = DuplicateJobError

    async def add(self, key: str) -> None:
        with contextlib.suppress(self.duplicate):
            self.queue.enqueue(JOB, key, job_id=key, unique=True, result_ttl=0)

    async def add_batch(self, keys: list[str]) -> None:
        for key in keys:
            await self.add(key)

    async def load(self, keys: list[str]) -> None:
        prepare = self.queue.prepare_data
        for i in range(0, len(keys), BATCH):
            self.queue.enqueue_many(
                [prepare(JOB, (key,), job_id=key, result_ttl=0) for key in keys[i : i + BATCH]]
            )

    async def close(self) -> None:
        self.redis.close()


def serve(url: str, queue: str, handler: Handler, ready: Callable[[], None]) -> None:
    global _handler
    _handler = handler
    import redis  # noqa: PLC0415
    import rq  # noqa: PLC0415

    connection = redis.Redis.from_url(url)
    worker = rq.SimpleWorker([rq.Queue(queue, connection=connection)], connection=connection)
    ready()
    worker.work(logging_level="ERROR")
