"""``run_workers`` and ``arun_workers`` refuse the other front's queue, before taking a key.

Each runner calls its queue's methods the way its front works: ``run_workers``
blocks on ``get``, ``arun_workers`` awaits what each call returns. Handed the
other kind (a coroutine where a value is expected, or a blocking call on the
loop), a runner that did not check would misbehave instead of saying so:
``run_workers`` on an ``AsyncWorkQueue`` would take the coroutine ``get``
returns for a key and count an error per spin (hundreds a second), and on an
``AsyncRedisWorkQueue`` die of an ``AttributeError`` with a coroutine never
awaited; ``arun_workers`` on a ``WorkQueue`` would log "get raised
TypeError" and try again for ever, and on a ``RedisWorkQueue`` die of an
``AttributeError``. Each is a one-line ``TypeError`` naming the runner to
use, and nothing is taken from the queue.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from keyqueue import AsyncWorkQueue, WorkQueue, arun_workers, run_workers

pytest.importorskip("redis", reason="half of these queues are Redis queues: redis-py")

from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from tests.support.valkey_server import name, valkey_url

__all__ = ["name", "valkey_url"]  # fixtures


def _handle(key: str) -> None:  # pragma: no cover - never called
    pass


async def _ahandle(key: str) -> None:  # pragma: no cover - never called
    pass


@pytest.mark.parametrize("kind", ["AsyncWorkQueue", "AsyncRedisWorkQueue"])
async def test_run_workers_refuses_an_asyncio_queue_naming_arun_workers(
    kind: str, valkey_url: str, name: str
) -> None:
    queue: Any
    if kind == "AsyncWorkQueue":
        queue = AsyncWorkQueue[str](name)
        queue.add("k")
    else:
        queue = AsyncRedisWorkQueue(name, url=valkey_url)
        await queue.add("k")
    stop = threading.Event()
    bound = threading.Timer(10.0, stop.set)  # (a runner that spins would run until stopped)
    bound.start()
    try:
        with pytest.raises(
            TypeError,
            match=rf"^run_workers drives a WorkQueue or a RedisWorkQueue, got the asyncio "
            rf"{kind}; use arun_workers$",
        ):
            await asyncio.to_thread(run_workers, queue, _handle, stop=stop)
        stats = queue.stats()
        if kind == "AsyncRedisWorkQueue":
            stats = await stats
        assert (stats.gets, stats.depth) == (0, 1)  # nothing taken
    finally:
        bound.cancel()
        if kind == "AsyncRedisWorkQueue":
            await queue.aclose()


@pytest.mark.parametrize("kind", ["WorkQueue", "RedisWorkQueue"])
async def test_arun_workers_refuses_a_blocking_queue_naming_run_workers(
    kind: str, valkey_url: str, name: str
) -> None:
    queue: Any = (
        WorkQueue[str](name) if kind == "WorkQueue" else RedisWorkQueue(name, url=valkey_url)
    )
    try:
        queue.add("k")
        with pytest.raises(
            TypeError,
            match=rf"^arun_workers drives an AsyncWorkQueue or an AsyncRedisWorkQueue, got the "
            rf"blocking {kind}; use run_workers$",
        ):
            await asyncio.wait_for(arun_workers(queue, _ahandle, stop=asyncio.Event()), 10)
        stats = queue.stats()
        assert (stats.gets, stats.depth) == (0, 1)  # nothing taken
    finally:
        if kind == "RedisWorkQueue":
            queue.close()


def test_a_runner_refuses_an_object_without_get() -> None:
    with pytest.raises(TypeError, match=r"^run_workers needs a work queue, got object$"):
        run_workers(object(), _handle)  # type: ignore[arg-type]


def test_batch_true_on_a_queue_that_cannot_batch_is_refused_before_taking_a_key() -> None:
    queue = WorkQueue[str]()
    queue.add("k")
    with pytest.raises(TypeError, match=r"^batch=True: WorkQueue has no batched workers"):
        run_workers(queue, _handle, batch=True)
    with pytest.raises(TypeError, match="batch must be True or False"):
        run_workers(queue, _handle, batch="yes")  # type: ignore[arg-type]
    assert (queue.stats().gets, len(queue)) == (0, 1)


def test_batch_false_runs_a_batched_redis_queue_one_key_at_a_time(
    valkey_url: str, name: str
) -> None:
    """The runner's ``batch=False`` overrides the queue's ``batch=True``: a
    ``get`` and a ``done`` script per key, no claim."""
    queue = RedisWorkQueue(name, url=valkey_url)
    seen: list[str] = []
    real = queue._run

    def run(script: str, args: list[str]) -> Any:
        seen.append(script)
        return real(script, args)

    queue._run = run  # type: ignore[method-assign]
    try:
        assert queue.batch
        queue.add_many(["a", "b", "c"])
        stop = threading.Event()
        handled: list[str] = []

        def handler(key: str) -> None:
            handled.append(key)
            if len(handled) == 3:
                stop.set()

        stats = run_workers(queue, handler, 2, stop, batch=False)
        assert stats.processed == stats.succeeded == 3
        assert "claim" not in seen
        assert seen.count("done") == 3
    finally:
        queue.close()
