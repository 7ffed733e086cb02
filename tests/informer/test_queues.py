"""The informer feeding each of the four queues, and awaiting what it must.

Against the lab's API server on a real etcd (``etcd_server``), and a real
valkey-server: the session's for the plain runs, a private one
(``ValkeyServer``) where a test stops it (SIGSTOP: a server that does not
answer) or shuts it down and starts it again (connection refused, then back).
An informer that called ``queue.add(key)`` and dropped what it returned
would give an ``AsyncRedisWorkQueue`` no key at all, block the event loop on a
``RedisWorkQueue`` while its server is away and lose the key when the add
raises, and never run an ``async def`` handler; these tests rule each out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes_asyncio import client as k8s
from prometheus_client import CollectorRegistry

from keyqueue import AsyncWorkQueue, Empty, WorkQueue
from keyqueue._delivery import Deliveries, is_connection_error
from keyqueue.informer import Change, Informer
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.testing import FakeClock, ValkeyServer
from tests.support import etcd_server
from tests.support.etcd_server import ServerThread, api, api_server, etcd_url, namespace
from tests.support.valkey_server import name, valkey_url

__all__ = ["api_server", "etcd_url", "name", "namespace", "valkey_url"]  # fixtures

WAIT = 30.0  # generous bound on every wait for the informer or a queue to get somewhere
KINDS = ("WorkQueue", "AsyncWorkQueue", "RedisWorkQueue", "AsyncRedisWorkQueue")


async def until(condition: Callable[[], bool], what: str) -> None:
    await etcd_server.until(condition, what, WAIT)


def cm(name: str, **data: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data=data)


class Queue:
    """One of the four queues, seen the same way: ``keys()`` drains what waits."""

    def __init__(self, kind: str, name: str, url: str, **redis: Any) -> None:
        self.kind = kind
        self.queue: Any
        if kind == "WorkQueue":
            self.queue = WorkQueue[str](name)
        elif kind == "AsyncWorkQueue":
            self.queue = AsyncWorkQueue[str](name)
        elif kind == "RedisWorkQueue":
            self.queue = RedisWorkQueue(name, url=url, **redis)
        else:
            self.queue = AsyncRedisWorkQueue(name, url=url, **redis)

    async def keys(self) -> list[str]:
        """Every key waiting, in the order handed out (each done at once)."""
        keys = []
        while True:
            try:
                key = self.queue.get_nowait()
                if isinstance(key, Awaitable):
                    key = await key
            except Empty:
                return keys
            keys.append(key)
            done = self.queue.done(key)
            if isinstance(done, Awaitable):
                await done

    async def adds(self) -> int:
        stats = self.queue.stats()
        if isinstance(stats, Awaitable):
            stats = await stats
        return int(stats.adds)

    async def close(self) -> None:
        if self.kind == "AsyncRedisWorkQueue":
            await self.queue.aclose()
        elif self.kind == "RedisWorkQueue":
            self.queue.close()
        elif self.kind == "AsyncWorkQueue":
            await self.queue.shutdown()
        else:
            self.queue.shutdown()


@contextlib.asynccontextmanager
async def running(informer: Informer[Any]) -> AsyncIterator[asyncio.Task[None]]:
    """``informer.run()`` in a task, cancelled (and awaited) on every way out."""
    task = asyncio.create_task(informer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def private_valkey(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A valkey-server of the test's own, resumed (if stopped) and stopped on every exit."""
    with ValkeyServer(tmp_path) as server:
        try:
            yield server
        finally:
            if server.process is not None:
                server.process.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("kind", KINDS)
