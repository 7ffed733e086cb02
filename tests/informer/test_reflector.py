"""What client-go's reflector does, through keyqueue.informer, against the lab's API
server on a real etcd.

Paginated lists, bookmarks, streaming lists, resync, selectors, every namespace,
and the stats and Prometheus series that count them. Each test works in its own
namespace of the session's etcd (objects bulk-loaded straight into etcd when
there are thousands); waits are bounded (``WAIT``), and where something must
happen *between* two requests of the informer (a write between two pages, a
compaction before the next page) a wrapper around the list call does it there,
so no test depends on timing. The official ``kubernetes`` client's paginated
list and bookmarked watch are checked unchanged at the end.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from kubernetes import client as sync_k8s
from kubernetes import watch as sync_watch
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, generate_latest

from keyqueue.informer import Change, ChangeKind, Informer
from keyqueue.lab.pipeline.apiserver import PREFIX, ApiServer
from keyqueue.lab.pipeline.etcd import Etcd
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.testing import FakeClock
from tests.support import etcd_server
from tests.support.etcd_server import ServerThread, api, api_server, etcd_url, namespace

__all__ = ["api_server", "etcd_url", "namespace"]  # fixtures, imported for pytest

WAIT = 15.0  # generous bound on every wait for the informer or etcd to get somewhere


async def until(condition: Callable[[], bool], what: str) -> None:
    await etcd_server.until(condition, what, WAIT)


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name, labels=labels), data=data)


def stored(namespace: str, name: str, labels: dict[str, str] | None = None) -> bytes:
    """A ConfigMap as the API server keeps it in etcd (for loading thousands at once)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid4()),
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    if labels:
        meta["labels"] = labels
    obj = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": {"n": name}}
    return json.dumps(obj, separators=(",", ":")).encode()


async def load(etcd: Etcd, namespace: str, names: list[str]) -> int:
    """``names`` created in ``namespace`` straight in etcd; the revision after."""
    return await etcd.put_all(
        [(f"{PREFIX}{namespace}/{n}".encode(), stored(namespace, n)) for n in names]
    )


class Running:
    """An informer running in a task, with every change it emitted."""

    def __init__(self, informer: Informer[Any]) -> None:
        self.informer = informer
        self.changes: list[Change[Any]] = []
        informer.add_handler(self.changes.append)
        self.task = asyncio.create_task(informer.run())

    def seen(self, *kinds: ChangeKind) -> list[tuple[str, str]]:
        return [(c.kind.value, c.key) for c in self.changes if not kinds or c.kind in kinds]

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def calls(
    list_func: Callable[..., Awaitable[Any]],
    after: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> tuple[Any, list[dict[str, Any]]]:
    """``list_func`` recording each call's keyword arguments; ``after(kwargs)`` runs
    once a list call (not a watch) has answered, before the informer sees it."""
    made: list[dict[str, Any]] = []

    @functools.wraps(list_func)  # keeps the docstring Watch reads the return type from
    async def call(*args: Any, **kwargs: Any) -> Any:
        made.append(dict(kwargs))
        result = await list_func(*args, **kwargs)
        if after is not None and not kwargs.get("watch"):
            await after(kwargs)
        return result

    return call, made


def lists(made: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in kwargs.items() if k in ("limit", "_continue")}
        for kwargs in made
        if not kwargs.get("watch")
    ]


def watching(informer: Informer[Any]) -> bool:
    return informer.stats().watches >= 1


def saw(running: Running, n: int) -> bool:
    return len(running.changes) >= n


# -- 4. paginated lists ------------------------------------------------------------------


