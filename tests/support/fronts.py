"""The ``front`` harness's in-memory fronts: how a conformance test drives a queue.

Conformance tests are ``async def`` functions taking ``front`` (conftest.py);
they build queues with ``front.make(...)`` and use only what every front has
(the plain methods, plus ``await front.get(q)``, ``await front.shutdown(q)`` and
``await front.run_workers(...)``). A later backend adds one ``Front`` subclass
(the Redis ones are in ``redis_fronts``). Nothing here imports redis-py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

import keyqueue
from keyqueue import AsyncWorkQueue, Requeue, WorkQueue

__all__ = ["AsyncioFront", "Front", "Handler", "ThreadingFront", "Unavailable", "idle"]

Handler = Callable[[Any], "Requeue | None"]


class Front:
    """How a conformance test drives one implementation."""

    name: str
    queue_type: type
    skips: ClassVar[dict[str, str]] = {}
    """Conformance tests that cannot apply to this front: test name -> why."""
    per_client_shutdown: ClassVar[bool] = False
    """Shutdown stops this client only, and the queue outlives it (Redis): a
    drain waits for the client's own holds, and what it leaves stays on the
    server for the other clients or the next start."""

    def begin(self, request: pytest.FixtureRequest) -> None:
        """Set up for one test (the Redis fronts get a server and an empty db)."""

    def end(self) -> None:
        """Tear down after one test."""

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        """A new queue; call it inside the test coroutine (the asyncio front binds there)."""
        return self.queue_type(name, **kwargs)

    async def get(self, q: Any, timeout: float = 5.0) -> Any:
        """A blocking get bounded by ``timeout`` wall seconds (raises keyqueue.Empty)."""
        raise NotImplementedError

    async def shutdown(self, q: Any, drain: bool = False, timeout: float | None = None) -> bool:
        raise NotImplementedError

    async def drain(self, q: Any, timeout: float | None = None) -> bool:
        """``shutdown(drain=True, timeout=timeout)`` without blocking the test's
        loop (a task can run it while the test acts on the queue)."""
        raise NotImplementedError

    async def join(self, q: Any, timeout: float | None = None) -> bool:
        """``q.join(timeout)`` without blocking the test's loop."""
        raise NotImplementedError

    async def run_workers(
        self,
        q: Any,
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        """Run the front's runner with a plain ``handler`` until ``until()`` holds
        (default: the queue is idle: nothing waiting, processing or delayed),
        then shut down with drain, wait for the runner and return its RunStats."""
        raise NotImplementedError


def idle(q: Any) -> bool:
    s = q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


class ThreadingFront(Front):
    name = "threading"
    queue_type = WorkQueue

    async def get(self, q: WorkQueue[Any], timeout: float = 5.0) -> Any:
        return q.get(timeout=timeout)

    async def shutdown(
        self, q: WorkQueue[Any], drain: bool = False, timeout: float | None = None
    ) -> bool:
        return q.shutdown(drain=drain, timeout=timeout)

    async def drain(self, q: WorkQueue[Any], timeout: float | None = None) -> bool:
        return await asyncio.to_thread(q.shutdown, drain=True, timeout=timeout)

    async def join(self, q: WorkQueue[Any], timeout: float | None = None) -> bool:
        return await asyncio.to_thread(q.join, timeout)

    async def run_workers(
        self,
        q: WorkQueue[Any],
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        errors: list[BaseException] = []
        returned: list[keyqueue.RunStats] = []

        def run() -> None:
            try:
                returned.append(
                    keyqueue.run_workers(q, handler, workers=workers, on_give_up=on_give_up)
                )
            except BaseException as exc:  # surfaced in the test thread below
                errors.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        check = until or (lambda: idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                await asyncio.sleep(0.001)
            assert q.shutdown(drain=True, timeout=timeout)
        finally:
            q.shutdown()  # a failed check must not leave the runner thread behind
        runner.join(timeout)
        assert not runner.is_alive()
        if errors:
            raise errors[0]
        return returned[0]


class AsyncioFront(Front):
    name = "asyncio"
    queue_type = AsyncWorkQueue

    async def get(self, q: AsyncWorkQueue[Any], timeout: float = 5.0) -> Any:
        return await q.get(timeout=timeout)

    async def shutdown(
        self, q: AsyncWorkQueue[Any], drain: bool = False, timeout: float | None = None
    ) -> bool:
        return await q.shutdown(drain=drain, timeout=timeout)

    async def drain(self, q: AsyncWorkQueue[Any], timeout: float | None = None) -> bool:
        return await q.shutdown(drain=True, timeout=timeout)

    async def join(self, q: AsyncWorkQueue[Any], timeout: float | None = None) -> bool:
        return await q.join(timeout)

    async def run_workers(
        self,
        q: AsyncWorkQueue[Any],
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        async def ahandler(key: Any) -> Requeue | None:
            await asyncio.sleep(0)
            return handler(key)

        # A non-callable handler is passed through as is, so that arun_workers's
        # own argument check sees it (as run_workers does on the threading front).
        runner = asyncio.create_task(
            keyqueue.arun_workers(
                q,
                ahandler if callable(handler) else handler,
                workers=workers,
                on_give_up=on_give_up,
            )
        )
        check = until or (lambda: idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                assert not runner.done() or runner.exception() is None
                await asyncio.sleep(0.001)
            assert await q.shutdown(drain=True, timeout=timeout)
            return await asyncio.wait_for(runner, timeout)
        finally:
            runner.cancel()


class Unavailable(Front):
    """A front whose client library is not installed: each of its tests is skipped,
    saying why, so the suite's test ids stay the same without it."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def begin(self, request: pytest.FixtureRequest) -> None:
        pytest.skip(self.reason)
