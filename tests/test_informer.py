"""keyqueue.informer against the lab's API server on a real etcd, through kubernetes_asyncio.

Each test works in its own namespace on the session's etcd. A 410 is forced
for real: the informer's watch is held at a gate while the test changes
objects and compacts etcd past the informer's resourceVersion.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from etcd_server import ServerThread, api_server, etcd_url, namespace
from keyqueue import AsyncWorkQueue, Empty, ShutDown
from keyqueue.informer import Change, ChangeKind, Informer, object_key
from keyqueue.lab.pipeline.apiserver import ApiServer
from keyqueue.lab.pipeline.etcd import Etcd

__all__ = ["api_server", "etcd_url", "namespace"]  # fixtures, imported for pytest

WAIT = 10.0  # generous bound on every wait for the informer to get somewhere


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def api(url: str) -> k8s.ApiClient:
    config = k8s.Configuration()
    config.host = url
    return k8s.ApiClient(config)


def cm(name: str, **data: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data=data)


def drain(queue: AsyncWorkQueue[str]) -> list[str]:
    keys = []
    while True:
        try:
            key = queue.get_nowait()
        except (Empty, ShutDown):
            return keys
        keys.append(key)
        queue.done(key)


class Running:
    """An informer running in a task, with every change it emitted."""

    def __init__(self, informer: Informer[Any]) -> None:
        self.informer = informer
        self.changes: list[Change[Any]] = []
        informer.add_handler(self.changes.append)
        self.task = asyncio.create_task(informer.run())

    def seen(self) -> list[tuple[str, str]]:
        return [(c.kind.value, c.key) for c in self.changes]

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def gated(list_func: Callable[..., Awaitable[Any]], gate: asyncio.Event) -> Any:
    """``list_func`` whose watch calls wait for ``gate`` (lists pass straight through)."""

    @functools.wraps(list_func)  # keeps the docstring Watch reads the return type from
    async def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            await gate.wait()
        return await list_func(*args, **kwargs)

    return call


async def test_informer_lists_then_watches_adding_each_changed_key_to_the_queue(
    api_server: ServerThread, namespace: str
) -> None:
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        await v1.create_namespaced_config_map(namespace, cm("a", v="1"))
        await v1.create_namespaced_config_map(namespace, cm("b", v="1"))
        queue: AsyncWorkQueue[str] = AsyncWorkQueue("informer")
        informer: Informer[k8s.V1ConfigMap] = Informer(
            v1.list_namespaced_config_map, namespace, queue=queue
        )
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        assert running.seen() == [("ADDED", f"{namespace}/a"), ("ADDED", f"{namespace}/b")]
        assert all(c.relisted for c in running.changes)
        assert drain(queue) == [f"{namespace}/a", f"{namespace}/b"]

        await until(lambda: informer.stats().watches == 1, "the watch")
        await v1.create_namespaced_config_map(namespace, cm("c", v="1"))
        patched = await v1.patch_namespaced_config_map("a", namespace, {"data": {"v": "2"}})
        await v1.delete_namespaced_config_map("b", namespace)
        await until(lambda: len(running.changes) == 5, "three watch events")
        await running.stop()

        assert running.seen()[2:] == [
            ("ADDED", f"{namespace}/c"),
            ("MODIFIED", f"{namespace}/a"),
            ("DELETED", f"{namespace}/b"),
        ]
        modified = running.changes[3]
        assert not modified.relisted
        assert modified.old is not None
        assert (modified.old.data, modified.obj.data) == ({"v": "1"}, {"v": "2"})
        assert modified.resource_version == patched.metadata.resource_version
        assert informer.keys() == [f"{namespace}/a", f"{namespace}/c"]
        a = informer.get(f"{namespace}/a")
        assert a is not None
        assert a.data == {"v": "2"}
        assert drain(queue) == [f"{namespace}/c", f"{namespace}/a", f"{namespace}/b"]
        assert informer.stats().lists == 1


async def test_informer_relists_after_410_firing_only_what_changed(
    api_server: ServerThread, namespace: str
) -> None:
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        for name in ("same", "changed", "deleted"):
            await v1.create_namespaced_config_map(namespace, cm(name, v="1"))
        gate = asyncio.Event()
        queue: AsyncWorkQueue[str] = AsyncWorkQueue("informer")
        informer: Informer[k8s.V1ConfigMap] = Informer(
            gated(v1.list_namespaced_config_map, gate), namespace, queue=queue
        )
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        listed = drain(queue)
        del running.changes[:]

        # While the informer's watch waits at the gate, change things and compact
        # etcd past the version it will watch from.
        await v1.patch_namespaced_config_map("changed", namespace, {"data": {"v": "2"}})
        await v1.delete_namespaced_config_map("deleted", namespace)
        await v1.create_namespaced_config_map(namespace, cm("new", v="1"))
        await etcd.compact(await etcd.revision())
        gate.set()
        await until(lambda: informer.stats().lists == 2, "the re-list")
        await until(lambda: len(running.changes) == 3, "the re-list's changes")
        await running.stop()

        stats = informer.stats()
        assert (stats.expired, stats.errors) == (1, 0)
        assert sorted(running.seen()) == [
            ("ADDED", f"{namespace}/new"),
            ("DELETED", f"{namespace}/deleted"),
            ("MODIFIED", f"{namespace}/changed"),
        ]
        assert all(c.relisted for c in running.changes)
        assert len(listed) == 3
        assert sorted(drain(queue)) == [
            f"{namespace}/changed",
            f"{namespace}/deleted",
            f"{namespace}/new",
        ]
        assert informer.keys() == [f"{namespace}/changed", f"{namespace}/new", f"{namespace}/same"]


async def test_informer_watches_again_from_its_last_version_when_a_watch_times_out(
    api_server: ServerThread, namespace: str
) -> None:
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(
            v1.list_namespaced_config_map, namespace, watch_timeout=1
        )
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await v1.create_namespaced_config_map(namespace, cm("before"))
        await until(lambda: informer.stats().watches >= 2, "the second watch")
        await v1.create_namespaced_config_map(namespace, cm("after"))
        await until(lambda: len(running.changes) == 2, "both ADDED events")
        await running.stop()
        assert running.seen() == [("ADDED", f"{namespace}/before"), ("ADDED", f"{namespace}/after")]
        assert informer.stats().lists == 1


async def test_informer_relists_when_the_api_server_drops_and_comes_back(
    api_server: ServerThread, namespace: str
) -> None:
    """The informer's own API server goes away mid-watch; while it is gone an object
    is created through another one; the re-list after it returns finds it."""
    async with Etcd(api_server.etcd_url) as etcd:
        server = ApiServer(etcd)
        url = await server.start()
        port = int(url.rsplit(":", 1)[1])
        async with api(url) as client, api(api_server.url) as other:
            v1, v1_other = k8s.CoreV1Api(client), k8s.CoreV1Api(other)
            informer: Informer[k8s.V1ConfigMap] = Informer(v1.list_namespaced_config_map, namespace)
            running = Running(informer)
            await asyncio.wait_for(informer.wait_synced(), WAIT)
            await until(lambda: informer.stats().watches == 1, "the watch")
            await server.close()
            await until(lambda: informer.stats().errors >= 1, "the informer to notice")
            await v1_other.create_namespaced_config_map(namespace, cm("while-away"))
            server = ApiServer(etcd)
            await server.start(port=port)
            try:
                await until(lambda: len(running.changes) == 1, "the re-list")
            finally:
                await running.stop()
                await server.close()
        assert running.seen() == [("ADDED", f"{namespace}/while-away")]
        assert running.changes[0].relisted
        assert informer.stats().lists == 2


async def test_a_raising_handler_is_logged_and_the_informer_goes_on(
    api_server: ServerThread, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(v1.list_namespaced_config_map, namespace)

        def broken(change: Change[Any]) -> None:
            raise RuntimeError("handler bug")

        informer.add_handler(broken)
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await v1.create_namespaced_config_map(namespace, cm("x"))
        await v1.create_namespaced_config_map(namespace, cm("y"))
        await until(lambda: len(running.changes) == 2, "both events")
        await running.stop()
        assert running.seen() == [("ADDED", f"{namespace}/x"), ("ADDED", f"{namespace}/y")]
        logged = [r.getMessage() for r in caplog.records if r.name == "keyqueue.informer"]
        assert [m.rsplit(" ", 1)[1] for m in logged] == [f"{namespace}/x", f"{namespace}/y"]


def test_object_key_is_namespace_slash_name_for_models_and_dicts() -> None:
    assert object_key(cm("n")) == "n"
    assert object_key(k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="n", namespace="ns"))) == (
        "ns/n"
    )
    assert object_key({"metadata": {"name": "n", "namespace": "ns"}}) == "ns/n"
    assert ChangeKind("DELETED") is ChangeKind.DELETED


@pytest.mark.parametrize(
    ("watch_timeout", "error"), [(0, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_a_bad_watch_timeout_is_refused(watch_timeout: Any, error: type[Exception]) -> None:
    async def list_func(**kwargs: Any) -> Any:  # pragma: no cover - never called
        return None

    with pytest.raises(error, match="watch_timeout"):
        Informer(list_func, watch_timeout=watch_timeout)