async def test_5000_objects_listed_100_a_page_are_one_snapshot_with_every_key_once(
    api_server: ServerThread, namespace: str
) -> None:
    """Writes between the pages (to objects already listed and not yet listed) do not
    show in the list: it is the first page's snapshot; the watch brings them after."""
    names = [f"cm-{i:04}" for i in range(5000)]
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await load(etcd, namespace, names)
        writes: list[str] = []

        async def write_between_pages(kwargs: dict[str, Any]) -> None:
            if writes:
                return
            writes.append("done")  # once, after the first page
            await v1.patch_namespaced_config_map("cm-0000", namespace, {"data": {"v": "2"}})
            await v1.patch_namespaced_config_map("cm-4999", namespace, {"data": {"v": "2"}})
            await v1.delete_namespaced_config_map("cm-2500", namespace)
            await v1.create_namespaced_config_map(namespace, cm("cm-new"))

        list_func, made = calls(v1.list_namespaced_config_map, write_between_pages)
        informer: Informer[k8s.V1ConfigMap] = Informer(list_func, namespace, page_size=100)
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        listed = running.seen()
        snapshot = int(informer.stats().resource_version)
        await until(lambda: len(running.changes) == 5004, "the writes' watch events")
        await running.stop()

    assert listed == [("ADDED", f"{namespace}/{n}") for n in names]  # each once, in order
    assert all(c.relisted and int(c.resource_version) <= snapshot for c in running.changes[:5000])
    assert running.seen()[5000:] == [
        ("MODIFIED", f"{namespace}/cm-0000"),
        ("MODIFIED", f"{namespace}/cm-4999"),
        ("DELETED", f"{namespace}/cm-2500"),
        ("ADDED", f"{namespace}/cm-new"),
    ]
    pages = lists(made)
    assert len(pages) == 50
    assert pages[0] == {"limit": 100}
    assert all(p["limit"] == 100 and p["_continue"] for p in pages[1:])
    stats = informer.stats()
    assert (stats.lists, stats.pages, stats.list_restarts, stats.cached) == (1, 50, 0, 5000)
    assert stats.last_sync_seconds > 0
    assert (stats.watch_list, stats.streamed_lists) == (None, 0)  # not asked for


async def test_an_expired_continue_token_restarts_the_list_from_the_beginning(
    api_server: ServerThread, namespace: str
) -> None:
    """Compacted between two pages: the next page is a 410 Expired, and the informer
    lists again from the start as one unpaginated list (client-go's pager)."""
    names = [f"cm-{i:02}" for i in range(10)]
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await load(etcd, namespace, names)
        compacted: list[int] = []

        async def compact_after_the_first_page(kwargs: dict[str, Any]) -> None:
            if not compacted:
                await load(etcd, f"{namespace}-other", ["elsewhere"])  # move the revision on
                compacted.append(await etcd.revision())
                await etcd.compact(compacted[0])

        list_func, made = calls(v1.list_namespaced_config_map, compact_after_the_first_page)
        informer: Informer[k8s.V1ConfigMap] = Informer(list_func, namespace, page_size=3)
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await running.stop()

    assert running.seen() == [("ADDED", f"{namespace}/{n}") for n in names]
    first = lists(made)
    assert first[:2] == [{"limit": 3}, {"limit": 3, "_continue": first[1]["_continue"]}]
    assert first[2:] == [{}]  # the restart: everything at once
    stats = informer.stats()
    assert (stats.lists, stats.pages, stats.list_restarts, stats.backoffs) == (1, 2, 1, 0)
    assert int(stats.resource_version) >= compacted[0]


async def test_the_server_pages_with_selectors_and_counts_what_remains(
    api_server: ServerThread, namespace: str
) -> None:
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        loaded = await etcd.put_all(
            [
                (
                    f"{PREFIX}{namespace}/cm-{i}".encode(),
                    stored(namespace, f"cm-{i}", {"odd": str(i % 2)}),
                )
                for i in range(9)
            ]
        )
        page = await v1.list_namespaced_config_map(namespace, limit=4)
        assert [i.metadata.name for i in page.items] == ["cm-0", "cm-1", "cm-2", "cm-3"]
        assert page.metadata.remaining_item_count == 5
        odd: list[str] = []
        token = None
        while True:
            page = await v1.list_namespaced_config_map(
                namespace, limit=2, label_selector="odd=1", _continue=token
            )
            odd += [i.metadata.name for i in page.items]
            assert page.metadata.remaining_item_count is None  # unknown with a selector
            token = page.metadata._continue
            if not token:
                break
        assert odd == ["cm-1", "cm-3", "cm-5", "cm-7"]
        with pytest.raises(ApiException) as bad:
            await v1.list_namespaced_config_map(namespace, limit=2, _continue="not-a-token")
        assert bad.value.status == 400
        future = str(await etcd.revision() + 1000)
        with pytest.raises(ApiException) as too_new:
            await v1.list_namespaced_config_map(
                namespace, resource_version=future, resource_version_match="Exact"
            )
        assert (too_new.value.status, json.loads(too_new.value.body)["reason"]) == (504, "Timeout")
        exact = await v1.list_namespaced_config_map(
            namespace, resource_version=str(loaded), resource_version_match="Exact"
        )
        assert exact.metadata.resource_version == str(loaded)
        assert len(exact.items) == 9


