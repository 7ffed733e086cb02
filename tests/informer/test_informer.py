"""keyqueue.informer against the lab's API server on a real etcd, through kubernetes_asyncio.

Each test works in its own namespace on the session's etcd. A 410 is forced
for real: the informer's watch is held at a gate while the test changes
objects and compacts etcd past the informer's resourceVersion.

The pacing tests run the informer against ``StubApiServer``, a real
HTTP server on a free loopback port that misbehaves on purpose (410 to every
watch, watches closed at once, 500s) and counts every request. The informer
and the stub share a ``JumpClock``: the informer's back-offs step it instead of
waiting, and the stub reads it to decide when to behave, so "3 s of a
misbehaving server" takes milliseconds of wall time and no test sleeps.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client as k8s

from keyqueue import AsyncWorkQueue, Empty, ItemExponentialFailureRateLimiter, ShutDown
from keyqueue.informer import Change, ChangeKind, Informer, object_key
from keyqueue.lab.pipeline.apiserver import ApiServer
from keyqueue.lab.pipeline.etcd import Etcd
from keyqueue.testing import FakeClock
from tests.support import etcd_server
from tests.support.etcd_server import ServerThread, api, api_server, etcd_url, namespace

__all__ = ["api_server", "etcd_url", "namespace"]  # fixtures, imported for pytest

WAIT = 10.0  # generous bound on every wait for the informer to get somewhere


async def until(condition: Callable[[], bool], what: str) -> None:
    await etcd_server.until(condition, what, WAIT)


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


# -- pacing against a misbehaving server ------------------------------------------------

NS = "stub"
BEHAVE_AT = 3.0  # the stub misbehaves until the shared clock reads this
HANDFUL = 6  # at most this many requests while it misbehaves: three list+watch rounds
RUNAWAY = 20  # the stub gives up waiting for the informer to calm down past this many
LASTED = 200.0  # seconds a "last" watch stays open on the clock: longer than the reset


class JumpClock(FakeClock):
    """A ``FakeClock`` whose ``sleep`` steps it: the informer's back-offs take no wall time."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.step(seconds)
        await asyncio.sleep(0)  # a checkpoint, as a real sleep is; it does not wait


@dataclass(frozen=True)
class Request:
    at: float
    """The shared clock when the request arrived."""
    kind: str
    """"list" or "watch"."""
    reply: str
    """What the stub answered (see ``StubApiServer``)."""
    resource_version: str


def _cm_json(name: str, rv: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": NS, "resourceVersion": rv}
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}


def _gone() -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "too old resource version: 10 (20)",
        "reason": "Expired",
        "code": 410,
    }