async def test_the_informer_feeds_each_of_the_four_queues(
    api_server: ServerThread, namespace: str, valkey_url: str, name: str, kind: str
) -> None:
    """The listed keys are in the queue once the informer is synced; each watch
    event's key follows; nothing is lost (before: an AsyncRedisWorkQueue got none)."""
    queue = Queue(kind, name, valkey_url)
    try:
        async with api(api_server.url) as client:
            v1 = k8s.CoreV1Api(client)
            for obj in ("a", "b"):
                await v1.create_namespaced_config_map(namespace, cm(obj))
            informer: Informer[k8s.V1ConfigMap] = Informer(
                v1.list_namespaced_config_map, namespace, queue=queue.queue
            )
            async with running(informer):
                await asyncio.wait_for(informer.wait_synced(), WAIT)
                # Keys may overtake each other in flight: compared as sets.
                assert sorted(await queue.keys()) == [f"{namespace}/a", f"{namespace}/b"]
                await until(lambda: informer.stats().watches == 1, "the watch")
                await v1.create_namespaced_config_map(namespace, cm("c"))
                await v1.patch_namespaced_config_map("a", namespace, {"data": {"v": "2"}})
                await v1.delete_namespaced_config_map("b", namespace)
                await until(lambda: informer.stats().events == 3, "three watch events")
                await until(lambda: informer.stats().in_flight == 0, "the adds to land")
                assert sorted(await queue.keys()) == [f"{namespace}/{k}" for k in "abc"]
                assert await queue.adds() == 5
    finally:
        await queue.close()


async def test_a_blocking_redis_add_leaves_the_event_loop_running(
    api_server: ServerThread, namespace: str, tmp_path: Path
) -> None:
    """A RedisWorkQueue's add waits on the network: with its server stopped (SIGSTOP)
    the informer still reads its watch and the loop still runs; the adds land
    once the server answers. Before, the add ran on the loop and froze it (for
    good with no socket timeout, as here; for 5 s, redis-py's default, and then
    the key was lost)."""
    with private_valkey(tmp_path) as server:
        assert server.process is not None
        connection = redis.Redis.from_url(server.url, socket_timeout=None)
        queue = RedisWorkQueue("blocking", client=connection)
        progressed = threading.Event()
        froze = threading.Event()

        def resume_later() -> None:
            # Resume the server once the loop has shown it runs, or after a
            # generous bound (an informer that blocks the loop never shows it).
            if not progressed.wait(WAIT / 2):
                froze.set()
            assert server.process is not None
            server.process.send_signal(signal.SIGCONT)

        try:
            async with api(api_server.url) as client:
                v1 = k8s.CoreV1Api(client)
                informer: Informer[k8s.V1ConfigMap] = Informer(
                    v1.list_namespaced_config_map, namespace, queue=queue
                )
                async with running(informer):
                    await asyncio.wait_for(informer.wait_synced(), WAIT)
                    await until(lambda: informer.stats().watches == 1, "the watch")
                    server.process.send_signal(signal.SIGSTOP)
                    resumer = threading.Thread(target=resume_later)
                    resumer.start()
                    try:
                        await v1.create_namespaced_config_map(namespace, cm("first"))
                        await v1.create_namespaced_config_map(namespace, cm("second"))
                        await until(lambda: informer.stats().events == 2, "both events")
                        progressed.set()
                    finally:
                        await asyncio.to_thread(resumer.join)
                    assert not froze.is_set(), "the event loop froze while the server was stopped"
                    await until(lambda: informer.stats().in_flight == 0, "the adds to land")
            assert sorted(key for key in iter(lambda: _take(queue), None)) == [
                f"{namespace}/first",
                f"{namespace}/second",
            ]
        finally:
            queue.close()
            connection.close()


def _take(queue: RedisWorkQueue) -> str | None:
    try:
        key = queue.get_nowait()
    except Empty:
        return None
    queue.done(key)
    return key