# -- 5. bookmarks --------------------------------------------------------------------------


async def test_an_idle_informer_resumes_from_a_bookmark_after_a_compaction_without_a_relist(
    api_server: ServerThread, namespace: str
) -> None:
    """Nothing happens in the informer's namespace; a burst of writes elsewhere; etcd
    compacts past the list's version; the informer's watch times out and reconnects.
    The BOOKMARK at the watch's end moved it past the burst, so no 410, no re-list."""
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await v1.create_namespaced_config_map(namespace, cm("quiet"))
        informer: Informer[k8s.V1ConfigMap] = Informer(
            v1.list_namespaced_config_map, namespace, watch_timeout=1
        )
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        listed = int(informer.stats().resource_version)
        burst = await load(etcd, f"{namespace}-busy", [f"b-{i}" for i in range(50)])
        await until(lambda: int(informer.stats().resource_version) >= burst, "a bookmark")
        await etcd.compact(burst)  # the list's version is gone now
        watches = informer.stats().watches
        await until(lambda: informer.stats().watches >= watches + 2, "a reconnect that lasted")
        await v1.create_namespaced_config_map(namespace, cm("after"))
        await until(lambda: len(running.changes) == 2, "the watch still delivering")
        await running.stop()

    assert listed < burst
    assert running.seen() == [("ADDED", f"{namespace}/quiet"), ("ADDED", f"{namespace}/after")]
    stats = informer.stats()
    assert (stats.lists, stats.expired, stats.errors, stats.relists) == (1, 0, 0, {})
    assert stats.bookmarks >= 1


async def test_a_long_watch_gets_bookmarks_every_interval(
    api_server: ServerThread, namespace: str
) -> None:
    """Bookmarks come every ``bookmark_interval`` too, not only at a watch's end."""
    async with Etcd(api_server.etcd_url) as etcd:
        server = ApiServer(etcd, bookmark_interval=0.05)
        url = await server.start()
        try:
            async with api(url) as client:
                v1 = k8s.CoreV1Api(client)
                informer: Informer[Any] = Informer(v1.list_namespaced_config_map, namespace)
                running = Running(informer)
                await asyncio.wait_for(informer.wait_synced(), WAIT)
                burst = await load(etcd, f"{namespace}-busy", ["a", "b", "c"])
                await until(
                    lambda: int(informer.stats().resource_version or 0) >= burst, "a bookmark"
                )
                await running.stop()
        finally:
            await server.close()
    stats = informer.stats()
    assert (stats.watches, stats.lists, stats.events) == (1, 1, stats.bookmarks)


# -- 6. streaming lists ----------------------------------------------------------------------


async def test_a_streaming_list_syncs_at_its_bookmark_and_goes_on_as_the_watch(
    api_server: ServerThread, namespace: str
) -> None:
    names = [f"cm-{i:02}" for i in range(30)]
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await load(etcd, namespace, names)
        list_func, made = calls(v1.list_namespaced_config_map)
        informer: Informer[k8s.V1ConfigMap] = Informer(list_func, namespace, watch_list=True)
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        synced = list(running.changes)
        await v1.create_namespaced_config_map(namespace, cm("later"))
        await until(lambda: len(running.changes) == 31, "the watch event")
        await running.stop()

    assert [(c.kind.value, c.key, c.relisted) for c in synced] == [
        ("ADDED", f"{namespace}/{n}", True) for n in names
    ]
    assert running.seen()[30] == ("ADDED", f"{namespace}/later")
    assert not running.changes[30].relisted
    assert len(made) == 1  # one request: the streaming list, then its watch
    assert made[0]["send_initial_events"] is True
    assert made[0]["resource_version_match"] == "NotOlderThan"
    assert made[0]["allow_watch_bookmarks"] is True
    stats = informer.stats()
    assert (stats.lists, stats.streamed_lists, stats.pages, stats.watches) == (1, 1, 0, 1)
    assert (stats.watch_list, stats.bookmarks, stats.events) == (True, 1, 32)