class StubApiServer:
    """ConfigMaps in namespace ``stub`` over HTTP, misbehaving as ``behaviour`` says.

    ``behaviour(kind, n)`` picks the reply to the ``n``-th request of ``kind``
    (from 0). Lists: "ok" (``a`` and ``b`` at resourceVersion 10) or "fail"
    (500). Watches: "serve" (an ADDED ``c`` at 11, then open until the stub
    closes), "gone" (an HTTP 410), "gone-event" (200, then an ERROR event with
    code 410), "close" (200 and closed at once), "fail" (500), "bookmark" (a
    BOOKMARK at 11, then closed), "last" (open for ``LASTED`` seconds of the
    clock, which it steps, then closed with no event). Every request is
    recorded in ``requests``; ``runaway`` is set once ``RUNAWAY`` of them
    arrived, so a busy loop fails the test at once instead of spinning.
    """

    def __init__(self, clock: FakeClock, behaviour: Callable[[str, int], str]) -> None:
        self.clock = clock
        self.behaviour = behaviour
        self.requests: list[Request] = []
        self.runaway = asyncio.Event()
        self.url = ""
        self._closing = asyncio.Event()
        app = web.Application()
        app.router.add_get(f"/api/v1/namespaces/{NS}/configmaps", self._configmaps)
        self._runner = web.AppRunner(app, handle_signals=False)

    async def start(self) -> str:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)  # a free port
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        self._closing.set()  # ends every open "serve" watch
        await self._runner.cleanup()

    def of(self, kind: str) -> list[Request]:
        return [r for r in self.requests if r.kind == kind]

    async def _configmaps(self, request: web.Request) -> web.StreamResponse:
        watching = request.query.get("watch", "").lower() in ("true", "t", "1")
        kind = "watch" if watching else "list"
        reply = self.behaviour(kind, len(self.of(kind)))
        rv = request.query.get("resourceVersion", "")
        self.requests.append(Request(self.clock.now(), kind, reply, rv))
        if len(self.requests) >= RUNAWAY:
            self.runaway.set()
        if reply == "fail":
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        if reply == "gone":
            return web.json_response(_gone(), status=410)
        if kind == "list":
            items = [_cm_json("a", "5"), _cm_json("b", "6")]
            meta = {"resourceVersion": "10"}
            return web.json_response({"kind": "ConfigMapList", "metadata": meta, "items": items})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if reply == "serve":
            await self._send(response, {"type": "ADDED", "object": _cm_json("c", "11")})
            await self._closing.wait()
        elif reply == "gone-event":
            await self._send(response, {"type": "ERROR", "object": _gone()})
        elif reply == "bookmark":
            bookmark = {"kind": "ConfigMap", "metadata": {"resourceVersion": "11"}}
            await self._send(response, {"type": "BOOKMARK", "object": bookmark})
        elif reply == "last":
            self.clock.step(LASTED)
        else:
            assert reply == "close", reply
        await response.write_eof()
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, event: dict[str, Any]) -> None:
        await response.write(json.dumps(event).encode() + b"\n")


@asynccontextmanager
async def stub_api(
    clock: FakeClock, behaviour: Callable[[str, int], str]
) -> AsyncIterator[tuple[StubApiServer, k8s.CoreV1Api]]:
    """A started ``StubApiServer`` and a client for it; both closed on every exit path."""
    server = StubApiServer(clock, behaviour)
    await server.start()
    try:
        async with api(server.url) as client:
            yield server, k8s.CoreV1Api(client)
    finally:
        await server.close()


CONVERGED = [f"{NS}/a", f"{NS}/b", f"{NS}/c"]