class CountingQueue(AsyncRedisWorkQueue):
    """An AsyncRedisWorkQueue that counts its adds in flight (and the most at once)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flying = self.most = 0
        self.landed: list[str] = []

    async def add(self, key: str, priority: int = 0) -> None:
        self.flying += 1
        self.most = max(self.most, self.flying)
        try:
            await super().add(key, priority)
            self.landed.append(key)
        finally:
            self.flying -= 1


async def test_a_server_that_does_not_answer_holds_back_the_watch_at_max_in_flight_adds(
    api_server: ServerThread, namespace: str, tmp_path: Path
) -> None:
    """Valkey stopped (SIGSTOP): the informer has ``max_in_flight`` adds waiting on it,
    reads one event more (the one that waits for room) and no further; resumed,
    every key lands, never more than the bound in flight."""
    bound, objects = 4, 20
    with private_valkey(tmp_path) as server:
        assert server.process is not None
        queue = CountingQueue("held", url=server.url)
        try:
            async with api(api_server.url) as client:
                v1 = k8s.CoreV1Api(client)
                informer: Informer[k8s.V1ConfigMap] = Informer(
                    v1.list_namespaced_config_map, namespace, queue=queue, max_in_flight=bound
                )
                async with running(informer):
                    await asyncio.wait_for(informer.wait_synced(), WAIT)
                    await until(lambda: informer.stats().watches == 1, "the watch")
                    server.process.send_signal(signal.SIGSTOP)
                    try:
                        for i in range(objects):
                            await v1.create_namespaced_config_map(namespace, cm(f"o{i:02d}"))
                        await until(lambda: queue.flying == bound, "the adds to fill the bound")
                        await asyncio.sleep(0.5)  # room for a runaway to show itself
                        stats = informer.stats()
                        assert (queue.flying, stats.in_flight, stats.events) == (
                            bound,
                            bound,
                            bound + 1,
                        )
                    finally:
                        server.process.send_signal(signal.SIGCONT)
                    await until(lambda: informer.stats().events == objects, "every event")
                    await until(lambda: informer.stats().in_flight == 0, "every add")
                    assert queue.most == bound
                    stats_after = await queue.stats()
                    assert stats_after.adds == objects
                    assert stats_after.depth == objects
        finally:
            await queue.aclose()


@pytest.mark.parametrize("kind", ["RedisWorkQueue", "AsyncRedisWorkQueue"])
async def test_an_add_refused_while_the_server_is_down_is_tried_again_until_it_lands(
    api_server: ServerThread, namespace: str, tmp_path: Path, kind: str
) -> None:
    """The queue's server shut down: the adds fail to connect and are tried again,
    with back-off, the key's later events behind them; the server started again
    (same port, empty), every key lands. Before, each such add was logged and lost.
    The queue's own asking again (``add_timeout``) is off, so what is tested is
    the informer's: what takes over once a queue's ``add_timeout`` ran out."""
    with private_valkey(tmp_path) as server:
        queue = Queue(kind, "refused", server.url, add_timeout=0)
        try:
            async with api(api_server.url) as client:
                v1 = k8s.CoreV1Api(client)
                seen: list[tuple[str, str]] = []
                informer: Informer[k8s.V1ConfigMap] = Informer(
                    v1.list_namespaced_config_map, namespace, queue=queue.queue
                )
                informer.add_handler(lambda c: seen.append((c.key, c.kind.value)))
                registry = CollectorRegistry()
                PrometheusMetrics(registry).add_informer(informer, "configmaps")
                async with running(informer):
                    await asyncio.wait_for(informer.wait_synced(), WAIT)
                    await until(lambda: informer.stats().watches == 1, "the watch")
                    server.stop()
                    await v1.create_namespaced_config_map(namespace, cm("x"))
                    await v1.create_namespaced_config_map(namespace, cm("y"))
                    await v1.patch_namespaced_config_map("x", namespace, {"data": {"v": "2"}})
                    await until(lambda: informer.stats().events == 3, "the three events")
                    assert seen == []  # each change's next handler waits behind its add
                    await until(lambda: informer.stats().handler_retries >= 3, "retries")
                    assert seen == []
                    # The stalled changes show on /metrics: two keys' chains in flight.
                    retried = registry.get_sample_value(
                        "reflector_handler_retries_total", {"name": "configmaps"}
                    )
                    assert retried is not None
                    assert retried >= 3
                    assert (
                        registry.get_sample_value(
                            "reflector_handler_in_flight", {"name": "configmaps"}
                        )
                        == 3
                    )  # x's ADDED, x's MODIFIED behind it, y's ADDED
                    server.start()
                    await until(lambda: informer.stats().in_flight == 0, "the adds to land")
            x, y = f"{namespace}/x", f"{namespace}/y"
            assert sorted(seen) == [(x, "ADDED"), (x, "MODIFIED"), (y, "ADDED")]
            assert [kind for key, kind in seen if key == x] == ["ADDED", "MODIFIED"]
            assert sorted(await queue.keys()) == [f"{namespace}/x", f"{namespace}/y"]
        finally:
            await queue.close()


class JumpClock(FakeClock):
    """A ``FakeClock`` whose ``sleep`` steps it: resync pauses take no wall time."""

    async def sleep(self, seconds: float) -> None:
        self.step(seconds)
        await asyncio.sleep(0)


async def test_resync_re_adds_every_key_to_an_async_redis_queue(
    api_server: ServerThread, namespace: str, valkey_url: str, name: str
) -> None:
    """The resync's changes go through the same awaited adds as the watch's."""
    queue = CountingQueue(name, url=valkey_url)
    keys = [f"{namespace}/r{i}" for i in range(5)]
    try:
        async with api(api_server.url) as client:
            v1 = k8s.CoreV1Api(client)
            for i in range(5):
                await v1.create_namespaced_config_map(namespace, cm(f"r{i}"))
            informer: Informer[k8s.V1ConfigMap] = Informer(
                v1.list_namespaced_config_map, namespace, queue=queue, resync=1.0, clock=JumpClock()
            )
            async with running(informer):
                await asyncio.wait_for(informer.wait_synced(), WAIT)
                await until(
                    lambda: all(queue.landed.count(k) >= 3 for k in keys),
                    "each key's add from the list and two resyncs",
                )
                assert informer.stats().resynced >= 10
        assert sorted(queue.landed[:5]) == keys  # synced: the list's adds landed first
    finally:
        await queue.aclose()


async def test_async_handlers_are_awaited_in_watch_order_per_key(
    api_server: ServerThread, namespace: str
) -> None:
    """Many events on three keys, an ``async def`` handler that takes a random time:
    each key's changes finish in the order the watch delivered them. Before, the
    handler's coroutine was never awaited."""
    rng = random.Random(26)
    arrived: list[tuple[str, str]] = []
    finished: list[tuple[str, str]] = []
    overlap = [0, 0]  # handlers running now, most at once

    async def slow(change: Change[k8s.V1ConfigMap]) -> None:
        overlap[0] += 1
        overlap[1] = max(overlap)
        await asyncio.sleep(rng.random() / 100)
        overlap[0] -= 1
        finished.append((change.key, change.resource_version))

    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(
            v1.list_namespaced_config_map, namespace, max_in_flight=8
        )
        informer.add_handler(lambda c: arrived.append((c.key, c.resource_version)))
        informer.add_handler(slow)
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), WAIT)
            await until(lambda: informer.stats().watches == 1, "the watch")
            names = ("p", "q", "r")
            for obj in names:
                await v1.create_namespaced_config_map(namespace, cm(obj, v="0"))
            writes = 3 + 3 * 10
            for i in range(1, 11):
                await asyncio.gather(
                    *(
                        v1.patch_namespaced_config_map(obj, namespace, {"data": {"v": str(i)}})
                        for obj in names
                    )
                )
            await until(lambda: len(finished) == writes, "every change handled")
    assert 1 < overlap[1] <= 8  # changes overlapped, within max_in_flight
    for obj in names:
        key = f"{namespace}/{obj}"
        order = [rv for k, rv in arrived if k == key]
        assert len(order) == 11
        assert [rv for k, rv in finished if k == key] == order
    assert finished != arrived  # keys overtook each other: the pipeline was in use