def refusing(list_func: Callable[..., Awaitable[Any]], made: list[dict[str, Any]], how: str) -> Any:
    """``list_func`` recording each call's keyword arguments in ``made``, answering a
    streaming list with a 400 (``how="400"``) or sending it without its two
    parameters, as to a server that ignores them (``"ignored"``)."""

    @functools.wraps(list_func)
    async def call(*args: Any, **kwargs: Any) -> Any:
        made.append(dict(kwargs))
        if kwargs.get("send_initial_events"):
            if how == "400":
                raise ApiException(status=400, reason="BadRequest")
            del kwargs["send_initial_events"], kwargs["resource_version_match"]
        return await list_func(*args, **kwargs)

    return call


@pytest.mark.parametrize("how", ["422", "400", "ignored"])
async def test_a_server_without_streaming_lists_is_listed_and_watched_instead(
    api_server: ServerThread, namespace: str, how: str
) -> None:
    """422 (the lab server with ``watch_list=False``, as a server without the
    feature answers), 400, or a stream that ends without the initial-events-end
    bookmark (a server that ignored the ask): the informer lists and watches,
    and never asks again."""
    async with Etcd(api_server.etcd_url) as etcd:
        await load(etcd, namespace, ["a", "b"])
        server = ApiServer(etcd, watch_list=False)
        url = await server.start()
        try:
            async with api(url) as client:
                v1 = k8s.CoreV1Api(client)
                if how == "422":
                    list_func, made = calls(v1.list_namespaced_config_map)
                else:
                    made = []
                    list_func = refusing(v1.list_namespaced_config_map, made, how)
                informer: Informer[Any] = Informer(
                    list_func, namespace, watch_list=True, watch_timeout=1
                )
                running = Running(informer)
                await asyncio.wait_for(informer.wait_synced(), WAIT)
                await until(lambda: informer.stats().watches == 2, "the watch")
                await running.stop()
        finally:
            await server.close()
    assert running.seen() == [("ADDED", f"{namespace}/a"), ("ADDED", f"{namespace}/b")]
    kinds = [
        "stream" if k.get("send_initial_events") else "watch" if k.get("watch") else "list"
        for k in made
    ]
    assert kinds == ["stream", "list", "watch"]
    stats = informer.stats()
    assert (stats.watch_list, stats.streamed_lists, stats.lists) == (False, 0, 1)
    assert (stats.backoffs, stats.errors) == (0, 0)


# -- 7. resync -------------------------------------------------------------------------------


class JumpClock(FakeClock):
    """A ``FakeClock`` whose ``sleep`` steps it: resync pauses take no wall time."""

    async def sleep(self, seconds: float) -> None:
        self.step(seconds)
        await asyncio.sleep(0)


async def test_resync_redelivers_every_cached_key_each_period_spread_over_it(
    api_server: ServerThread, namespace: str
) -> None:
    names = [f"cm-{i:02}" for i in range(25)]
    clock = JumpClock()
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await load(etcd, namespace, names)
        queue_keys: list[str] = []

        class Queue:
            def add(self, key: str) -> None:
                queue_keys.append(key)

        informer: Informer[Any] = Informer(
            v1.list_namespaced_config_map, namespace, resync=2.0, clock=clock, queue=Queue()
        )
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await until(lambda: len(running.seen(ChangeKind.RESYNC)) >= 50, "two resync periods")
        await running.stop()

    resyncs = [c for c in running.changes if c.kind is ChangeKind.RESYNC][:50]
    keys = [f"{namespace}/{n}" for n in names]
    for period in (resyncs[:25], resyncs[25:]):
        assert sorted(c.key for c in period) == keys  # every key once a period
        assert all(c.obj is c.old for c in period)
    # Spread: 2 s at 10 slices a second is 20 slices of 1 or 2 keys, 0.1 s apart.
    times = [round(c.received - resyncs[0].received, 6) for c in resyncs[:25]]
    assert sorted(set(times)) == [round(0.1 * i, 6) for i in range(20)]
    assert max(times.count(t) for t in times) == 2
    assert queue_keys[:25] == keys  # the list's adds, then the resyncs'
    assert sorted(queue_keys[25:75]) == sorted(keys * 2)
    assert informer.stats().resynced >= 50


