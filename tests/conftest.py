"""Shared fixtures: the ``front`` harness that runs one behaviour suite on every front.

Conformance tests are ``async def`` functions taking ``front``; they build
queues with ``front.make(...)`` and use only what every front has (the plain
methods, plus ``await front.get(q)``, ``await front.shutdown(q)`` and
``await front.run_workers(...)``). A later backend adds one ``Front`` subclass.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import keyqueue
from keyqueue import AsyncWorkQueue, Requeue, WorkQueue


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (no plugin needed)."""
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        argnames = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in argnames}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


Handler = Callable[[Any], "Requeue | None"]


class Front:
    """How a conformance test drives one implementation."""

    name: str
    queue_type: type

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        """A new queue; call it inside the test coroutine (the asyncio front binds there)."""
        return self.queue_type(name, **kwargs)

    async def get(self, q: Any, timeout: float = 5.0) -> Any:
        """A blocking get bounded by ``timeout`` wall seconds (raises keyqueue.Empty)."""
        raise NotImplementedError

    async def shutdown(self, q: Any, drain: bool = False, timeout: float | None = None) -> bool:
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


def _idle(q: Any) -> bool:
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
        check = until or (lambda: _idle(q))
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
        try:
            return await asyncio.wait_for(q.get(), timeout)
        except TimeoutError:
            raise keyqueue.Empty from None

    async def shutdown(
        self, q: AsyncWorkQueue[Any], drain: bool = False, timeout: float | None = None
    ) -> bool:
        return await q.shutdown(drain=drain, timeout=timeout)

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
        check = until or (lambda: _idle(q))
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


FRONTS = [ThreadingFront(), AsyncioFront()]


@pytest.fixture(params=FRONTS, ids=lambda f: f.name)
def front(request: pytest.FixtureRequest) -> Front:
    """Every implementation of the queue, one after another."""
    return request.param  # type: ignore[no-any-return]