async def test_an_async_handler_that_raises_is_logged_and_the_next_handler_runs(
    api_server: ServerThread, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    async def broken(change: Change[Any]) -> None:
        await asyncio.sleep(0)
        raise RuntimeError("handler bug")

    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(v1.list_namespaced_config_map, namespace)
        informer.add_handler(broken)
        informer.add_handler(lambda c: calls.append(c.key))
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), WAIT)
            await v1.create_namespaced_config_map(namespace, cm("x"))
            await until(lambda: len(calls) == 1, "the second handler")
    assert calls == [f"{namespace}/x"]
    logged = [r for r in caplog.records if r.name == "keyqueue.informer"]
    assert [r.getMessage().rsplit(" ", 1)[1] for r in logged] == [f"{namespace}/x"]
    assert logged[0].exc_info is not None
    assert "handler bug" in str(logged[0].exc_info[1])


async def test_stopping_the_informer_says_how_many_changes_were_not_handled(
    api_server: ServerThread, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled with changes in flight (a handler that never finishes, one change
    waiting behind another of its key), the informer cancels them and logs
    how many: none goes without a word, no coroutine is left unawaited."""
    started: list[str] = []
    cancelled: list[str] = []

    async def stuck(change: Change[Any]) -> None:
        started.append(change.key)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(change.key)
            raise

    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(v1.list_namespaced_config_map, namespace)
        informer.add_handler(stuck)
        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), WAIT)
            await v1.create_namespaced_config_map(namespace, cm("x"))
            await v1.create_namespaced_config_map(namespace, cm("y"))
            await v1.patch_namespaced_config_map("x", namespace, {"data": {"v": "2"}})
            await until(lambda: informer.stats().in_flight == 3, "three changes in flight")
            await until(lambda: len(started) == 2, "the handler on x and y")
    assert sorted(cancelled) == sorted(started) == [f"{namespace}/x", f"{namespace}/y"]
    assert informer.stats().in_flight == 0
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "keyqueue.informer" and r.levelname == "WARNING"
    ]
    assert len(warnings) == 1
    assert warnings[0].startswith("informer stopped: 3 change(s) not handled by every handler")


async def test_a_delivery_cancelled_before_it_began_closes_what_the_handler_returned() -> None:
    """The handler was called (its coroutine made) but the task never ran: closing
    the deliveries closes that coroutine (no "never awaited") and counts it."""
    ran: list[str] = []

    async def handler(change: str) -> None:  # pragma: no cover - never runs
        ran.append(change)

    deliveries: Deliveries[str] = Deliveries([handler], 4, asyncio.sleep)
    assert deliveries.deliver("k", "k") is None  # in flight, not begun
    assert deliveries.in_flight == 1
    assert await deliveries.close() == 1
    assert (ran, deliveries.in_flight) == ([], 0)


async def test_processed_observers_get_each_change_s_time_in_line_and_in_flight() -> None:
    """A change handled in line reports when its last handler returns; one in
    flight when its delivery ends; one cancelled by close reports nothing."""
    clock = FakeClock()
    gate = asyncio.Event()
    seen: list[float] = []

    def plain(change: str) -> None:
        clock.step(0.25)

    async def gated(change: str) -> None:
        if change.startswith("slow"):
            await gate.wait()

    deliveries: Deliveries[str] = Deliveries([plain, gated], 4, asyncio.sleep, clock.now)
    stop = deliveries.observe_processed(seen.append)
    assert deliveries.deliver("a", "a") is None  # in flight: its coroutine runs on the loop
    await deliveries.join()
    await asyncio.sleep(0)
    assert seen == [0.25]
    assert deliveries.deliver("slow", "slow") is None
    await asyncio.sleep(0)
    assert seen == [0.25]  # "slow" waits at the gate
    clock.step(2)
    gate.set()
    await deliveries.join()
    await asyncio.sleep(0)
    assert seen == [0.25, 2.25]

    gate.clear()
    assert deliveries.deliver("slow2", "slow2") is None
    assert await deliveries.close() == 1
    await asyncio.sleep(0)
    assert seen == [0.25, 2.25]  # cancelled: not processed
    stop()
    assert deliveries.deliver("b", "b") is None
    await deliveries.join()
    assert seen == [0.25, 2.25]  # stopped: nothing more

    in_line: Deliveries[str] = Deliveries([plain], 4, asyncio.sleep, clock.now)
    in_line.observe_processed(seen.append)
    assert in_line.deliver("c", "c") is None
    assert seen == [0.25, 2.25, 0.25]  # reported before deliver returned


async def test_without_a_processed_observer_no_clock_is_read() -> None:
    def now() -> float:  # pragma: no cover - must not be called
        raise AssertionError("the clock was read with nobody observing")

    handled: list[str] = []
    deliveries: Deliveries[str] = Deliveries([handled.append], 4, asyncio.sleep, now)
    for key in ("a", "b", "a"):
        assert deliveries.deliver(key, key) is None
    assert handled == ["a", "b", "a"]


async def test_the_informer_s_metrics_under_client_go_s_informer_names(
    api_server: ServerThread, namespace: str
) -> None:
    """``informer_queued_items`` counts the changes in the handlers' pipeline,
    ``informer_processing_latency_seconds`` times each change to its last
    handler's end, ``informer_store_resource_version`` is the cache's version."""
    gate = asyncio.Event()

    async def gated(change: Change[k8s.V1ConfigMap]) -> None:
        await gate.wait()

    async with api(api_server.url) as client:
        v1 = k8s.CoreV1Api(client)
        informer: Informer[k8s.V1ConfigMap] = Informer(v1.list_namespaced_config_map, namespace)
        informer.add_handler(gated)
        registry = CollectorRegistry()
        PrometheusMetrics(registry).add_informer(informer, "configmaps")

        def value(metric: str) -> float | None:
            return registry.get_sample_value(metric, {"name": "configmaps"})

        async with running(informer):
            await asyncio.wait_for(informer.wait_synced(), WAIT)
            await until(lambda: informer.stats().watches == 1, "the watch")
            assert value("informer_queued_items") == 0
            for obj in ("a", "b"):
                await v1.create_namespaced_config_map(namespace, cm(obj))
            await until(lambda: informer.stats().in_flight == 2, "two changes in flight")
            assert value("informer_queued_items") == 2
            assert value("informer_processing_latency_seconds_count") == 0
            gate.set()
            await until(lambda: informer.stats().in_flight == 0, "the changes handled")
            await asyncio.sleep(0)
            assert value("informer_queued_items") == 0
            assert value("informer_processing_latency_seconds_count") == 2
            latency = value("informer_processing_latency_seconds_sum")
            assert latency is not None
            assert latency > 0
            rv = informer.stats().resource_version
            assert value("informer_store_resource_version") == float(rv)
            assert value("reflector_last_resource_version") == float(rv)


@pytest.mark.parametrize(
    ("error", "connection"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (TimeoutError(), True),
        (OSError(errno.ENETUNREACH, "unreachable"), True),
        (socket.gaierror(-2, "Name or service not known"), True),
        (redis.exceptions.ConnectionError("Error 111"), True),
        (redis.exceptions.TimeoutError("Timeout reading from socket"), True),
        (FileNotFoundError(errno.ENOENT, "no such file"), False),
        (PermissionError(errno.EACCES, "denied"), False),
        (redis.exceptions.ResponseError("WRONGTYPE"), False),
        (ValueError("bad"), False),
    ],
)
def test_which_errors_are_the_network_s(error: Exception, connection: bool) -> None:
    assert is_connection_error(error) is connection


# -- what the informer refuses --------------------------------------------------------


async def _never(**kwargs: Any) -> Any:  # pragma: no cover - never called
    return None


class NoArgAdd:
    def add(self) -> None:  # pragma: no cover - never called
        pass


@pytest.mark.parametrize(
    ("queue", "match"),
    [
        (object(), r"queue must have an add\(key\) method .* got object$"),
        ({"add": 1}, r"got dict$"),
        (NoArgAdd(), r"queue.add must take a key as its one argument, but it is NoArgAdd.add\(\)$"),
    ],
)
def test_a_queue_the_informer_cannot_drive_is_refused_at_construction(
    queue: Any, match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        Informer(_never, queue=queue)


@pytest.mark.parametrize("handler", [None, 42, "add"])
def test_a_handler_that_is_not_callable_is_refused(handler: Any) -> None:
    informer: Informer[Any] = Informer(_never)
    with pytest.raises(TypeError, match=r"^an informer handler must be callable, got "):
        informer.add_handler(handler)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_max_in_flight_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="max_in_flight"):
        Informer(_never, max_in_flight=bad)


# -- what mypy --strict says ----------------------------------------------------------

_TYPED = """
from typing import Any
from keyqueue import AsyncWorkQueue, WorkQueue
from keyqueue.informer import Change, Informer
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue

async def list_func(namespace: str) -> dict[str, Any]:
    return {}

async def on_change(change: Change[dict[str, Any]]) -> None:
    pass

def on_change_sync(change: Change[dict[str, Any]]) -> None:
    pass

def informers() -> None:
    a: Informer[dict[str, Any]] = Informer(list_func, "ns", queue=WorkQueue[str]("a"))
    b: Informer[dict[str, Any]] = Informer(list_func, "ns", queue=AsyncWorkQueue[str]("b"))
    c: Informer[dict[str, Any]] = Informer(list_func, "ns", queue=RedisWorkQueue("c", url="redis://"))
    d: Informer[dict[str, Any]] = Informer(
        list_func, "ns", queue=AsyncRedisWorkQueue("d", url="redis://")
    )
    a.add_handler(on_change)
    b.add_handler(on_change_sync)
    c.add_handler(lambda change: None)
"""

_MISTYPED = {
    "a queue of int keys": 'Informer(list_func, "ns", queue=WorkQueue[int]("a"))',
    "an object without add": 'Informer(list_func, "ns", queue=object())',
    "a handler returning a value": "informer.add_handler(lambda change: 1)",
    "a handler of another object type": "informer.add_handler(on_int_change)",
    "a handler that is not callable": "informer.add_handler(42)",
}
_MISTYPED_PRELUDE = """
from typing import Any
from keyqueue import WorkQueue
from keyqueue.informer import Change, Informer

async def list_func(namespace: str) -> dict[str, Any]:
    return {}

async def on_int_change(change: Change[int]) -> None:
    pass

informer: Informer[dict[str, Any]] = Informer(list_func, "ns")
"""


@pytest.mark.timeout(300)
def test_mypy_strict_takes_the_four_queues_and_async_handlers_and_flags_each_mismatch(
    tmp_path: Path,
) -> None:
    files = {"typed.py": _TYPED}
    for number, line in enumerate(_MISTYPED.values()):
        files[f"mistyped_{number}.py"] = _MISTYPED_PRELUDE + line + "\n"
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(root / ".mypy_cache" / "informer_types"),
            *files,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MYPYPATH": str(root / "src")},
    )
    errors: dict[str, list[str]] = {file: [] for file in files}
    for line in run.stdout.splitlines():
        file = line.split(":", 1)[0]
        if file in errors and ": error:" in line:
            errors[file].append(line)
    assert errors["typed.py"] == [], run.stdout
    for number, what in enumerate(_MISTYPED):
        assert errors[f"mistyped_{number}.py"], f"mypy did not flag {what}:\n{run.stdout}"