async def converge(informer: Informer[Any], server: StubApiServer) -> None:
    """Run ``informer`` until its cache holds ``CONVERGED`` (c comes from a served watch).

    Stops early if the stub saw a runaway number of requests; the caller's
    assertions then say how many.
    """
    converged = asyncio.Event()
    informer.add_handler(lambda _: converged.set() if informer.keys() == CONVERGED else None)
    running = Running(informer)
    waits = [asyncio.create_task(converged.wait()), asyncio.create_task(server.runaway.wait())]
    try:
        await asyncio.wait(waits, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        await running.stop()


@pytest.mark.parametrize("misbehaviour", ["gone", "gone-event", "close", "fail", "list-fails"])
async def test_a_misbehaving_server_gets_a_handful_of_requests_then_the_informer_converges(
    misbehaviour: str,
) -> None:
    """A handful of requests, client-go's back-off between them: unpaced, a 410 to
    every watch would make 63 lists in 3 s, and watches closed at once 73 watches."""
    clock = JumpClock()

    def behaviour(kind: str, n: int) -> str:
        if clock.now() >= BEHAVE_AT:
            return "ok" if kind == "list" else "serve"
        if kind == "list":
            return "fail" if misbehaviour == "list-fails" else "ok"
        return misbehaviour

    async with stub_api(clock, behaviour) as (server, v1):
        informer: Informer[Any] = Informer(v1.list_namespaced_config_map, NS, clock=clock)
        await converge(informer, server)

    early = [(r.at, r.kind, r.reply) for r in server.requests if r.at < BEHAVE_AT]
    assert len(early) <= HANDFUL, f"{len(early)} requests in {BEHAVE_AT}s: {early[:8]}..."
    assert informer.keys() == CONVERGED
    # client-go's defaults: 0.8 s doubling, each wait stretched by [1, 2).
    assert clock.sleeps, "the informer never backed off"
    for i, wait in enumerate(clock.sleeps):
        assert 0.8 * 2**i <= wait < 1.6 * 2**i, clock.sleeps
    # Converged in the first round after the server behaved: one list, one watch.
    late = [(r.kind, r.reply) for r in server.requests if r.at >= BEHAVE_AT]
    assert late == [("list", "ok"), ("watch", "serve")]
    stats = informer.stats()
    assert stats.backoffs == len(clock.sleeps)
    failed_watches = stats.expired + stats.short_watches + stats.errors
    if misbehaviour == "list-fails":
        assert (stats.lists, stats.watches, stats.errors) == (1, 1, len(clock.sleeps))
    else:
        assert stats.lists == stats.watches == len(clock.sleeps) + 1
        assert failed_watches == len(clock.sleeps)


async def test_backoff_doubles_to_its_cap_and_starts_over_after_a_watch_that_lasted() -> None:
    """Short watches back off and re-list; a watch that lasted, or brought a bookmark,
    is reopened at once from the last resourceVersion; after a back-off more than
    ``backoff_reset`` ago the next wait is the shortest again."""
    clock = JumpClock()
    script = ["close"] * 7 + ["last", "bookmark", "close"]

    def behaviour(kind: str, n: int) -> str:
        if kind == "list":
            return "ok"
        return script[n] if n < len(script) else "serve"

    async with stub_api(clock, behaviour) as (server, v1):
        informer: Informer[Any] = Informer(
            v1.list_namespaced_config_map,
            NS,
            clock=clock,
            rate_limiter=ItemExponentialFailureRateLimiter(0.8, 30.0),  # no jitter: exact
        )
        await converge(informer, server)

    assert informer.keys() == CONVERGED
    assert clock.sleeps == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 0.8]
    kinds = [(r.kind, r.reply, r.resource_version) for r in server.requests]
    assert kinds == [
        *[("list", "ok", ""), ("watch", "close", "10")] * 7,
        ("list", "ok", ""),
        ("watch", "last", "10"),
        ("watch", "bookmark", "10"),  # reopened at once: no list between
        ("watch", "close", "11"),  # from the bookmark's version
        ("list", "ok", ""),
        ("watch", "serve", "10"),
    ]
    stats = informer.stats()
    assert (stats.short_watches, stats.backoffs, stats.lists, stats.errors) == (8, 8, 9, 0)


async def test_a_shared_rate_limiter_paces_each_informer_on_its_own() -> None:
    """The limiter is asked about the informer itself, so two informers sharing one
    (a ``MaxOfRateLimiter`` with a bucket, say) keep separate back-off histories."""
    clock = JumpClock()
    limiter = ItemExponentialFailureRateLimiter(0.8, 30.0)

    def behaviour(kind: str, n: int) -> str:
        return "ok" if kind == "list" else ("close" if n < 4 else "serve")

    async with stub_api(clock, behaviour) as (server, v1):
        first: Informer[Any] = Informer(
            v1.list_namespaced_config_map, NS, clock=clock, rate_limiter=limiter
        )
        await converge(first, server)
        second: Informer[Any] = Informer(
            v1.list_namespaced_config_map, NS, clock=clock, rate_limiter=limiter
        )
        await converge(second, server)
    assert clock.sleeps == [0.8, 1.6, 3.2, 6.4]  # the second's watches all served
    assert limiter.num_requeues(first) == 4
    assert limiter.num_requeues(second) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backoff_reset": -1}, ValueError, "backoff_reset"),
        ({"backoff_reset": math.inf}, ValueError, "backoff_reset"),
        ({"short_watch": math.nan}, ValueError, "short_watch"),
        ({"short_watch": "1"}, TypeError, "short_watch"),
        ({"rate_limiter": object()}, TypeError, "rate_limiter"),
    ],
)
def test_bad_pacing_arguments_are_refused_naming_them(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    async def list_func(**kwargs: Any) -> Any:  # pragma: no cover - never called
        return None

    with pytest.raises(error, match=match):
        Informer(list_func, **kwargs)
