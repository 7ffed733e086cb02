"""Fixtures for tests against a real etcd: one etcd and one API server per test session.

Import the fixtures into a test module (``from tests.support.etcd_server import api_url, ...``).
Pytest makes one fixture definition per importing module, so the session's
single etcd is kept in the config's stash and reference-counted: the first
user starts it (``local_etcd``: free port, temp dir, health wait), the last
one's teardown stops it. The API server runs on its own event loop in a
background thread, so the blocking official client can call it from the test
thread and async tests can call it from theirs. Tests stay apart by
namespace: ``namespace`` is fresh for every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client as k8s

from keyqueue.lab.pipeline.apiserver import ApiServer
from keyqueue.lab.pipeline.etcd import Etcd
from keyqueue.testing import local_etcd

__all__ = ["ServerThread", "api_server", "etcd_url", "namespace"]

T = TypeVar("T")

_SHARED = pytest.StashKey[dict[str, Any]]()
START_TIMEOUT = 30.0


def _shared(config: pytest.Config, name: str, start: Any) -> Iterator[Any]:
    """One instance of ``start()`` (a context manager) per session, however many modules ask."""
    shared = config.stash.setdefault(_SHARED, {})
    if name not in shared:
        stack = contextlib.ExitStack()
        shared[name] = [stack.enter_context(start()), stack, 0]
    entry = shared[name]
    entry[2] += 1
    try:
        yield entry[0]
    finally:
        entry[2] -= 1
        if entry[2] == 0:
            del shared[name]
            entry[1].close()


class ServerThread:
    """An ``ApiServer`` over etcd at ``etcd_url``, on an event loop in its own thread."""

    def __init__(self, etcd_url: str) -> None:
        self.etcd_url = etcd_url
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="apiserver", daemon=True)
        self._thread.start()
        self.etcd = Etcd(etcd_url)
        self.server = ApiServer(self.etcd)
        self.url: str = self.call(self.server.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the server's loop; its result (bounded wait)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(START_TIMEOUT)

    def close(self) -> None:
        try:
            self.call(self.server.close())
            self.call(self.etcd.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(START_TIMEOUT)
            assert not self._thread.is_alive(), "the API server thread did not stop"
            self.loop.close()


@contextlib.contextmanager
def _server(etcd_url: str) -> Iterator[ServerThread]:
    server = ServerThread(etcd_url)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def etcd_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's etcd (started on first use, stopped after the last test using it)."""
    yield from _shared(request.config, "etcd", local_etcd)


@pytest.fixture(scope="session")
def api_server(request: pytest.FixtureRequest, etcd_url: str) -> Iterator[ServerThread]:
    """The session's API server over the session's etcd."""
    yield from _shared(request.config, "apiserver", lambda: _server(etcd_url))


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


async def until(condition: Callable[[], bool], what: str, wait: float = 15.0) -> None:
    """Wait, at most ``wait`` seconds (a generous bound), until ``condition()``."""
    deadline = time.monotonic() + wait
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def api(url: str) -> k8s.ApiClient:
    """A kubernetes_asyncio client for the API server at ``url``."""
    config = k8s.Configuration()
    config.host = url
    return k8s.ApiClient(config)