async def test_no_resync_by_default(api_server: ServerThread, namespace: str) -> None:
    clock = JumpClock()
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        await v1.create_namespaced_config_map(namespace, cm("a"))
        informer: Informer[Any] = Informer(v1.list_namespaced_config_map, namespace, clock=clock)
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await until(lambda: informer.stats().watches == 1, "the watch")
        for _ in range(100):
            await asyncio.sleep(0)
        await running.stop()
    assert running.seen() == [("ADDED", f"{namespace}/a")]
    assert informer.stats().resynced == 0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"resync": 0}, ValueError),
        ({"resync": -1}, ValueError),
        ({"resync": "1"}, TypeError),
        ({"page_size": 0}, ValueError),
        ({"page_size": 1.5}, TypeError),
        ({"watch_list": 1}, TypeError),
        ({"label_selector": 1}, TypeError),
    ],
)
def test_bad_reflector_arguments_are_refused_naming_them(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    async def list_func(**kwargs: Any) -> Any:  # pragma: no cover - never called
        return None

    with pytest.raises(error, match=next(iter(kwargs))):
        Informer(list_func, **kwargs)


# -- 8. selectors and namespaces -----------------------------------------------------------


async def test_label_and_field_selectors_filter_the_list_and_the_watch(
    api_server: ServerThread, namespace: str
) -> None:
    """An object that starts matching arrives as ADDED, one that stops as DELETED."""
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        await v1.create_namespaced_config_map(namespace, cm("web-1", {"app": "web"}))
        await v1.create_namespaced_config_map(namespace, cm("db-1", {"app": "db"}))
        await v1.create_namespaced_config_map(namespace, cm("web-2", {"app": "web"}))
        labelled: Informer[Any] = Informer(
            v1.list_namespaced_config_map, namespace, label_selector="app=web"
        )
        named: Informer[Any] = Informer(
            v1.list_namespaced_config_map, namespace, field_selector="metadata.name!=web-1"
        )
        by_label, by_name = Running(labelled), Running(named)
        await asyncio.wait_for(labelled.wait_synced(), WAIT)
        await asyncio.wait_for(named.wait_synced(), WAIT)
        await until(lambda: labelled.stats().watches == named.stats().watches == 1, "the watches")
        await v1.patch_namespaced_config_map(
            "db-1", namespace, {"metadata": {"labels": {"app": "web"}}}
        )
        await v1.patch_namespaced_config_map(
            "web-2", namespace, {"metadata": {"labels": {"app": "db"}}}
        )
        await v1.create_namespaced_config_map(namespace, cm("db-2", {"app": "db"}))
        await v1.patch_namespaced_config_map("web-1", namespace, {"data": {"v": "2"}})
        await until(lambda: len(by_label.changes) == 5, "the label watch")
        await until(lambda: len(by_name.changes) == 5, "the name watch")
        await by_label.stop()
        await by_name.stop()

    ns = namespace
    assert by_label.seen() == [
        ("ADDED", f"{ns}/web-1"),
        ("ADDED", f"{ns}/web-2"),
        ("ADDED", f"{ns}/db-1"),  # now app=web
        ("DELETED", f"{ns}/web-2"),  # now app=db
        ("MODIFIED", f"{ns}/web-1"),
    ]
    assert labelled.keys() == [f"{ns}/db-1", f"{ns}/web-1"]
    assert by_name.seen() == [
        ("ADDED", f"{ns}/db-1"),
        ("ADDED", f"{ns}/web-2"),
        ("MODIFIED", f"{ns}/db-1"),
        ("MODIFIED", f"{ns}/web-2"),
        ("ADDED", f"{ns}/db-2"),
    ]


async def test_namespace_none_lists_and_watches_every_namespace(
    api_server: ServerThread, namespace: str
) -> None:
    mark = {"test": namespace}  # other tests' objects share the etcd: select ours
    first, second = f"{namespace}-a", f"{namespace}-b"
    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        await v1.create_namespaced_config_map(first, cm("x", mark))
        await v1.create_namespaced_config_map(second, cm("y", mark))
        informers: list[Informer[Any]] = [
            Informer(v1.list_namespaced_config_map, None, label_selector=f"test={namespace}"),
            Informer(
                v1.list_namespaced_config_map, namespace=None, label_selector=f"test={namespace}"
            ),
        ]
        running = [Running(i) for i in informers]
        for each in running:
            await asyncio.wait_for(each.informer.wait_synced(), WAIT)
            await until(functools.partial(watching, each.informer), "the watch")
        await v1.create_namespaced_config_map(f"{namespace}-c", cm("z", mark))
        for each in running:
            await until(functools.partial(saw, each, 3), "the third namespace's object")
            await each.stop()
    for each in running:
        assert each.seen() == [
            ("ADDED", f"{first}/x"),
            ("ADDED", f"{second}/y"),
            ("ADDED", f"{namespace}-c/z"),
        ]

    async def list_func(namespace: str, **kwargs: Any) -> Any:  # pragma: no cover - never called
        return None

    list_func.__name__ = "list_namespaced_thing"
    with pytest.raises(ValueError, match="list_thing_for_all_namespaces"):
        Informer(list_func, None)


# -- 10. stats and metrics -------------------------------------------------------------------


async def test_stats_count_relists_by_cause_and_prometheus_exports_them(
    api_server: ServerThread, namespace: str
) -> None:
    """A 410 forced for real (the watch held while etcd compacts past its version):
    one re-list, caused by "expired"; the reflector series say the same."""
    async with api(api_server.url) as client, Etcd(api_server.etcd_url) as etcd:
        v1 = k8s.CoreV1Api(client)
        await load(etcd, namespace, ["a", "b", "c"])
        gate = asyncio.Event()

        @functools.wraps(v1.list_namespaced_config_map)
        async def gated(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("watch"):
                await gate.wait()
            return await v1.list_namespaced_config_map(*args, **kwargs)

        informer: Informer[Any] = Informer(gated, namespace, page_size=2)
        registry = CollectorRegistry()
        PrometheusMetrics(registry).add_informer(informer, "configmaps")
        running = Running(informer)
        await asyncio.wait_for(informer.wait_synced(), WAIT)
        await v1.create_namespaced_config_map(namespace, cm("d"))
        await v1.patch_namespaced_config_map("d", namespace, {"data": {"v": "2"}})
        await etcd.compact(await etcd.revision())  # past the version the watch asks for
        gate.set()
        await until(lambda: informer.stats().lists == 2, "the re-list")
        await until(lambda: informer.stats().watches == 2, "the second watch")
        await running.stop()

    stats = informer.stats()
    assert (stats.lists, stats.pages, stats.watches, stats.expired) == (2, 4, 2, 1)
    assert stats.relists == {"expired": 1}
    assert stats.cached == 4
    text = generate_latest(registry).decode()
    series = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("reflector_")
    }
    assert series['reflector_lists_total{name="configmaps"}'] == 2
    assert series['reflector_list_pages_total{name="configmaps"}'] == 4
    assert series['reflector_watches_total{name="configmaps"}'] == 2
    assert series['reflector_relists_total{name="configmaps",reason="expired"}'] == 1
    assert series['reflector_cached_objects{name="configmaps"}'] == 4
    assert series['reflector_last_resource_version{name="configmaps"}'] == float(
        stats.resource_version
    )


# -- the official client, unchanged ------------------------------------------------------------


def test_the_official_client_lists_with_limit_and_watches_with_bookmarks(
    api_server: ServerThread, namespace: str
) -> None:
    config = sync_k8s.Configuration()
    config.host = api_server.url
    with sync_k8s.ApiClient(config) as client:
        v1 = sync_k8s.CoreV1Api(client)
        for i in range(5):
            v1.create_namespaced_config_map(
                namespace, sync_k8s.V1ConfigMap(metadata=sync_k8s.V1ObjectMeta(name=f"cm-{i}"))
            )
        names, token, rv = [], None, None
        while True:
            page = v1.list_namespaced_config_map(namespace, limit=2, _continue=token)
            names += [i.metadata.name for i in page.items]
            rv = rv or page.metadata.resource_version
            assert page.metadata.resource_version == rv  # one snapshot
            token = page.metadata._continue
            if not token:
                break
        assert names == [f"cm-{i}" for i in range(5)]
        elsewhere = v1.create_namespaced_config_map(
            f"{namespace}-other", sync_k8s.V1ConfigMap(metadata=sync_k8s.V1ObjectMeta(name="x"))
        )
        events = list(
            sync_watch.Watch().stream(
                v1.list_namespaced_config_map,
                namespace,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=1,
            )
        )
    assert [e["type"] for e in events] == ["BOOKMARK"]
    bookmark = events[0]["raw_object"]
    assert list(bookmark["metadata"]) == ["resourceVersion"]  # only that, as the API says
    assert int(bookmark["metadata"]["resourceVersion"]) >= int(elsewhere.metadata.resource_version)
